package adminapi

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/tollgate/tollgate/aggregator/internal/audit"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/apierror"
	"github.com/tollgate/tollgate/guard/keyid"
	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// GuardFunc returns a guard deciding with the fleet's active ruleset and
// its Redis (the same counters the gateways use).
type GuardFunc func(ctx context.Context) (*guard.Guard, error)

// keyRequest is the request a keys/{key} route acts on: the key, and the
// endpoint, method, client IP and tenant that select the applicable rules
// (query parameters on GET, body fields on POST; endpoint default "/").
type keyRequest struct {
	Endpoint string `json:"endpoint"`
	Method   string `json:"method"`
	IP       string `json:"ip"`
	Tenant   string `json:"tenant"`
	Tokens   int64  `json:"tokens"`
	Reason   string `json:"reason"`
}

func (a *api) keyGuard(w http.ResponseWriter, r *http.Request) (*guard.Guard, *guard.Request, keyRequest, bool) {
	k := r.PathValue("key")
	var g *guard.Guard
	if id, ok := strings.CutPrefix(k, "kid:"); ok {
		// Which rules apply, and with which parameters, depends on the raw
		// key (api_key globs, tiers by pattern, the lists): a kid: is
		// served only for a key the registry names, whose raw key the
		// ruleset holds.
		if g = a.guard(w, r); g == nil {
			return nil, nil, keyRequest{}, false
		}
		if k = registeredKey(g.Rules(), a.cfg.Hasher, id); k == "" {
			apierror.Write(w, http.StatusBadRequest, apierror.InvalidKey,
				"keys/{key} takes kid:<key_id> only for a key of the key registry; give the API key itself: which rules apply depends on it (api_key globs, tiers by pattern, the lists)")
			return nil, nil, keyRequest{}, false
		}
	}
	if !guard.ValidKey(k) || k == "" {
		apierror.Write(w, http.StatusBadRequest, apierror.InvalidKey, "{key}: an API key of at most 256 bytes without control characters")
		return nil, nil, keyRequest{}, false
	}
	var kr keyRequest
	if r.Method == http.MethodGet {
		q := r.URL.Query()
		kr = keyRequest{Endpoint: q.Get("endpoint"), Method: q.Get("method"), IP: q.Get("ip"), Tenant: q.Get("tenant")}
	} else {
		body, ok := readBody(w, r, maxSmallBody)
		if !ok {
			return nil, nil, kr, false
		}
		if len(strings.TrimSpace(string(body))) > 0 {
			if err := strictJSON(body, &kr); err != nil {
				apierror.Write(w, http.StatusBadRequest, apierror.InvalidRequest, `body: {"endpoint","method","ip","tenant","tokens","reason"} (all optional but tokens for quota): `+err.Error())
				return nil, nil, kr, false
			}
		}
	}
	kr.Endpoint = cmp.Or(kr.Endpoint, "/")
	kr.Method = cmp.Or(kr.Method, http.MethodGet)
	req := &guard.Request{Key: k, Path: kr.Endpoint, Method: kr.Method, Tenant: kr.Tenant}
	if kr.IP != "" {
		ip, err := netip.ParseAddr(kr.IP)
		if err != nil {
			apierror.Write(w, http.StatusBadRequest, apierror.InvalidRequest, "ip: not an IP address")
			return nil, nil, kr, false
		}
		req.IP = ip.Unmap()
	}
	if g == nil {
		if g = a.guard(w, r); g == nil {
			return nil, nil, kr, false
		}
	}
	return g, req, kr, true
}

// guard returns the guard of the keys/{key} routes, or answers 503 and
// returns nil.
func (a *api) guard(w http.ResponseWriter, r *http.Request) *guard.Guard {
	if a.cfg.Guard == nil {
		apierror.Write(w, http.StatusServiceUnavailable, apierror.NotConfigured, "keys/{key} needs the rules and Redis")
		return nil
	}
	g, err := a.cfg.Guard(r.Context())
	if err != nil {
		apierror.Write(w, http.StatusServiceUnavailable, apierror.RulesUnavailable, err.Error())
		return nil
	}
	return g
}

