package aggregator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tollgate/tollgate/aggregator/internal/consume"
	"github.com/tollgate/tollgate/guard/apierror"
	"github.com/tollgate/tollgate/internal/fleetkv"
	"github.com/tollgate/tollgate/internal/promdef"
)

// Statuses of a dependency in /readyz.
const (
	depConnecting   = "connecting"   // not answered yet since the start
	depConnected    = "connected"    // the last probe succeeded
	depDisconnected = "disconnected" // the last probe failed
)

// Probing: every probeEvery, each bounded by probeTimeout, so that
// /readyz, which only reads their results, answers at once whatever the
// dependencies do, and a change shows within about two seconds.
const (
	probeEvery   = time.Second
	probeTimeout = time.Second
)

// dependency is what the probes last learnt of Kafka, NATS or Redis.
type dependency struct {
	name string
	log  *slog.Logger

	mu     sync.Mutex
	status string
	since  time.Time
	err    string
}

func newDependency(name string, log *slog.Logger, now time.Time) *dependency {
	return &dependency{name: name, log: log, status: depConnecting, since: now}
}

// set records a probe's result; since moves only when the status changes,
// which is logged once.
func (d *dependency) set(err error, now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	status := depConnected
	d.err = ""
	if err != nil {
		status, d.err = depDisconnected, err.Error()
	}
	if d.status == status {
		return
	}
	switch {
	case status == depDisconnected:
		d.log.Warn(d.name+" unreachable", slog.String("dependency", d.name), slog.String("error", d.err))
	case d.status == depDisconnected:
		d.log.Info(d.name+" reachable again", slog.String("dependency", d.name),
			slog.Duration("outage", now.Sub(d.since).Round(time.Millisecond)))
	}
	d.status, d.since = status, now
}

// connecting records a connection not made yet (NATS opens its buckets
// in the background): a dependency that never connected stays
// connecting, one that did is disconnected.
func (d *dependency) connecting(err error) {
	d.mu.Lock()
	if d.status == depConnecting {
		d.err = err.Error()
		d.mu.Unlock()
		return
	}
	d.mu.Unlock()
	d.set(err, time.Now())
}

// dep is a dependency's object in /readyz.
type dep struct {
	// Status is connecting (no answer yet since the start), connected
	// or disconnected.
	Status string    `json:"status"`
	Since  time.Time `json:"since"`
	Error  string    `json:"error,omitempty"`
}

func (d *dependency) get() dep {
	d.mu.Lock()
	defer d.mu.Unlock()
	return dep{Status: d.status, Since: d.since.UTC(), Error: d.err}
}

// deps are the dependencies the aggregator watches.
type deps struct {
	kafka, nats, redis *dependency
}

// readiness is the /readyz body.
type readiness struct {
	// Status is ready (200), not_ready (503: the instance cannot count
	// decisions now) or draining (503: shutting down).
	Status string `json:"status"`
	// Reason says what keeps it from counting (absent when ready).
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// Since is when the reason began (when ready: when the last part
	// became ready).
	Since time.Time `json:"since"`
	Kafka dep       `json:"kafka"`
	// State is the materialized changelog: restoring, then restored.
	State struct {
		Status string    `json:"status"`
		Since  time.Time `json:"since"`
	} `json:"state"`
	Processing processing `json:"processing"`
	// NATS is present with nats.url: penalties and the operator API's
	// control plane need it, counting does not.
	NATS *dep `json:"nats,omitempty"`
	// Redis serves the operator API's keys routes only.
	Redis dep `json:"redis"`
	// Warning is set while the operator API runs without a token
	// (admin_insecure): it does not fail readiness, but says so loudly.
	Warning string `json:"warning,omitempty"`
}

// processing is /readyz's processing object.
type processing struct {
	// Status is the processor's stage: starting, checking_id, running,
	// rebuilding, fenced or stopped.
	Status     string     `json:"status"`
	Since      time.Time  `json:"since"`
	Error      string     `json:"error,omitempty"`
	Partitions []int32    `json:"partitions"`
	LastCommit *time.Time `json:"last_commit,omitempty"`
}

