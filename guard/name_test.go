package guard

import (
	"context"
	"net/netip"
	"testing"

	"github.com/tollgate/tollgate/guard/rules"
)

// namingStore records the identities the guard asks it to name, and
// decides like countingStore.
type namingStore struct {
	countingStore
	ids map[string]CounterID
}

func (s *namingStore) CounterName(id *CounterID) string {
	n := PlainName(id)
	s.ids[n] = *id
	return n
}

// TestCounterIdentity: the guard gives the store's Namer each counter's
// identity: a key without a tenant is its own tenant, an
// anonymous request counts key- and tenant-scope rules per IP, an IPv6
// address counts by its /64, by_endpoint rules add the endpoint.
func TestCounterIdentity(t *testing.T) {
	t.Parallel()
	rs, err := rules.Load([]byte(`
keys:
  sk_acme_1: {tenant: acme}
rules:
  - {id: k, match: {}, algorithm: fixed_window, limit: 100, window: 1h}
  - {id: t, scope: tenant, match: {}, algorithm: fixed_window, limit: 100, window: 1h}
  - {id: i, scope: ip, match: {}, algorithm: fixed_window, limit: 100, window: 1h}
  - {id: g, scope: global, match: {}, algorithm: fixed_window, limit: 100, window: 1h}
  - {id: e, match: {}, algorithm: fixed_window, limit: 100, window: 1h, by_endpoint: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	tag := func(id string) string { return rs.Rule(id).Tag }
	store := &namingStore{countingStore: countingStore{counts: map[string]int64{}}}
	g, err := New(store, []byte("test-secret-0123456789"), rs)
	if err != nil {
		t.Fatal(err)
	}
	v4, v6 := netip.MustParseAddr("::ffff:10.0.0.7"), netip.MustParseAddr("2001:db8:1:2:aaaa::1")
	kid, acme := g.KeyID("sk_test_1"), g.KeyID("sk_acme_1")
	for _, tc := range []struct {
		name string
		req  Request
		want []CounterID
	}{
		{"key without tenant", Request{Key: "sk_test_1", Path: "/a", IP: v4}, []CounterID{
			{Rule: tag("k"), Scope: rules.ScopeKey, Tenant: kid, KeyID: kid},
			{Rule: tag("t"), Scope: rules.ScopeTenant, Tenant: kid},
			{Rule: tag("i"), Scope: rules.ScopeIP, IP: netip.MustParseAddr("10.0.0.7")},
			{Rule: tag("g"), Scope: rules.ScopeGlobal},
			{Rule: tag("e"), Scope: rules.ScopeKey, Tenant: kid, KeyID: kid, Endpoint: "/a"},
		}},
		{"registered key", Request{Key: "sk_acme_1", Path: "/b/", IP: v6}, []CounterID{
			{Rule: tag("k"), Scope: rules.ScopeKey, Tenant: "acme", KeyID: acme},
			{Rule: tag("t"), Scope: rules.ScopeTenant, Tenant: "acme"},
			{Rule: tag("i"), Scope: rules.ScopeIP, IP: netip.MustParseAddr("2001:db8:1:2::")},
			{Rule: tag("g"), Scope: rules.ScopeGlobal},
			{Rule: tag("e"), Scope: rules.ScopeKey, Tenant: "acme", KeyID: acme, Endpoint: "/b"},
		}},
		{"anonymous", Request{Path: "/a", IP: v6}, []CounterID{
			{Rule: tag("k"), Scope: rules.ScopeIP, IP: netip.MustParseAddr("2001:db8:1:2::")},
			{Rule: tag("t"), Scope: rules.ScopeIP, IP: netip.MustParseAddr("2001:db8:1:2::")},
			{Rule: tag("i"), Scope: rules.ScopeIP, IP: netip.MustParseAddr("2001:db8:1:2::")},
			{Rule: tag("g"), Scope: rules.ScopeGlobal},
			{Rule: tag("e"), Scope: rules.ScopeIP, IP: netip.MustParseAddr("2001:db8:1:2::"), Endpoint: "/a"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store.ids = map[string]CounterID{}
			if _, err := g.Check(t.Context(), &tc.req); err != nil {
				t.Fatal(err)
			}
			for _, want := range tc.want {
				if _, ok := store.ids[PlainName(&want)]; !ok {
					t.Errorf("no counter %+v among %v", want, store.ids)
				}
			}
			if len(store.ids) != len(tc.want) {
				t.Errorf("%d counters named, want %d: %v", len(store.ids), len(tc.want), store.ids)
			}
		})
	}
}

// TestHostileKeysIsolated: through a whole guard, exhausting the counter
// of one hostile key leaves every other key's counter untouched.
func TestHostileKeysIsolated(t *testing.T) {
	t.Parallel()
	rs, err := rules.Load([]byte("rules:\n  - {id: r, match: {}, algorithm: fixed_window, limit: 2, window: 1h}\n"))
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(&countingStore{counts: map[string]int64{}}, []byte("test-secret-0123456789"), rs)
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{"a", "a{b}", "{b}", "b", "a:b", "a*", "*", "{a}", "a}"}
	for _, victim := range keys {
		for i := range 3 {
			d, err := g.Check(t.Context(), &Request{Key: victim, Path: "/"})
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed != (i < 2) {
				t.Fatalf("key %q, check %d: allowed %v", victim, i, d.Allowed)
			}
		}
	}
}

// countingStore is a Store counting units per counter name, limit from the
// counter's params (a fixed window that never ends).
type countingStore struct{ counts map[string]int64 }

func (s *countingStore) Do(_ context.Context, op Op, now int64, cs []Counter, res []CounterResult) (int64, error) {
	for i, c := range cs {
		n := s.counts[c.Name]
		res[i] = CounterResult{Allowed: n+c.Cost <= c.Params.Limit, Remaining: c.Params.Limit - n}
		if res[i].Allowed && op == OpCheck {
			s.counts[c.Name] = n + c.Cost
			res[i].Charged, res[i].Remaining = true, c.Params.Limit-n-c.Cost
		}
	}
	return now, nil
}
