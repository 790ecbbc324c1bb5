package rules

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// clientIP is the client address of test requests that need one: rules
// counted per IP match no request without one.
var clientIP = netip.MustParseAddr("192.0.2.1")

// withIP returns req with clientIP when it has no IP.
func withIP(req Request) *Request {
	if !req.IP.IsValid() {
		req.IP = clientIP
	}
	return &req
}

func TestGlob(t *testing.T) {
	t.Parallel()
	tests := []struct {
		pattern, s string
		want       bool
	}{
		{"sk_free_*", "sk_free_demo", true},
		{"sk_free_*", "sk_free_", true},
		{"sk_free_*", "sk_fre", false},
		{"sk_free_*", "xsk_free_demo", false},
		{"*", "", true},
		{"*", "anything", true},
		{"**", "", true},
		{"exact", "exact", true},
		{"exact", "exactly", false},
		{"*_demo", "sk_free_demo", true},
		{"*_demo", "sk_free_demo2", false},
		{"sk_*_demo", "sk_free_demo", true},
		{"sk_*_demo", "sk_demo", false}, // prefix and suffix may not overlap
		{"ab*ba", "aba", false},
		{"ab*ba", "abba", true},
		{"a*b*c", "abc", true},
		{"a*b*c", "aXbYbZc", true},
		{"a*b*c", "acb", false},
		{"*a*a*", "aa", true},
		{"*a*a*", "a", false},
		{"sk_?", "sk_?", true}, // only * is special
		{"sk_?", "sk_x", false},
		{"sk_[ab]", "sk_a", false},
		{"sk_.*", "sk_abc", false},
		{"sk_.*", "sk_.abc", true},
		{"é*", "éa", true},
	}
	for _, tt := range tests {
		t.Run(tt.pattern+"/"+tt.s, func(t *testing.T) {
			t.Parallel()
			g, err := compileGlob(tt.pattern)
			if err != nil {
				t.Fatal(err)
			}
			if got := g.match(tt.s); got != tt.want {
				t.Errorf("match = %v, want %v", got, tt.want)
			}
		})
	}
}

const matchRules = `
keys:
  sk_prod_acme_1: {tenant: acme, tier: pro}
  sk_free_listed: {tier: gold}
tiers:
  - {pattern: "sk_free_*", tier: free}
  - {pattern: "sk_*", tier: basic}
  - {pattern: "sk_free_x*", tier: never}   # shadowed by the earlier patterns
allowlist: ["sk_internal_*", "sk_both_*", "sk_exact"]
blocklist: ["sk_revoked_*", "sk_both_*", "sk_dead"]
routes: ["/v1/users/{id}", "/v1/users/me", "/v1/orders/{id}/items", "/v1/{kind}/{id}/x", "/"]
rules:
  - {id: all, capacity: 1000, rate: 1000/1m}
  - {id: keyed, match: {anonymous: false}, capacity: 1000, rate: 1000/1m}
  - {id: anon, match: {anonymous: true}, scope: ip, capacity: 60, rate: 60/1m}
  - {id: any-key-glob, match: {api_key: "*"}, capacity: 10, rate: 10/1m}
  - {id: free, match: {tier: free}, capacity: 5, rate: 5/1m}
  - {id: acme, match: {tenant: acme}, scope: tenant, capacity: 5, rate: 5/1m}
  - {id: posts, match: {methods: [post, Put], endpoint: "^/v1/orders"}, capacity: 5, rate: 5/1m}
  - {id: users, match: {endpoint: "^/v1/users/\\{id\\}$"}, capacity: 5, rate: 5/1m}
  - {id: edge, match: {domain: edge}, capacity: 5, rate: 5/1m}
  - {id: edge-pay, match: {domain: edge, descriptor: {destination: payments, plan: gold}}, capacity: 5, rate: 5/1m}
  - {id: desc, match: {descriptor: {destination: payments}}, capacity: 5, rate: 5/1m}
`

