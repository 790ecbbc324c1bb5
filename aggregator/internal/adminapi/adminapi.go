// Package adminapi is the aggregator's operator API under /admin/v1/
// (docs/aggregator.md): rules, blocklist, allowlist, overrides, keys, penalties and
// the audit log. Every route needs the operator token (the aggregator
// wraps the listener); errors are JSON {"error":{"code","message"}}, with
// the codes and statuses of package apierror's table.
package adminapi

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/tollgate/tollgate/aggregator/internal/audit"
	"github.com/tollgate/tollgate/guard/apierror"
	"github.com/tollgate/tollgate/guard/keyid"
	"github.com/tollgate/tollgate/internal/fleetkv"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// Config configures the API.
type Config struct {
	Audit  *audit.Store
	Hasher *keyid.Hasher
	// KV returns the fleet configuration in NATS; nil without NATS or
	// before it is reached (the control-plane routes then answer 503).
	KV func() *fleetkv.KV
	// Auditor appends the audit entry of every change.
	Auditor Auditor
	// Guard serves keys/{key} (nil: those routes answer 503).
	Guard GuardFunc
	// Penalties reads keys' penalty state and Commands sends lifts to the
	// partitions' owners (penalties/{key}); nil: those routes answer 503.
	Penalties Penalties
	Commands  Commander
	Log       *slog.Logger
}

// Register adds the routes to mux.
func Register(mux *http.ServeMux, cfg Config) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	a := &api{cfg: cfg, writing: make(chan struct{}, 1)}
	mux.HandleFunc("GET /admin/v1/audit", a.audit)
	mux.HandleFunc("GET /admin/v1/rules", a.getRules)
	mux.HandleFunc("PUT /admin/v1/rules", a.putRules)
	mux.HandleFunc("POST /admin/v1/rules/validate", a.validateRules)
	mux.HandleFunc("GET /admin/v1/rules/versions", a.rulesVersions)
	mux.HandleFunc("POST /admin/v1/rules/rollback", a.rollback)
	mux.HandleFunc("GET /admin/v1/blocklist/{key}", a.listRoute(tollgatev1.ActionBlock, a.getList))
	mux.HandleFunc("PUT /admin/v1/blocklist/{key}", a.listRoute(tollgatev1.ActionBlock, a.putList))
	mux.HandleFunc("DELETE /admin/v1/blocklist/{key}", a.listRoute(tollgatev1.ActionBlock, a.deleteList))
	mux.HandleFunc("GET /admin/v1/allowlist/{key}", a.listRoute(tollgatev1.ActionAllow, a.getList))
	mux.HandleFunc("PUT /admin/v1/allowlist/{key}", a.listRoute(tollgatev1.ActionAllow, a.putList))
	mux.HandleFunc("DELETE /admin/v1/allowlist/{key}", a.listRoute(tollgatev1.ActionAllow, a.deleteList))
	mux.HandleFunc("GET /admin/v1/overrides/{key}", a.overrideRoute(a.getOverride))
	mux.HandleFunc("PUT /admin/v1/overrides/{key}", a.overrideRoute(a.putOverride))
	mux.HandleFunc("DELETE /admin/v1/overrides/{key}", a.overrideRoute(a.deleteOverride))
	mux.HandleFunc("GET /admin/v1/keys/{key}", a.getKey)
	mux.HandleFunc("POST /admin/v1/keys/{key}/reset", a.resetKey)
	mux.HandleFunc("POST /admin/v1/keys/{key}/quota", a.addQuota)
	mux.HandleFunc("GET /admin/v1/penalties/{key}", a.getPenalty)
	mux.HandleFunc("DELETE /admin/v1/penalties/{key}", a.deletePenalty)
	mux.HandleFunc("/admin/", func(w http.ResponseWriter, r *http.Request) {
		apierror.Write(w, http.StatusNotFound, apierror.NotFound, "no such operator API route: "+r.Method+" "+r.URL.Path)
	})
}

