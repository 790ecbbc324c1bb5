package chaos

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/tollgate/tollgate/loadtest/internal/chaos/history"
)

// The soak's ruleset: every algorithm strict and on the fast path, with
// on_failure open and closed, a tenant-scope rule and the ops rule the
// operator changes. Each endpoint has its rules and nothing else.
func soakRules() []history.Rule {
	s := func(d time.Duration) history.Micros { return d.Microseconds() }
	return []history.Rule{
		{ID: "s-tb", Algorithm: history.TokenBucket, Limit: 6, Rate: 1, Strict: true, OnFailure: "closed", Scope: "key", Endpoints: []string{"/s/tb"}},
		{ID: "s-fw", Algorithm: history.FixedWindow, Limit: 4, Window: s(2 * time.Second), Strict: true, OnFailure: "open", Scope: "key", Endpoints: []string{"/s/fw"}},
		{ID: "s-swl", Algorithm: history.SlidingWindowLog, Limit: 4, Window: s(2 * time.Second), Strict: true, OnFailure: "closed", Scope: "key", Endpoints: []string{"/s/swl"}},
		{ID: "s-swc", Algorithm: history.SlidingWindowCounter, Limit: 6, Window: s(3 * time.Second), Precision: 3, Strict: true, OnFailure: "open", Scope: "key", Endpoints: []string{"/s/swc"}},
		{ID: "s-gcra", Algorithm: history.GCRA, Limit: 4, Window: s(time.Second), Rate: 2, Strict: true, OnFailure: "closed", Scope: "key", Endpoints: []string{"/s/gcra"}},
		{ID: "f-tb", Algorithm: history.TokenBucket, Limit: 100, Rate: 2, Strict: false, OnFailure: "open", Scope: "key", Endpoints: []string{"/f/tb"}},
		{ID: "f-fw", Algorithm: history.FixedWindow, Limit: 6, Window: s(5 * time.Second), Strict: false, OnFailure: "closed", Scope: "key", Endpoints: []string{"/f/fw"}},
		{ID: "f-swl", Algorithm: history.SlidingWindowLog, Limit: 3, Window: s(2 * time.Second), Strict: false, OnFailure: "open", Scope: "key", Endpoints: []string{"/f/swl"}},
		{ID: "f-swc", Algorithm: history.SlidingWindowCounter, Limit: 8, Window: s(6 * time.Second), Precision: 3, Strict: false, OnFailure: "closed", Scope: "key", Endpoints: []string{"/f/swc"}},
		{ID: "f-gcra", Algorithm: history.GCRA, Limit: 100, Window: s(50 * time.Second), Rate: 2, Strict: false, OnFailure: "open", Scope: "key", Endpoints: []string{"/f/gcra"}},
		{ID: "t-key", Algorithm: history.TokenBucket, Limit: 4, Rate: 2, Strict: true, OnFailure: "open", Scope: "key", Endpoints: []string{"/t/x"}},
		{ID: "t-ten", Algorithm: history.FixedWindow, Limit: 10, Window: s(2 * time.Second), Strict: true, OnFailure: "open", Scope: "tenant", Endpoints: []string{"/t/x"}},
		{ID: opsRule, Algorithm: history.TokenBucket, Limit: opsLimit, Rate: opsLimit / opsRefill, Strict: true, OnFailure: "open", Scope: "key", Endpoints: []string{opsEndpoint}},
	}
}

// The ops rule: a token bucket whose limit the operator changes, its rate
// scaled with it (a full refill always takes opsRefill seconds).
const (
	opsRule     = "ops"
	opsEndpoint = "/o/x"
	opsLimit    = 10
	opsRefill   = 5
)

// Tenants of the load.
var tenants = []string{"acme", "globex", "initech"}

// Key names: per tenant two hot keys (hot1 mostly on the fast path, hot2
// mostly strict) and a polite one; a probe key the harness peeks with;
// and the key the last operator change blocks.
const (
	probeKey = "probe"
	finalKey = "final"
)

func soakKeys() []history.Key {
	var out []history.Key
	for _, t := range tenants {
		for _, k := range []string{"hot1", "hot2", "polite"} {
			out = append(out, history.Key{Name: t + "-" + k, Raw: "sk_chaos_" + t + "_" + k, Tenant: t, Polite: k == "polite"})
		}
	}
	out = append(out, history.Key{Name: probeKey, Raw: "sk_chaos_probe", Tenant: "harness"},
		history.Key{Name: finalKey, Raw: "sk_chaos_final", Tenant: "harness"})
	return out
}

// rulesYAML writes the ruleset, with the ops rule at limit ops, as the
// rules file and the operator API take it.
func rulesYAML(rules []history.Rule, keys []history.Key, ops int64) string {
	var b strings.Builder
	b.WriteString("# The chaos soak's rules (loadtest/internal/chaos/rules.go).\nkeys:\n")
	sorted := append([]history.Key(nil), keys...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Raw < sorted[j].Raw })
	for _, k := range sorted {
		fmt.Fprintf(&b, "  %s: {tenant: %s, tier: pro}\n", k.Raw, k.Tenant)
	}
	b.WriteString("rules:\n")
	for _, r := range rules {
		limit, rate := r.Limit, r.Rate
		if r.ID == opsRule {
			limit, rate = ops, float64(ops)/opsRefill
		}
		fmt.Fprintf(&b, "  - id: %s\n    algorithm: %s\n", r.ID, r.Algorithm)
		fmt.Fprintf(&b, "    match: {endpoint: '^(%s)$'}\n", strings.Join(r.Endpoints, "|"))
		win := time.Duration(r.Window) * time.Microsecond
		switch r.Algorithm {
		case history.TokenBucket:
			fmt.Fprintf(&b, "    capacity: %d\n    refill_rate: %g\n", limit, rate)
		case history.GCRA:
			fmt.Fprintf(&b, "    limit: %d\n    window: %s\n    burst: %d\n", int64(rate*win.Seconds()+0.5), win, limit)
		case history.SlidingWindowCounter:
			fmt.Fprintf(&b, "    limit: %d\n    window: %s\n    precision: %d\n", limit, win, r.Precision)
		default:
			fmt.Fprintf(&b, "    limit: %d\n    window: %s\n", limit, win)
		}
		if r.Strict {
			b.WriteString("    strict: true\n")
		}
		fmt.Fprintf(&b, "    on_failure: %s\n", r.OnFailure)
		if r.Scope != "key" {
			fmt.Fprintf(&b, "    scope: %s\n", r.Scope)
		}
	}
	return b.String()
}