func TestIdentify(t *testing.T) {
	t.Parallel()
	rs := mustLoad(t, matchRules)
	tests := []struct {
		key        string
		want       KeyInfo
		registered bool
	}{
		{"sk_prod_acme_1", KeyInfo{Tenant: "acme", Tier: "pro"}, true},
		{"sk_free_listed", KeyInfo{Tier: "gold"}, true}, // registry before tiers
		{"sk_free_xyz", KeyInfo{Tier: "free"}, false},   // first pattern wins
		{"sk_other", KeyInfo{Tier: "basic"}, false},
		{"pk_other", KeyInfo{}, false},
		{"", KeyInfo{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			t.Parallel()
			got, reg := rs.Identify(tt.key)
			if got != tt.want || reg != tt.registered {
				t.Errorf("Identify = %+v, %v; want %+v, %v", got, reg, tt.want, tt.registered)
			}
		})
	}
	if info, reg := mustLoad(t, "rules: []\ntiers: [{pattern: '*', tier: t}]\n").Identify(""); info.Tier != "" || reg {
		t.Error("an anonymous request got a tier from a * pattern")
	}
}

// TestRegisteredKeys: every key of the registry, and only those (not the
// tiers' patterns), once; stopping early stops.
func TestRegisteredKeys(t *testing.T) {
	t.Parallel()
	rs := mustLoad(t, matchRules)
	var got []string
	rs.RegisteredKeys(func(k string) bool { got = append(got, k); return true })
	slices.Sort(got)
	if want := []string{"sk_free_listed", "sk_prod_acme_1"}; !slices.Equal(got, want) {
		t.Fatalf("RegisteredKeys: %q, want %q", got, want)
	}
	n := 0
	rs.RegisteredKeys(func(string) bool { n++; return false })
	if n != 1 {
		t.Fatalf("RegisteredKeys went on after false: %d calls", n)
	}
}

func TestListed(t *testing.T) {
	t.Parallel()
	rs := mustLoad(t, matchRules)
	tests := map[string]ListStatus{
		"sk_internal_1": Allowlisted,
		"sk_exact":      Allowlisted,
		"sk_exact2":     Unlisted,
		"sk_revoked_1":  Blocklisted,
		"sk_dead":       Blocklisted,
		"sk_both_1":     Blocklisted, // the blocklist wins
		"sk_prod_1":     Unlisted,
		"":              Unlisted,
	}
	for key, want := range tests {
		if got := rs.Listed(key); got != want {
			t.Errorf("Listed(%q) = %v, want %v", key, got, want)
		}
	}
	if got := mustLoad(t, "allow_total_block: true\nallowlist: ['*']\nblocklist: ['*']\n").Listed(""); got != Unlisted {
		t.Errorf("anonymous request listed: %v", got)
	}
}

func TestNormalize(t *testing.T) {
	t.Parallel()
	rs := mustLoad(t, matchRules)
	tests := map[string]string{
		"/v1/users/42":           "/v1/users/{id}",
		"/v1/users/me":           "/v1/users/{id}", // first template wins
		"/v1/users/42?x=1&y=/a":  "/v1/users/{id}",
		"/v1/users/":             "/v1/users", // a trailing slash is dropped
		"/v1/users":              "/v1/users",
		"/v1/users/42/":          "/v1/users/{id}",
		"/v1/users/42/x":         "/v1/{kind}/{id}/x",
		"/v1/orders/7/items":     "/v1/orders/{id}/items",
		"/v1/orders/7/items?a=b": "/v1/orders/{id}/items",
		"/v1/orders/7/itemz":     "/v1/orders/7/itemz",
		"/v1/orders//items":      "/v1/orders//items",
		"/":                      "/",
		"/?q":                    "/",
		"":                       "",
		"?q=1":                   "",
		"v1/users/42":            "v1/users/42",
		"/v2/search?q=a":         "/v2/search",
	}
	for path, want := range tests {
		if got := rs.Normalize(path); got != want {
			t.Errorf("Normalize(%q) = %q, want %q", path, got, want)
		}
	}
	if got := mustLoad(t, "rules: []\n").Normalize("/a/b?c"); got != "/a/b" {
		t.Errorf("Normalize without routes = %q", got)
	}
}

func ids(rules []*Rule) string {
	var s []string
	for _, r := range rules {
		s = append(s, r.ID)
	}
	return strings.Join(s, ",")
}