type api struct {
	cfg Config
	// writing is held (a one-slot semaphore) by a change of the NATS
	// buckets from its read to its write: changes through one instance
	// never race each other, so only another instance or the penalty
	// ladder can make a write lose (and be retried).
	writing chan struct{}
}

// lockWrites takes the write semaphore, or answers 503 and reports false
// when the request ends first. Call unlock when it reports true.
func (a *api) lockWrites(w http.ResponseWriter, r *http.Request) (unlock func(), ok bool) {
	select {
	case a.writing <- struct{}{}:
		return func() { <-a.writing }, true
	case <-r.Context().Done():
		apierror.Write(w, http.StatusServiceUnavailable, apierror.Unavailable, "gave up waiting for another change to finish")
		return nil, false
	}
}

// writeJSON writes v with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// Entry is the JSON form of an audit entry.
type Entry struct {
	ID        string            `json:"id"`
	Time      string            `json:"time"`
	Actor     string            `json:"actor"`
	Kind      string            `json:"kind"`
	Subject   string            `json:"subject"`
	KeyPrefix string            `json:"key_prefix,omitempty"`
	Reason    string            `json:"reason,omitempty"`
	Before    json.RawMessage   `json:"before,omitempty"`
	After     json.RawMessage   `json:"after,omitempty"`
	Version   int64             `json:"version,omitempty"`
	Evidence  []json.RawMessage `json:"evidence,omitempty"`
	// OriginRegion is the region a global change was made in.
	OriginRegion string `json:"origin_region,omitempty"`
}

// EntryJSON converts an entry.
func EntryJSON(e *tollgatev1.AuditEntry) Entry {
	out := Entry{ID: e.Id, Time: time.UnixMicro(e.TimeUnixMicros).UTC().Format(time.RFC3339Nano), Actor: e.Actor,
		Kind: e.Kind, Subject: e.Subject, KeyPrefix: e.KeyPrefix, Reason: e.Reason, Version: e.Version, OriginRegion: e.OriginRegion}
	if json.Valid(e.Before) {
		out.Before = e.Before
	}
	if json.Valid(e.After) {
		out.After = e.After
	}
	for _, ev := range e.Evidence {
		b, _ := json.Marshal(map[string]any{"detector": ev.Detector, "window_seconds": ev.WindowSeconds,
			"requests": ev.Requests, "rejected": ev.Rejected, "ignored_backoff": ev.IgnoredBackoff, "ratio": ev.Ratio,
			"rate_per_second": ev.RatePerSecond})
		out.Evidence = append(out.Evidence, b)
	}
	return out
}

func (a *api) audit(w http.ResponseWriter, r *http.Request) {
	v := r.URL.Query()
	q := audit.Query{Kind: v.Get("kind")}
	if k := v.Get("key"); k != "" {
		id, ok := subject(a.cfg.Hasher, k)
		if !ok {
			apierror.Write(w, http.StatusBadRequest, apierror.InvalidKey, "key: an API key or kid:<key_id>")
			return
		}
		q.Subject = id
	} else if s := v.Get("subject"); s != "" {
		q.Subject = s
	}
	for name, dst := range map[string]*time.Time{"from": &q.From, "to": &q.To} {
		if s := v.Get(name); s != "" {
			t, err := time.Parse(time.RFC3339Nano, s)
			if err != nil {
				apierror.Write(w, http.StatusBadRequest, apierror.InvalidRequest, name+": not an RFC 3339 time")
				return
			}
			*dst = t
		}
	}
	if s := v.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 10_000 {
			apierror.Write(w, http.StatusBadRequest, apierror.InvalidRequest, "limit: 1 to 10000")
			return
		}
		q.Limit = n
	}
	entries, err := a.cfg.Audit.Query(q)
	if err != nil {
		apierror.Write(w, http.StatusInternalServerError, apierror.Internal, "reading the audit log failed")
		return
	}
	out := make([]Entry, 0, len(entries))
	for _, e := range entries {
		out = append(out, EntryJSON(e))
	}
	writeJSON(w, http.StatusOK, map[string]any{"entries": out})
}