// registeredKey returns the raw key of rs's key registry whose key_id is
// id, or "". It hashes every registered key: the operator API's pace, not
// the request path's.
func registeredKey(rs *rules.Ruleset, h *keyid.Hasher, id string) string {
	var found string
	if rs == nil || h == nil {
		return ""
	}
	rs.RegisteredKeys(func(k string) bool {
		if h.ID(k) == id {
			found = k
			return false
		}
		return true
	})
	return found
}

// ruleState is one applicable rule in GET keys/{key}.
type ruleState struct {
	ID         string `json:"id"`
	Algorithm  string `json:"algorithm"`
	Shadow     bool   `json:"shadow,omitempty"`
	Limit      int64  `json:"limit"`
	Remaining  int64  `json:"remaining"`
	Reset      string `json:"reset"`
	WouldAllow bool   `json:"would_allow"`
	RetryAfter int64  `json:"retry_after,omitempty"`
	Window     int64  `json:"window_seconds"`
	// Granted is, in a quota grant's answer, how many units the counter
	// gained: the tokens asked for, or fewer when it reached its limit
	// (a counter never holds more than a full one).
	Granted *int64 `json:"granted,omitempty"`
}

func decisionJSON(d *guard.Decision, keyID, prefix string) map[string]any {
	rules := make([]ruleState, 0, len(d.Rules))
	for _, rr := range d.Rules {
		rules = append(rules, ruleState{ID: rr.ID, Algorithm: string(rr.Algorithm), Shadow: rr.Shadow, Limit: rr.Limit,
			Remaining: rr.Remaining, Reset: time.Unix(rr.Reset, 0).UTC().Format(time.RFC3339), WouldAllow: rr.Allowed,
			RetryAfter: rr.RetryAfter, Window: rr.Window})
	}
	out := map[string]any{"key_id": keyID, "key_prefix": prefix, "tenant": d.Tenant, "tier": d.Tier, "endpoint": d.Endpoint,
		"status": d.Status, "reason": d.Reason, "degraded": d.Degraded, "rules": rules}
	if d.Code != "" {
		out["code"] = d.Code
	}
	return out
}

func (a *api) getKey(w http.ResponseWriter, r *http.Request) {
	g, req, _, ok := a.keyGuard(w, r)
	if !ok {
		return
	}
	d, err := g.State(r.Context(), req)
	if err != nil {
		apierror.Write(w, http.StatusServiceUnavailable, apierror.RedisUnavailable, err.Error())
		return
	}
	_, prefix, _ := a.key(w, r)
	writeJSON(w, http.StatusOK, decisionJSON(d, d.KeyID, prefix))
}

func (a *api) resetKey(w http.ResponseWriter, r *http.Request) {
	g, req, kr, ok := a.keyGuard(w, r)
	if !ok {
		return
	}
	ch := counterChange{kind: audit.KindReset, notice: tollgatev1.CountersReset, op: "reset",
		after: func(before *guard.Decision) any {
			return map[string]any{"endpoint": before.Endpoint, "rules": len(before.Rules)}
		},
		do: func(ctx context.Context) (*guard.Decision, error) { return g.Reset(ctx, req) }}
	id, _, _, d, ok := a.changeCounters(w, r, g, req, kr, ch)
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"reset": len(d.Rules), "key_id": id, "endpoint": d.Endpoint})
}

func (a *api) addQuota(w http.ResponseWriter, r *http.Request) {
	g, req, kr, ok := a.keyGuard(w, r)
	if !ok {
		return
	}
	if kr.Tokens < 1 || kr.Tokens > 1<<40 {
		apierror.Write(w, http.StatusBadRequest, apierror.InvalidRequest, `body: {"tokens": N} with N ≥ 1`)
		return
	}
	ch := counterChange{kind: audit.KindQuota, notice: tollgatev1.CountersQuota, op: "quota",
		after: func(before *guard.Decision) any {
			return map[string]any{"tokens": kr.Tokens, "endpoint": before.Endpoint}
		},
		do: func(ctx context.Context) (*guard.Decision, error) { return g.AddQuota(ctx, req, kr.Tokens) }}
	id, prefix, before, d, ok := a.changeCounters(w, r, g, req, kr, ch)
	if !ok {
		return
	}
	after := decisionJSON(d, id, prefix)
	after["tokens"] = kr.Tokens
	setGranted(after["rules"].([]ruleState), before, kr.Tokens)
	writeJSON(w, http.StatusOK, after)
}