func TestMatch(t *testing.T) {
	t.Parallel()
	rs := mustLoad(t, matchRules)
	tests := []struct {
		name string
		req  Request
		want string
	}{
		{"anonymous", Request{Endpoint: "/x", Method: "GET"}, "all,anon"},
		{"anonymous tier is ignored", Request{Tier: "free", Tenant: "acme", Endpoint: "/x"}, "all,anon"},
		{"free key", Request{Key: "sk_free_1", Tier: "free", Endpoint: "/x", Method: "GET"}, "all,keyed,any-key-glob,free"},
		{"tenant", Request{Key: "sk_prod_acme_1", Tier: "pro", Tenant: "acme"}, "all,keyed,any-key-glob,acme"},
		{"method case-insensitive", Request{Key: "k", Endpoint: "/v1/orders/{id}/items", Method: "POST"}, "all,keyed,any-key-glob,posts"},
		{"method lower case", Request{Key: "k", Endpoint: "/v1/orders", Method: "put"}, "all,keyed,any-key-glob,posts"},
		{"method not listed", Request{Key: "k", Endpoint: "/v1/orders", Method: "GET"}, "all,keyed,any-key-glob"},
		{"endpoint regex", Request{Endpoint: "/v1/users/{id}"}, "all,anon,users"},
		{"endpoint regex anchored", Request{Endpoint: "/v1/users/{id}/x"}, "all,anon"},
		{"http ignores domain rules", Request{Key: "k"}, "all,keyed,any-key-glob"},
		{"domain", Request{Key: "k", Domain: "edge"}, "all,keyed,any-key-glob,edge"},
		{"other domain", Request{Key: "k", Domain: "other"}, "all,keyed,any-key-glob"},
		{"descriptor partial", Request{Key: "k", Domain: "edge", Descriptor: map[string]string{"destination": "payments"}}, "all,keyed,any-key-glob,edge,desc"},
		{"descriptor all pairs", Request{Key: "k", Domain: "edge", Descriptor: map[string]string{"destination": "payments", "plan": "gold", "x": "y"}}, "all,keyed,any-key-glob,edge,edge-pay,desc"},
		{"descriptor value differs", Request{Key: "k", Descriptor: map[string]string{"destination": "orders"}}, "all,keyed,any-key-glob"},
		{"descriptor in http domain", Request{Key: "k", Descriptor: map[string]string{"destination": "payments", "plan": "gold"}}, "all,keyed,any-key-glob,desc"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := ids(rs.Match(withIP(tt.req), nil)); got != tt.want {
				t.Errorf("Match = %s, want %s", got, tt.want)
			}
		})
	}
}

// TestMatchWithoutIP: a request without a client IP matches no rule counted
// per IP: no ip-scope rule, and for an
// anonymous request no key- or tenant-scope rule either, which would count
// it per IP; global-scope rules still apply.
func TestMatchWithoutIP(t *testing.T) {
	t.Parallel()
	rs := mustLoad(t, `
rules:
  - {id: key, capacity: 10, rate: 10/1m}
  - {id: tenant, scope: tenant, capacity: 10, rate: 10/1m}
  - {id: ip, scope: ip, capacity: 10, rate: 10/1m}
  - {id: anon-ip, scope: ip, match: {anonymous: true}, capacity: 10, rate: 10/1m}
  - {id: global, scope: global, capacity: 10, rate: 10/1m}
`)
	tests := []struct {
		name string
		req  Request
		want string
	}{
		{"keyed with IP", Request{Key: "k", KeyID: "kid", Tenant: "kid", IP: clientIP}, "key,tenant,ip,global"},
		{"keyed without IP", Request{Key: "k", KeyID: "kid", Tenant: "kid"}, "key,tenant,global"},
		{"anonymous with IP", Request{IP: clientIP}, "key,tenant,ip,anon-ip,global"},
		{"anonymous without IP", Request{}, "global"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := ids(rs.Match(&tt.req, nil)); got != tt.want {
				t.Errorf("Match = %s, want %s", got, tt.want)
			}
		})
	}
}

