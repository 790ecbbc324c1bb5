package guard

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/guard/rules"
)

// hashTag returns what Redis Cluster hashes: the part between the first '{'
// and the next '}'.
func hashTag(name string) string {
	i := strings.IndexByte(name, '{')
	j := strings.IndexByte(name[i+1:], '}')
	return name[i+1 : i+1+j]
}

func testGuard(t testing.TB) *Guard {
	g, err := New(nil, []byte("test-secret-0123456789"), nil)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// FuzzCounterName: whatever the tenant (from a registry or a trusted
// header) or key holds, a counter name has exactly the intended hash tag,
// the key and tenant counters of a request share it, and two different
// tenants never share a name.
func FuzzCounterName(f *testing.F) {
	for _, s := range []string{"acme", "{x}", "a}b", "ip:1.2.3.4", "g:abc", "~x", "*", "", "k:{t}*"} {
		f.Add(s, s+"2", "sk_{live}*:1")
	}
	g := testGuard(f)
	keyRule := &rules.Rule{ID: "k", Scope: rules.ScopeKey, Tag: "abc"}
	tenantRule := &rules.Rule{ID: "t", Scope: rules.ScopeTenant, Tag: "def"}
	f.Fuzz(func(t *testing.T, tenant1, tenant2, key string) {
		if key == "" {
			key = "anonymous requests are counted per IP"
		}
		kid := g.KeyID(key)
		r1 := &rules.Request{Key: key, KeyID: kid, Tenant: tenant1, IP: netip.MustParseAddr("10.1.2.3")}
		if tenant1 == "" {
			r1.Tenant = kid
		}
		kn := g.counterName(keyRule, r1)
		tn := g.counterName(tenantRule, r1)
		if strings.Count(kn, "{") != 1 || strings.Count(kn, "}") != 1 {
			t.Fatalf("name %q has stray braces", kn)
		}
		if hashTag(kn) != hashTag(tn) {
			t.Fatalf("key and tenant counters in different slots: %q %q", kn, tn)
		}
		// A key without a tenant is its own tenant: its tag is the key_id,
		// never the raw key (a raw key ending the name by chance, as "}abc"
		// does "tg{…}abc", is not the raw key leaking).
		if tenant1 == "" && hashTag(kn) != kid {
			t.Fatalf("key %q: tag of %q is not its key_id", key, kn)
		}
		r2 := *r1
		r2.Tenant = tenant2
		if tenant2 == "" {
			r2.Tenant = kid
		}
		if r1.Tenant != r2.Tenant && g.counterName(tenantRule, &r2) == tn {
			t.Fatalf("tenants %q and %q share counter %q", r1.Tenant, r2.Tenant, tn)
		}
	})
}

func TestCounterNames(t *testing.T) {
	t.Parallel()
	g := testGuard(t)
	kid := g.KeyID("sk_test_1")
	for _, tc := range []struct {
		name string
		rule *rules.Rule
		req  rules.Request
		want string
	}{
		{"key without tenant", &rules.Rule{Scope: rules.ScopeKey, Tag: "abc"}, rules.Request{Key: "sk_test_1", KeyID: kid, Tenant: kid}, "tg{" + kid + "}abc"},
		{"key with tenant", &rules.Rule{Scope: rules.ScopeKey, Tag: "abc"}, rules.Request{Key: "sk_test_1", KeyID: kid, Tenant: "acme"}, "tg{acme}abc" + kid},
		{"tenant", &rules.Rule{Scope: rules.ScopeTenant, Tag: "xyz"}, rules.Request{Key: "sk_test_1", KeyID: kid, Tenant: "acme"}, "tg{acme}xyz"},
		{"ipv4", &rules.Rule{Scope: rules.ScopeIP, Tag: "ip1"}, rules.Request{IP: netip.MustParseAddr("::ffff:10.0.0.7")}, "tg{ip:10.0.0.7}ip1"},
		{"ipv6 /64", &rules.Rule{Scope: rules.ScopeIP, Tag: "ip1"}, rules.Request{IP: netip.MustParseAddr("2001:db8:1:2:aaaa::1")}, "tg{ip:2001:db8:1:2::/64}ip1"},
		{"anonymous key scope counts per IP", &rules.Rule{Scope: rules.ScopeKey, Tag: "abc"}, rules.Request{IP: netip.MustParseAddr("10.0.0.7")}, "tg{ip:10.0.0.7}abc"},
		{"global", &rules.Rule{Scope: rules.ScopeGlobal, Tag: "glb"}, rules.Request{Key: "x", KeyID: kid, Tenant: kid}, "tg{g:glb}glb"},
		{"unsafe tenant is hashed", &rules.Rule{Scope: rules.ScopeTenant, Tag: "xyz"}, rules.Request{Key: "k", KeyID: kid, Tenant: "a}b"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := g.counterName(tc.rule, &tc.req)
			if tc.want == "" {
				if !strings.HasPrefix(got, "tg{~") || strings.Count(got, "}") != 1 {
					t.Fatalf("got %q", got)
				}
				return
			}
			if got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestHostileKeyMaterial: API keys and tenants holding the characters that
// matter to Redis key names ({, } end or start a Cluster hash tag, : is the
// separator of the scope prefixes, * is a glob in KEYS/SCAN) can neither
// escape their hash tag nor collide with another key's counter: keys are
// hashed to key_ids, tenants that are not plain are hashed too.
func TestHostileKeyMaterial(t *testing.T) {
	t.Parallel()
	g := testGuard(t)
	keyRule := &rules.Rule{ID: "k", Scope: rules.ScopeKey, Tag: "abc"}
	tenantRule := &rules.Rule{ID: "t", Scope: rules.ScopeTenant, Tag: "def"}
	epRule := &rules.Rule{ID: "e", Scope: rules.ScopeKey, Tag: "ghi", ByEndpoint: true}
	hostile := []string{
		"a", "b", "a{b}", "{b}", "{", "}", "{}", "}{", "a}b{c", "{{a}}",
		"a:b", "ip:10.0.0.1", "g:abc", "~abc", "*", "a*", "*}", "{*}",
		"tg{acme}abc", "acme", "}abc", "sk_live:{tenant}*:x",
	}
	seen := map[string]string{} // counter name → what produced it
	add := func(name, what string) {
		t.Helper()
		if strings.Count(name, "{") != 1 || strings.Count(name, "}") != 1 || strings.Index(name, "{") > strings.Index(name, "}") {
			t.Fatalf("%s: name %q does not have exactly one hash tag", what, name)
		}
		if prev, ok := seen[name]; ok {
			t.Fatalf("%s and %s share counter %q", what, prev, name)
		}
		seen[name] = what
	}
	for _, key := range hostile {
		kid := g.KeyID(key)
		// The key is its own tenant: the tag is its key_id.
		r := &rules.Request{Key: key, KeyID: kid, Tenant: kid, Endpoint: "/x"}
		kn := g.counterName(keyRule, r)
		if hashTag(kn) != kid {
			t.Fatalf("key %q: tag %q, want its key_id", key, hashTag(kn))
		}
		if len(key) > 4 && strings.Contains(kn, key) {
			t.Fatalf("raw key %q in counter name %q", key, kn)
		}
		add(kn, "key "+key)
		add(g.counterName(tenantRule, r), "tenant of key "+key)
		add(g.counterName(epRule, r), "endpoint counter of key "+key)
		// The same string as a tenant (from a registry or a trusted header).
		rt := &rules.Request{Key: "k", KeyID: g.KeyID("k"), Tenant: key}
		tn := g.counterName(tenantRule, rt)
		if tag := hashTag(tn); tag != key && !strings.HasPrefix(tag, "~") {
			t.Fatalf("tenant %q: tag %q is neither the tenant nor its hash", key, tag)
		}
		add(tn, "tenant "+key)
		add(g.counterName(keyRule, rt), "key k of tenant "+key)
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