// Reasons of /readyz besides the processor's (consume.Reason*).
const (
	reasonKafka    = "kafka_unreachable"
	reasonDraining = "draining"
)

// readiness computes the /readyz body; ok is the status code's verdict.
func (s *Server) readiness(now time.Time) (r readiness, ok bool) {
	h := s.proc.Health()
	r.Kafka = s.deps.kafka.get()
	r.Redis = s.deps.redis.get()
	if s.cfg.NATS.URL != "" {
		n := s.deps.nats.get()
		r.NATS = &n
	}
	r.State.Status, r.State.Since = "restoring", h.RestoredSince.UTC()
	if h.Restored {
		r.State.Status = "restored"
	}
	r.Processing = processing{Status: h.Stage, Since: h.StageSince.UTC(), Error: h.Error, Partitions: h.Partitions}
	if r.Processing.Partitions == nil {
		r.Processing.Partitions = []int32{}
	}
	if !h.LastCommit.IsZero() {
		t := h.LastCommit.UTC()
		r.Processing.LastCommit = &t
	}
	r.Warning = strings.TrimSuffix(s.insecureWarning(), "\n")
	reason, msg, since := h.Problem(now)
	switch {
	case s.draining.Load():
		reason, msg, since = reasonDraining, "shutting down", s.drainingSince()
	case r.Kafka.Status == depDisconnected && reason != consume.ReasonFenced:
		reason, msg, since = reasonKafka, "Kafka has not answered since "+r.Kafka.Since.Format(time.RFC3339)+": "+r.Kafka.Error, r.Kafka.Since
	}
	if reason == "" {
		r.Status = "ready"
		r.Since = latest(r.Kafka.Since, r.State.Since, r.Processing.Since, h.TxnErrorSince)
		return r, true
	}
	r.Status, r.Reason, r.Message, r.Since = "not_ready", reason, msg, since.UTC()
	if reason == reasonDraining {
		r.Status = "draining"
	}
	return r, false
}

func latest(ts ...time.Time) time.Time {
	var out time.Time
	for _, t := range ts {
		if t.After(out) {
			out = t
		}
	}
	return out.UTC()
}

// readyz answers 200 while the instance can count decisions: Kafka
// answers, the state is restored, its transactions commit, and pending
// work does not wait. Otherwise 503 with the reason. It reads what the
// probes and the processor recorded, so it never waits on a dependency.
func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	body, ok := s.readiness(time.Now())
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(&body)
}

func healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("ok\n"))
}

// readyGauge exports readiness as a metric (1 ready, 0 not).
func (s *Server) readyGauge() prometheus.Collector {
	return promdef.GaugeFunc("tollgate_aggregator_ready", "1 while /readyz answers 200 (the instance can count decisions), else 0; /readyz's body says why.", func() float64 {
		if _, ok := s.readiness(time.Now()); ok {
			return 1
		}
		return 0
	})
}

// probeKafka asks Kafka for its brokers every probeEvery until ctx is
// done: a metadata request for no topic, sent every time (the client's
// cached metadata would hide an outage).
func (s *Server) probeKafka(ctx context.Context) error {
	return probe(ctx, s.deps.kafka, func(ctx context.Context) error {
		req := kmsg.NewPtrMetadataRequest()
		req.Topics = []kmsg.MetadataRequestTopic{}
		_, err := req.RequestWith(ctx, s.kafka)
		return err
	})
}

// probeRedis pings Redis every probeEvery until ctx is done.
func (s *Server) probeRedis(ctx context.Context) error {
	return probe(ctx, s.deps.redis, func(ctx context.Context) error { return s.redis.Ping(ctx).Err() })
}

// probeNATS reads the NATS connection's state every probeEvery until ctx
// is done (the client reconnects by itself; nothing is sent).
func (s *Server) probeNATS(ctx context.Context) error {
	return probe(ctx, s.deps.nats, func(context.Context) error {
		nc := s.nc.Load()
		switch {
		case nc == nil:
			return errNATSConnecting
		case !nc.IsConnected():
			if err := nc.LastError(); err != nil {
				return fmt.Errorf("not connected (%s): %w", nc.Status(), err)
			}
			return fmt.Errorf("not connected (%s)", nc.Status())
		case s.kv.Load() == nil:
			return errNATSConnecting
		}
		return nil
	})
}