// counterChange is a change of a key's counters in Redis (reset, quota).
type counterChange struct {
	kind   string // its audit kind
	notice string // its kind in the gateways' counter notice
	op     string // what do does, for its error
	// after is the audit entry's after, given the state before.
	after func(before *guard.Decision) any
	// do makes the change and returns the state after it.
	do func(ctx context.Context) (*guard.Decision, error)
}

// changeCounters reads the key's state, makes the change (audited before
// it takes effect) and tells the gateways; it returns the key's key_id
// and prefix and its state before and after. When ok is false the request
// is answered.
func (a *api) changeCounters(w http.ResponseWriter, r *http.Request, g *guard.Guard, req *guard.Request, kr keyRequest,
	ch counterChange) (id, prefix string, before, d *guard.Decision, ok bool) {
	id, prefix, _ = a.key(w, r)
	before, err := g.State(r.Context(), req)
	if err != nil {
		apierror.Write(w, http.StatusServiceUnavailable, apierror.RedisUnavailable, "nothing was changed: reading the counters failed: "+err.Error())
		return id, prefix, nil, nil, false
	}
	err = a.apply(r, &tollgatev1.AuditEntry{Kind: ch.kind, Subject: id, KeyPrefix: prefix, Reason: kr.Reason,
		Before: mustJSON(decisionJSON(before, id, prefix)), After: mustJSON(ch.after(before))},
		func(ctx context.Context) error {
			var err error
			if d, err = ch.do(ctx); err != nil {
				return fmt.Errorf("%w: %s: %w", errMaybeApplied, ch.op, err)
			}
			return nil
		})
	if err != nil {
		changeFailed(w, err, apierror.RedisUnavailable)
		return id, prefix, before, nil, false
	}
	a.countersChanged(ch.notice, id, g.CounterNames(req))
	return id, prefix, before, d, true
}

// countersChanged tells the gateways that the counters named (of key_id
// id) changed in Redis behind their backs, so that their fast path drops
// the leases and negative cache it derived from them: else a key
// granted quota would still be refused from a gateway's memory until the
// Retry-After it was last given, and after a reset the unused units of an
// old lease would come off the fresh counter. Without NATS there is no
// fleet to tell; a failure is logged, and the change stands.
func (a *api) countersChanged(kind, id string, counters []string) {
	if a.cfg.KV == nil {
		return
	}
	kv := a.cfg.KV()
	if kv == nil {
		a.cfg.Log.Warn("gateways not told of a counter change: NATS not reached yet; their negative cache lasts until its Retry-After",
			slog.String("kind", kind), slog.String("key_id", id))
		return
	}
	if err := kv.CountersChanged(kind, id, counters); err != nil {
		a.cfg.Log.Warn("gateways not told of a counter change; their negative cache lasts until its Retry-After",
			slog.String("kind", kind), slog.String("key_id", id), slog.String("error", err.Error()))
	}
}

// setGranted sets each rule's Granted: what its remaining gained from
// before, within [0, tokens]. The state is read before the grant, not in
// the same step, so a request decided in between, or a refill, can make
// it differ from the true gain by that much.
func setGranted(rules []ruleState, before *guard.Decision, tokens int64) {
	prev := make(map[string]int64, len(before.Rules))
	for _, rr := range before.Rules {
		prev[rr.ID] = rr.Remaining
	}
	for i := range rules {
		was, ok := prev[rules[i].ID]
		if !ok {
			continue
		}
		g := min(max(rules[i].Remaining-was, 0), tokens)
		rules[i].Granted = &g
	}
}