const replaceRules = `
rules:
  - {id: tier-default, match: {tier: pro}, capacity: 100, rate: 100/1m}
  - {id: vip, match: {api_key: "sk_vip_*"}, capacity: 1000, rate: 1000/1m, replaces: [tier-default]}
  - {id: a, match: {endpoint: "^/a"}, capacity: 1, rate: 1/s, replaces: [b]}
  - {id: b, match: {endpoint: "^/a/b"}, capacity: 1, rate: 1/s, replaces: [c]}
  - {id: c, match: {endpoint: "/c$"}, capacity: 1, rate: 1/s}
  - {id: shadow-old, match: {endpoint: "^/s"}, capacity: 1, rate: 1/s, shadow: true}
  - {id: shadow-new, match: {endpoint: "^/s"}, capacity: 1, rate: 1/s, shadow: true, replaces: [shadow-old]}
  - {id: enforced-over-shadow, match: {endpoint: "^/s/e"}, capacity: 1, rate: 1/s, replaces: [shadow-new]}
  - {id: d1, match: {endpoint: "^/d"}, capacity: 1, rate: 1/s, replaces: [d3]}
  - {id: d2, match: {endpoint: "^/d"}, capacity: 1, rate: 1/s, replaces: [d3, d3]}
  - {id: d3, match: {endpoint: "^/d"}, capacity: 1, rate: 1/s}
`

func TestMatchReplaces(t *testing.T) {
	t.Parallel()
	rs := mustLoad(t, replaceRules)
	tests := []struct {
		name string
		req  Request
		want string
	}{
		{"tier default", Request{Key: "sk_1", Tier: "pro"}, "tier-default"},
		{"vip replaces the tier default", Request{Key: "sk_vip_1", Tier: "pro"}, "vip"},
		{"vip alone", Request{Key: "sk_vip_1", Tier: "free"}, "vip"},
		{"a and b: a displaces b", Request{Endpoint: "/a/b"}, "a"},
		// not transitive: a replaces b and b replaces c, but b does not match,
		// so c stays although a matches.
		{"not transitive", Request{Endpoint: "/a/c"}, "a,c"},
		// b matches (displaced itself by a), and a rule displaced by another
		// still displaces what it lists.
		{"chain", Request{Endpoint: "/a/b/c"}, "a"},
		{"b displaces c", Request{Endpoint: "/x/c"}, "c"},
		{"shadow replaces shadow", Request{Endpoint: "/s"}, "shadow-new"},
		{"enforced replaces shadow", Request{Endpoint: "/s/e"}, "enforced-over-shadow"},
		{"two displacers", Request{Endpoint: "/d"}, "d1,d2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := ids(rs.Match(withIP(tt.req), nil)); got != tt.want {
				t.Errorf("Match = %s, want %s", got, tt.want)
			}
		})
	}
	if got := rs.Rule("d2").Replaces; !slices.Equal(got, []string{"d3"}) {
		t.Errorf("Replaces = %v, want [d3]", got)
	}
}

// TestMatchManyRules covers rules beyond Match's stack bitset, where
// displacers are re-evaluated.
func TestMatchManyRules(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	b.WriteString("rules:\n")
	n := bitsetRules + 100
	for i := range n {
		fmt.Fprintf(&b, "  - {id: r%d, match: {endpoint: '^/r%d$'}, capacity: 1, rate: 1/s}\n", i, i%7)
	}
	fmt.Fprintf(&b, "  - {id: late, match: {endpoint: '^/r3$'}, capacity: 1, rate: 1/s, replaces: [r3, r%d]}\n", n-2)
	fmt.Fprintf(&b, "  - {id: early-victim, match: {endpoint: '^/z'}, capacity: 1, rate: 1/s}\n")
	fmt.Fprintf(&b, "  - {id: late2, match: {endpoint: '^/z'}, capacity: 1, rate: 1/s, replaces: [early-victim]}\n")
	rs := mustLoad(t, b.String())
	got := rs.Match(withIP(Request{Endpoint: "/r3"}), nil)
	for _, r := range got {
		if r.ID == "r3" {
			t.Error("r3 not displaced")
		}
	}
	if got[len(got)-1].ID != "late" {
		t.Errorf("late missing: %s", ids(got))
	}
	if got := ids(rs.Match(withIP(Request{Endpoint: "/z"}), nil)); got != "late2" {
		t.Errorf("Match(/z) = %s, want late2", got)
	}
	// r(n-2) has endpoint /r(n-2 mod 7), which late does not match.
	victim := fmt.Sprintf("/r%d", (n-2)%7)
	if victim == "/r3" {
		t.Fatal("bad test setup")
	}
	if got := rs.Match(withIP(Request{Endpoint: victim}), nil); !slices.ContainsFunc(got, func(r *Rule) bool { return r.Index == n-2 }) {
		t.Errorf("r%d displaced by a rule that does not match", n-2)
	}
}

