package guard

import (
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
	g, err := New(nil, []byte("s"), nil)
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
		if strings.Contains(kn, key) && len(key) > 3 {
			t.Fatalf("raw key in counter name %q", kn)
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
