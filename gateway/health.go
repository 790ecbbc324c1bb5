package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
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
		Status string `json:"status"`
		Error  string `json:"error,omitempty"`
	} `json:"redis"`
	// NATS is the control plane's state, in fleet mode only. A gateway
	// without NATS keeps its rules and stays ready.
	NATS *natsReadiness `json:"nats,omitempty"`
}

// natsReadiness is /readyz's nats object.
type natsReadiness struct {
	// Status is connected or disconnected.
	Status string `json:"status"`
	// Synced: the buckets have been read whole since the start.
	Synced bool `json:"synced"`
	// LastChange is when a change from NATS was last applied.
	LastChange *time.Time `json:"last_change,omitempty"`
}

// readyz answers 200 once rules are loaded, reporting a Redis outage in
// the body without failing: a Redis outage must never take every gateway
// out of rotation. It answers 503 while draining at shutdown.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	var body readiness
	status := http.StatusOK
	body.Status = "ready"
	if rs := s.ruleState.Load(); rs != nil {
		body.Rules.Source = rs.source
		body.Rules.Version, body.Rules.Hash, body.Rules.Rules = rs.Rules.Version(), rs.Rules.Hash(), len(rs.Rules.Rules())
	} else {
		body.Status, status = "no_rules", http.StatusServiceUnavailable
	}
	if s.sync != nil {
		st := s.sync.Status()
		body.NATS = &natsReadiness{Status: "disconnected", Synced: st.Synced}
		if st.Connected {
			body.NATS.Status = "connected"
		}
		if !st.LastApplied.IsZero() {
			t := st.LastApplied.UTC()
			body.NATS.LastChange = &t
		}
	}
	if s.draining.Load() {
		body.Status, status = "draining", http.StatusServiceUnavailable
	}
	ctx, cancel := context.WithTimeout(r.Context(), max(s.cfg.Redis.Timeout, minPingTimeout))
	defer cancel()
	body.Redis.Status = "ok"
	if err := s.client.Ping(ctx).Err(); err != nil {
		body.Redis.Status, body.Redis.Error = "degraded", err.Error()
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(&body)
}
