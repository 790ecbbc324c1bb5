package guard_test

import (
	"context"
	"net/netip"
	"sync/atomic"
	"testing"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/memstore"
	"github.com/tollgate/tollgate/guard/rules"
)

// namedStore is a memstore that counts the names it is asked for: one per
// counter of each resolution the guard computes.
type namedStore struct {
	*memstore.Store
	names atomic.Int64
}

func (s *namedStore) CounterName(id *guard.CounterID) string {
	s.names.Add(1)
	return guard.PlainName(id)
}

const cacheRules = `
keys:
  sk_reg: {tenant: acme, tier: pro}
rules:
  - {id: key, match: {}, algorithm: fixed_window, limit: 100, window: 1h}
  - {id: ip, scope: ip, match: {endpoint: "^/ip"}, algorithm: fixed_window, limit: 100, window: 1h}
  - {id: desc, match: {descriptor: {plan: gold}}, algorithm: fixed_window, limit: 7, window: 1h}
`

// TestResolutionCache: a request's resolution (key_id, lists, penalty,
// rules, parameters, names) is computed once and reused, and never
// outlives what it was computed from: the ruleset, the controls, the
// expiry of a control it applied, the request's descriptor and IP where
// rules depend on them.
func TestResolutionCache(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := newClock(1_763_000_000_000_000)
	store := &namedStore{Store: memstore.New(memstore.WithClock(clock.now))}
	g := mustGuard(t, store, mustRules(t, cacheRules), guard.WithClock(clock.now))
	check := func(req *guard.Request) *guard.Decision {
		t.Helper()
		d, err := g.Check(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	req := &guard.Request{Key: "sk_a", Path: "/v1/x", Method: "GET"}
	names := func() int64 { return store.names.Load() }

	t.Run("computed once", func(t *testing.T) {
		before := names()
		for range 10 {
			check(req)
		}
		if n := names() - before; n != 1 {
			t.Fatalf("10 checks of one key and endpoint named %d counters, want 1", n)
		}
		check(&guard.Request{Key: "sk_a", Path: "/v1/y", Method: "GET"})
		check(&guard.Request{Key: "sk_a", Path: "/v1/x", Method: "POST"})
		if n := names() - before; n != 3 {
			t.Fatalf("another endpoint and another method: %d names, want 3", n)
		}
	})
	t.Run("controls", func(t *testing.T) {
		kid := g.KeyID("sk_a")
		g.Controls().Block(kid, guard.Entry{Expiry: clock.now() + 5_000_000})
		if d := check(req); d.Status != 403 {
			t.Fatalf("blocked key: status %d", d.Status)
		}
		clock.advance(5_000_000)
		if d := check(req); !d.Allowed {
			t.Fatalf("blocklist entry expired: %+v", d)
		}
		g.Controls().SetKeyOverride(kid, guard.Override{Override: rules.Override{Limit: 3, Expiry: clock.now() + 2_000_000}})
		if d := check(req); d.Rules[0].Limit != 3 {
			t.Fatalf("override: limit %d, want 3", d.Rules[0].Limit)
		}
		clock.advance(2_000_000)
		if d := check(req); d.Rules[0].Limit != 100 {
			t.Fatalf("override expired: limit %d, want 100", d.Rules[0].Limit)
		}
		g.Controls().SetPenalty(kid, guard.Penalty{Level: 1, Until: clock.now() + 1_500_000})
		if d := check(req); d.Reason != guard.ReasonPenalty || d.RetryAfter != 2 {
			t.Fatalf("penalty: %s retry %d", d.Reason, d.RetryAfter)
		}
		clock.advance(1_000_000)
		if d := check(req); d.Reason != guard.ReasonPenalty || d.RetryAfter != 1 {
			t.Fatalf("penalty half served: %s retry %d", d.Reason, d.RetryAfter)
		}
		clock.advance(500_000)
		if d := check(req); !d.Allowed {
			t.Fatalf("penalty over: %+v", d)
		}
	})
	t.Run("ruleset", func(t *testing.T) {
		g.SetRules(mustRules(t, `
rules:
  - {id: key, match: {}, algorithm: fixed_window, limit: 50, window: 1h}
`))
		if d := check(req); d.Rules[0].Limit != 50 {
			t.Fatalf("new ruleset: limit %d, want 50", d.Rules[0].Limit)
		}
		g.SetRules(mustRules(t, cacheRules))
	})
	t.Run("registry", func(t *testing.T) {
		d := check(&guard.Request{Key: "sk_reg", Path: "/v1/x", Tenant: "spoofed"})
		if d.Tenant != "acme" {
			t.Fatalf("registered key: tenant %q", d.Tenant)
		}
		d = check(&guard.Request{Key: "sk_b", Path: "/v1/x", Tenant: "t1"})
		d2 := check(&guard.Request{Key: "sk_b", Path: "/v1/x", Tenant: "t2"})
		if d.Tenant != "t1" || d2.Tenant != "t2" {
			t.Fatalf("tenants from the request: %q %q", d.Tenant, d2.Tenant)
		}
	})
	t.Run("descriptor", func(t *testing.T) {
		gold := check(&guard.Request{Key: "sk_d", Path: "/v1/x", Descriptor: map[string]string{"plan": "gold"}})
		plain := check(&guard.Request{Key: "sk_d", Path: "/v1/x", Descriptor: map[string]string{"plan": "tin"}})
		if len(gold.Rules) != 2 || len(plain.Rules) != 1 {
			t.Fatalf("descriptors: %d and %d rules, want 2 and 1", len(gold.Rules), len(plain.Rules))
		}
	})
	t.Run("ip", func(t *testing.T) {
		a := netip.MustParseAddr("10.0.0.1")
		b := netip.MustParseAddr("10.0.0.2")
		for range 3 {
			check(&guard.Request{Key: "sk_ip", Path: "/ip", IP: a})
		}
		d := check(&guard.Request{Key: "sk_ip", Path: "/ip", IP: b})
		if r := ruleResult(d, "ip"); r == nil || r.Remaining != 99 {
			t.Fatalf("another client address shares a counter: %+v", r)
		}
		anon := check(&guard.Request{Path: "/v1/x", IP: a})
		anon2 := check(&guard.Request{Path: "/v1/x", IP: b})
		if anon.Rules[0].Remaining != 99 || anon2.Rules[0].Remaining != 99 {
			t.Fatalf("anonymous requests of two addresses share a counter: %d %d", anon.Rules[0].Remaining, anon2.Rules[0].Remaining)
		}
	})
	t.Run("invalid key", func(t *testing.T) {
		if d := check(&guard.Request{Key: "bad key", Path: "/v1/x"}); d.Code != guard.CodeInvalidKey {
			t.Fatalf("invalid key: %s", d.Code)
		}
		if d := check(&guard.Request{Key: "bad key", Path: "/v1/%2F"}); d.Code != guard.CodeInvalidKey {
			t.Fatalf("invalid key and path: %s, want the key's error first", d.Code)
		}
	})
}
