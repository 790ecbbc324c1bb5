package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tollgate/tollgate/internal/service"
)

func (s *Server) registerProcessMetrics() {
	s.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
}

// metricsHandler serves GET /metrics (this server's registry, not the
// process-global one), /healthz and /readyz.
func (s *Server) metricsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{
		ErrorHandling:     promhttp.ContinueOnError,
		EnableOpenMetrics: true,
	}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", s.readyz)
	if s.cfg.Pprof {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// Names of the dependencies in /readyz's missing list.
const (
	depRedis = "redis"
	depNATS  = "nats"
	depKafka = "kafka"
)

// How often the gateway checks its dependencies for /readyz, off the
// request path: /readyz reads the last result and never waits on Redis,
// NATS or Kafka. A NATS client call can wait for a reconnection's dial
// and handshake (seconds, to a host that does not answer), and a Redis
// PING for redis.timeout: each has its own monitor, so neither delays
// /readyz nor the other. The Redis monitor pings only when the gateway's
// own calls since its last check do not show Redis answering
// (redisMonitor.check).
const (
	redisHealthInterval = 500 * time.Millisecond
	natsHealthInterval  = 100 * time.Millisecond
)

// minPingTimeout bounds the health monitor's Redis PING from below.
const minPingTimeout = 100 * time.Millisecond

// depState is one dependency's state as its monitor last saw it.
type depState struct {
	up    bool
	since time.Time // when it was first seen in this state
	err   string
}

// natsState is the NATS monitor's view: the connection and the Syncer's
// progress.
type natsState struct {
	depState
	synced      bool
	lastApplied time.Time
}

// next returns the state after seeing up (with err) at now: since moves
// only when up changes.
func (d *depState) next(up bool, err string, now time.Time) depState {
	if d != nil && d.up == up {
		return depState{up: up, since: d.since, err: err}
	}
	return depState{up: up, since: now, err: err}
}

// checkRedis pings Redis within timeout and stores what it saw. It reports
// false when ctx ended meanwhile (nothing stored).
func (s *Server) checkRedis(ctx context.Context, timeout time.Duration) bool {
	pctx, cancel := context.WithTimeout(ctx, timeout)
	err := s.client.Ping(pctx).Err()
	cancel()
	if ctx.Err() != nil {
		return false
	}
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	s.setRedisHealth(err == nil, msg)
	return true
}

func (s *Server) setRedisHealth(up bool, msg string) {
	st := s.redisHealth.Load().next(up, msg, time.Now())
	s.redisHealth.Store(&st)
}

// redisMonitor is the Redis health monitor's state, owned by its
// goroutine: the store's call outcomes at its last check.
type redisMonitor struct {
	answered, failed uint64
}

// passive reports whether the calls the gateway made since the last
// check show Redis answering — some were answered and none failed — and
// notes the outcomes for the next check. A deciding gateway then knows
// Redis is up without a PING of its own; an idle one, one whose calls
// fail, or one whose calls all wait behind an open breaker pings.
func (m *redisMonitor) passive(answered, failed uint64) bool {
	ok := answered > m.answered && failed == m.failed
	m.answered, m.failed = answered, failed
	return ok
}

// check stores Redis's state: up without a PING when the gateway's own
// calls since the last check show it answering, else what a PING within
// timeout says.
func (m *redisMonitor) check(ctx context.Context, s *Server, timeout time.Duration) {
	if m.passive(s.store.Outcomes()) {
		s.setRedisHealth(true, "")
		return
	}
	s.checkRedis(ctx, timeout)
}

// checkNATS stores the NATS connection's state (fleet mode).
func (s *Server) checkNATS() {
	st := s.sync.Status()
	var prev *depState
	if p := s.natsHealth.Load(); p != nil {
		prev = &p.depState
	}
	s.natsHealth.Store(&natsState{depState: prev.next(st.Connected, "", time.Now()), synced: st.Synced, lastApplied: st.LastApplied})
}

// startHealth checks Redis once, waiting at most minPingTimeout (a Redis
// that has not answered by then counts as down until the monitor's next
// check), and starts the monitors in g, so that /readyz has a state from
// the first request on. The monitor pings within redis.timeout (at least
// minPingTimeout), as a decision's call waits.
func (s *Server) startHealth(ctx context.Context, g *service.Group) {
	s.checkRedis(ctx, minPingTimeout)
	g.Go(func() error {
		timeout := max(s.cfg.Redis.Timeout, minPingTimeout)
		var m redisMonitor
		m.passive(s.store.Outcomes())
		service.Every(ctx, redisHealthInterval, func(time.Time) { m.check(ctx, s, timeout) })
		return nil
	})
	if s.sync != nil {
		// The first check may wait for NATS's first dial: in the monitor.
		g.Go(func() error {
			s.checkNATS()
			service.Every(ctx, natsHealthInterval, func(time.Time) { s.checkNATS() })
			return nil
		})
	}
}

// readiness is the /readyz body.
type readiness struct {
	// Status is ready, draining (shutting down: 503) or no_rules (503).
	Status string `json:"status"`
	Rules  struct {
		// Source is where the rules in force came from: file
		// (rules_file), nats (the tollgate_rules KV bucket) or lkg (the
		// last-known-good copy on disk, while NATS has not answered).
		Source  string `json:"source"`
		Version int64  `json:"version"`
		Hash    string `json:"hash"`
		Rules   int    `json:"rules"`
	} `json:"rules"`
	Redis struct {
		// Status is ok, or degraded while Redis does not answer (the
		// gateway then fails open: still ready).
		Status string     `json:"status"`
		Error  string     `json:"error,omitempty"`
		Since  *time.Time `json:"since,omitempty"` // degraded since
	} `json:"redis"`
	// NATS is the control plane's state, in fleet mode only. A gateway
	// without NATS keeps its rules and stays ready.
	NATS *natsReadiness `json:"nats,omitempty"`
	// Kafka is the decision event producer's view of Kafka, with
	// kafka.brokers only. A gateway without Kafka spools its events and
	// stays ready.
	Kafka *kafkaReadiness `json:"kafka,omitempty"`
	// Missing names the dependencies that do not answer now: redis,
	// nats, kafka. None of them fails the probe.
	Missing []string `json:"missing,omitempty"`
}

// natsReadiness is /readyz's nats object.
type natsReadiness struct {
	// Status is connected or disconnected.
	Status string `json:"status"`
	// Since is when the connection was lost (disconnected only).
	Since *time.Time `json:"since,omitempty"`
	// Synced: the buckets have been read whole since the start.
	Synced bool `json:"synced"`
	// LastChange is when a change from NATS was last applied.
	LastChange *time.Time `json:"last_change,omitempty"`
}

// kafkaReadiness is /readyz's kafka object.
type kafkaReadiness struct {
	// Status is ok while Kafka acknowledges the decision events, down
	// after a failed send or while events wait unanswered (they go to the
	// spool). An idle gateway sends nothing, so it learns of an outage
	// with its next decisions.
	Status string     `json:"status"`
	Since  *time.Time `json:"since,omitempty"` // down since
	Error  string     `json:"error,omitempty"`
}

// readyz answers 200 once rules are loaded, reporting an outage of Redis,
// NATS or Kafka in the body without failing: the gateway keeps deciding
// (failing open without Redis), and an outage of a shared service must
// never take every gateway out of rotation. It answers 503 while draining
// at shutdown. It reads only what the health monitor and the rules left in
// memory: it never waits on a dependency.
func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	var body readiness
	status := http.StatusOK
	body.Status = "ready"
	if rs := s.ruleState.Load(); rs != nil {
		body.Rules.Source = rs.source
		body.Rules.Version, body.Rules.Hash, body.Rules.Rules = rs.Rules.Version(), rs.Rules.Hash(), len(rs.Rules.Rules())
	} else {
		body.Status, status = "no_rules", http.StatusServiceUnavailable
	}
	since := func(d depState) *time.Time {
		t := d.since.UTC()
		return &t
	}
	body.Redis.Status = "ok"
	if r := s.redisHealth.Load(); r != nil && !r.up {
		body.Redis.Status, body.Redis.Error, body.Redis.Since = "degraded", r.err, since(*r)
		body.Missing = append(body.Missing, depRedis)
	}
	if s.sync != nil {
		// Until the monitor's first look, which may wait for NATS's first
		// dial: disconnected since the start.
		n := s.natsHealth.Load()
		if n == nil {
			n = &natsState{depState: depState{since: s.started}}
		}
		body.NATS = &natsReadiness{Status: "connected", Synced: n.synced}
		if !n.up {
			body.NATS.Status, body.NATS.Since = "disconnected", since(n.depState)
			body.Missing = append(body.Missing, depNATS)
		}
		if !n.lastApplied.IsZero() {
			t := n.lastApplied.UTC()
			body.NATS.LastChange = &t
		}
	}
	if s.events != nil {
		up, at, err := s.events.KafkaState()
		body.Kafka = &kafkaReadiness{Status: "ok"}
		if !up {
			body.Kafka.Status, body.Kafka.Since = "down", since(depState{since: at})
			if err != nil {
				body.Kafka.Error = err.Error()
			}
			body.Missing = append(body.Missing, depKafka)
		}
	}
	if s.draining.Load() {
		body.Status, status = "draining", http.StatusServiceUnavailable
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(&body)
}