// errNATSConnecting: the NATS connection or its KV buckets are not open
// yet.
var errNATSConnecting = errors.New("not connected yet: JetStream and the KV buckets are not open")

// probe runs check every probeEvery, bounded by probeTimeout, recording
// its result in d. errNATSConnecting leaves a dependency that never
// connected connecting.
func probe(ctx context.Context, d *dependency, check func(context.Context) error) error {
	t := time.NewTicker(probeEvery)
	defer t.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, probeTimeout)
		err := check(cctx)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, errNATSConnecting) {
			d.connecting(err)
		} else {
			d.set(err, time.Now())
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// natsKV returns the KV buckets for the operator API while NATS is
// connected, and nil otherwise, so that a route needing NATS answers 503
// NATS_UNAVAILABLE at once instead of waiting for a reconnect.
func (s *Server) natsKV() *fleetkv.KV {
	kv := s.kv.Load()
	if kv == nil {
		return nil
	}
	if nc := s.nc.Load(); nc == nil || !nc.IsConnected() {
		return nil
	}
	return kv
}

// gate answers at once, 503 with a JSON error naming the reason, the
// requests this instance cannot serve now, instead of letting them wait
// on Kafka or read a state still being restored:
//
//   - reads of the materialized state (usage reports, the audit log,
//     penalties) before the state is restored: STATE_RESTORING;
//   - changes (every one is audited through Kafka), while Kafka does not
//     answer: KAFKA_UNAVAILABLE, and nothing is changed;
//   - the control plane's routes before Kafka has first answered (NATS is
//     opened then, its seeding being audited): KAFKA_UNAVAILABLE.
func (s *Server) gate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path := r.URL.Path
		readsState := strings.HasPrefix(path, "/v1/usage/") || path == "/admin/v1/audit" ||
			strings.HasPrefix(path, "/admin/v1/penalties/")
		change := strings.HasPrefix(path, "/admin/v1/") && r.Method != http.MethodGet && r.Method != http.MethodHead &&
			path != "/admin/v1/rules/validate"
		controlPlane := s.cfg.NATS.URL != "" && path != "/admin/v1/rules/validate" &&
			(strings.HasPrefix(path, "/admin/v1/rules") || strings.HasPrefix(path, "/admin/v1/blocklist/") ||
				strings.HasPrefix(path, "/admin/v1/allowlist/") || strings.HasPrefix(path, "/admin/v1/overrides/"))
		if readsState && !s.proc.Ready() {
			h := s.proc.Health()
			msg := "the state is being restored from the changelog (since " + h.RestoredSince.UTC().Format(time.RFC3339) +
				"); answers would be incomplete"
			if k := s.deps.kafka.get(); k.Status == depDisconnected {
				msg += "; Kafka has not answered since " + k.Since.Format(time.RFC3339) + ": " + k.Error
			}
			unavailable(w, apierror.StateRestoring, msg)
			return
		}
		if controlPlane && !s.setUp.Load() {
			if k := s.deps.kafka.get(); k.Status == depDisconnected {
				unavailable(w, apierror.KafkaUnavailable, "the control plane opens once Kafka answers (its changes are audited "+
					"through it); Kafka has not answered since "+k.Since.Format(time.RFC3339)+": "+k.Error)
				return
			}
		}
		if change {
			if k := s.deps.kafka.get(); k.Status == depDisconnected {
				unavailable(w, apierror.KafkaUnavailable, "Kafka has not answered since "+k.Since.Format(time.RFC3339)+
					" and every change is audited through it; nothing was changed: "+k.Error)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// unavailable answers 503 with Retry-After: 1.
func unavailable(w http.ResponseWriter, code, msg string) {
	w.Header().Set("Retry-After", "1")
	apierror.Write(w, http.StatusServiceUnavailable, code, msg)
}