func TestMatchAppends(t *testing.T) {
	t.Parallel()
	rs := mustLoad(t, replaceRules)
	sentinel := &Rule{ID: "caller"}
	dst := make([]*Rule, 1, 8)
	dst[0] = sentinel
	got := rs.Match(withIP(Request{Endpoint: "/a/b"}), dst)
	if ids(got) != "caller,a" || got[0] != sentinel {
		t.Errorf("Match = %s", ids(got))
	}
	if full := got[:cap(got)]; full[2] != nil {
		t.Error("a displaced rule is left in dst's spare capacity")
	}
}

func TestNoAllocations(t *testing.T) {
	rs := mustLoad(t, matchRules+`
  - {id: vip, match: {api_key: "sk_free_*"}, capacity: 5, rate: 5/1m, replaces: [free]}
`)
	req := &Request{Key: "sk_free_1", Tier: "free", Endpoint: "/v1/orders/{id}/items", Method: "post",
		Domain: "edge", Descriptor: map[string]string{"destination": "payments", "plan": "gold"}}
	dst := make([]*Rule, 0, 32)
	checks := map[string]func(){
		"Match":     func() { dst = rs.Match(req, dst[:0]) },
		"Identify":  func() { rs.Identify("sk_free_1"); rs.Identify("sk_prod_acme_1") },
		"Listed":    func() { rs.Listed("sk_both_1"); rs.Listed("sk_exact") },
		"Normalize": func() { rs.Normalize("/v1/orders/7/items?x=1"); rs.Normalize("/nope") },
		"ParamsFor": func() { rs.Rule("free").ParamsFor("sk_free_1", "AAAAAAAAAAAAAAAAAAAAAA") },
	}
	for name, f := range checks {
		if n := testing.AllocsPerRun(200, f); n != 0 {
			t.Errorf("%s allocates %v times per call", name, n)
		}
	}
	if ids(dst) != "all,keyed,any-key-glob,posts,edge,edge-pay,desc,vip" {
		t.Errorf("benchmark request matched %s", ids(dst))
	}
}

func BenchmarkMatch(b *testing.B) {
	rs := mustLoad(b, matchRules+`
  - {id: vip, match: {api_key: "sk_free_*"}, capacity: 5, rate: 5/1m, replaces: [free]}
`)
	req := &Request{Key: "sk_free_1", Tier: "free", Endpoint: rs.Normalize("/v1/orders/7/items"), Method: "POST"}
	if got := ids(rs.Match(req, nil)); got != "all,keyed,any-key-glob,posts,vip" {
		b.Fatalf("benchmark request matched %s", got)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		dst := make([]*Rule, 0, 16)
		for pb.Next() {
			dst = rs.Match(req, dst[:0])
		}
	})
}

func BenchmarkNormalize(b *testing.B) {
	rs := mustLoad(b, matchRules)
	if rs.Normalize("/v1/orders/7/items?a=1") != "/v1/orders/{id}/items" {
		b.Fatal("route does not match")
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			rs.Normalize("/v1/orders/7/items?a=1")
		}
	})
}

func BenchmarkIdentify(b *testing.B) {
	rs := mustLoad(b, matchRules)
	if info, _ := rs.Identify("sk_free_1"); info.Tier != "free" {
		b.Fatal("tier pattern does not match")
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			rs.Identify("sk_free_1")
		}
	})
}
