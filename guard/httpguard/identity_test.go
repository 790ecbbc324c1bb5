package httpguard

import (
	"errors"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/guard"
)

func TestParseKeySource(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in, want string // want "" means an error
	}{
		{"bearer", "bearer"},
		{"Bearer", "bearer"},
		{"header:X-API-Key", "header:X-API-Key"},
		{"HEADER:x-auth-key", "header:x-auth-key"},
		{"query:api_key", "query:api_key"},
		{"Query:key", "query:key"},
		{"", ""},
		{"cookie:session", ""},
		{"header:", ""},
		{"header:X API Key", ""},
		{"header:X-Key\n", ""},
		{"query:", ""},
		{"query:a&b", ""},
		{"query:a=b", ""},
		{"query:a b", ""},
		{"bearer:x", ""},
		{"basic", ""},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			ks, err := ParseKeySource(tt.in)
			if tt.want == "" {
				if !errors.Is(err, ErrInvalidKeySource) {
					t.Fatalf("ParseKeySource(%q) = %v, %v; want ErrInvalidKeySource", tt.in, ks, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ks.String() != tt.want {
				t.Fatalf("ParseKeySource(%q) = %q, want %q", tt.in, ks, tt.want)
			}
			var round KeySource
			text, _ := ks.MarshalText()
			if err := round.UnmarshalText(text); err != nil || round != ks {
				t.Fatalf("text round trip of %q = %v, %v", ks, round, err)
			}
		})
	}
}

func TestDefaultKeySources(t *testing.T) {
	t.Parallel()
	var got []string
	for _, ks := range DefaultKeySources() {
		got = append(got, ks.String())
	}
	if strings.Join(got, " ") != "header:X-API-Key bearer" {
		t.Errorf("DefaultKeySources = %q", got)
	}
	// The result is a copy: changing it changes no default.
	DefaultKeySources()[0] = KeySource{}
	if DefaultKeySources()[0].String() != "header:X-API-Key" {
		t.Error("DefaultKeySources shares its storage")
	}
}

func mustSources(t testing.TB, ss ...string) []KeySource {
	t.Helper()
	out := make([]KeySource, len(ss))
	for i, s := range ss {
		ks, err := ParseKeySource(s)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = ks
	}
	return out
}

func TestExtract(t *testing.T) {
	t.Parallel()
	jwt := "eyJ" + strings.Repeat("a", 297) // 300 bytes: not a key
	long := "sk_" + strings.Repeat("k", 297)
	proxies := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
	trusted := &Identity{
		TrustedProxies: proxies,
		TenantHeader:   "X-Tenant", TierHeader: "X-Tier", CostHeader: "X-Cost",
	}
	withQuery := &Identity{Sources: mustSources(t, "header:X-API-Key", "bearer", "query:api_key")}

	type want struct {
		key, ip, tenant, tier string
		cost                  int64
		err                   error
		direct                bool
	}
	tests := []struct {
		name   string
		id     *Identity
		remote string
		target string
		header [][2]string // added in order
		want   want
	}{
		{
			name: "api key header", remote: "192.0.2.1:5555",
			header: [][2]string{{"X-API-Key", "sk_prod_acme_1"}},
			want:   want{key: "sk_prod_acme_1", ip: "192.0.2.1", direct: true},
		},
		{
			name: "bearer", remote: "192.0.2.1:5555",
			header: [][2]string{{"Authorization", "Bearer sk_free_2"}},
			want:   want{key: "sk_free_2", ip: "192.0.2.1", direct: true},
		},
		{
			name: "bearer scheme case-insensitive", remote: "192.0.2.1:5555",
			header: [][2]string{{"Authorization", "bEARER   sk_free_2"}},
			want:   want{key: "sk_free_2", ip: "192.0.2.1", direct: true},
		},
		{
			name: "header before bearer", remote: "192.0.2.1:5555",
			header: [][2]string{{"Authorization", "Bearer sk_b"}, {"X-API-Key", "sk_a"}},
			want:   want{key: "sk_a", ip: "192.0.2.1", direct: true},
		},
		{
			name: "empty header falls through", remote: "192.0.2.1:5555",
			header: [][2]string{{"X-API-Key", ""}, {"Authorization", "Bearer sk_b"}},
			want:   want{key: "sk_b", ip: "192.0.2.1", direct: true},
		},
		{
			name: "basic auth is no key", remote: "192.0.2.1:5555",
			header: [][2]string{{"Authorization", "Basic dXNlcjpwYXNz"}},
			want:   want{ip: "192.0.2.1", direct: true},
		},
		{
			name: "jwt falls through to anonymous", remote: "192.0.2.1:5555",
			header: [][2]string{{"Authorization", "Bearer " + jwt}},
			want:   want{ip: "192.0.2.1", direct: true},
		},
		{
			name: "jwt falls through to query", id: withQuery, remote: "192.0.2.1:5555", target: "/v1/x?api_key=sk_q",
			header: [][2]string{{"Authorization", "Bearer " + jwt}},
			want:   want{key: "sk_q", ip: "192.0.2.1", direct: true},
		},
		{
			name: "bearer with space falls through", id: withQuery, remote: "192.0.2.1:5555", target: "/?api_key=sk_q",
			header: [][2]string{{"Authorization", "Bearer a b"}},
			want:   want{key: "sk_q", ip: "192.0.2.1", direct: true},
		},
		{
			name: "300-byte api key", remote: "192.0.2.1:5555",
			header: [][2]string{{"X-API-Key", long}},
			want:   want{ip: "192.0.2.1", err: ErrInvalidKey, direct: true},
		},
		{
			name: "256-byte api key", remote: "192.0.2.1:5555",
			header: [][2]string{{"X-API-Key", long[:256]}},
			want:   want{key: long[:256], ip: "192.0.2.1", direct: true},
		},
		{
			name: "custom max length", id: &Identity{MaxKeyLen: 8}, remote: "192.0.2.1:5555",
			header: [][2]string{{"X-API-Key", "sk_123456"}},
			want:   want{ip: "192.0.2.1", err: ErrInvalidKey, direct: true},
		},
		{
			name: "control character", remote: "192.0.2.1:5555",
			header: [][2]string{{"X-API-Key", "sk_\x01bad"}},
			want:   want{ip: "192.0.2.1", err: ErrInvalidKey, direct: true},
		},
		{
			name: "DEL", remote: "192.0.2.1:5555",
			header: [][2]string{{"X-API-Key", "sk_\x7fbad"}},
			want:   want{ip: "192.0.2.1", err: ErrInvalidKey, direct: true},
		},
		{
			name: "inner space", remote: "192.0.2.1:5555",
			header: [][2]string{{"X-API-Key", "sk_a b"}},
			want:   want{ip: "192.0.2.1", err: ErrInvalidKey, direct: true},
		},
		{
			// Valid UTF-8 is a key on every surface (guard.ValidKey).
			name: "UTF-8", remote: "192.0.2.1:5555",
			header: [][2]string{{"X-API-Key", "sk_é"}},
			want:   want{key: "sk_é", ip: "192.0.2.1", direct: true},
		},
		{
			name: "invalid UTF-8", remote: "192.0.2.1:5555",
			header: [][2]string{{"X-API-Key", "sk_\xff"}},
			want:   want{ip: "192.0.2.1", err: ErrInvalidKey, direct: true},
		},
		{
			name: "C1 control", remote: "192.0.2.1:5555",
			header: [][2]string{{"X-API-Key", "sk_\u0085"}},
			want:   want{ip: "192.0.2.1", err: ErrInvalidKey, direct: true},
		},
		{
			name: "C1 control in a query key", id: withQuery, remote: "192.0.2.1:5555", target: "/?api_key=sk_%C2%85",
			want: want{ip: "192.0.2.1", err: ErrInvalidKey, direct: true},
		},
		{
			name: "UTF-8 query key", id: withQuery, remote: "192.0.2.1:5555", target: "/?api_key=sk_%C3%A9",
			want: want{key: "sk_é", ip: "192.0.2.1", direct: true},
		},
		{
			name: "UTF-8 bearer", remote: "192.0.2.1:5555",
			header: [][2]string{{"Authorization", "Bearer sk_é"}},
			want:   want{key: "sk_é", ip: "192.0.2.1", direct: true},
		},
		{
			name: "bearer with a C1 control falls through", id: withQuery, remote: "192.0.2.1:5555", target: "/?api_key=sk_q",
			header: [][2]string{{"Authorization", "Bearer sk_\u0085"}},
			want:   want{key: "sk_q", ip: "192.0.2.1", direct: true},
		},
		{
			name: "key header twice", remote: "192.0.2.1:5555",
			header: [][2]string{{"X-API-Key", "sk_a"}, {"X-API-Key", "sk_b"}},
			want:   want{ip: "192.0.2.1", err: ErrInvalidKey, direct: true},
		},
		{
			name: "query key", id: withQuery, remote: "192.0.2.1:5555", target: "/v1/x?a=1&api_key=sk%5Fq&b=2",
			want: want{key: "sk_q", ip: "192.0.2.1", direct: true},
		},
		{
			name: "query name escaped", id: withQuery, remote: "192.0.2.1:5555", target: "/?api%5Fkey=sk_q",
			want: want{key: "sk_q", ip: "192.0.2.1", direct: true},
		},
		{
			name: "query NUL", id: withQuery, remote: "192.0.2.1:5555", target: "/?api_key=sk%00q",
			want: want{ip: "192.0.2.1", err: ErrInvalidKey, direct: true},
		},
		{
			name: "query plus is a space", id: withQuery, remote: "192.0.2.1:5555", target: "/?api_key=sk+q",
			want: want{ip: "192.0.2.1", err: ErrInvalidKey, direct: true},
		},
		{
			name: "query bad escape", id: withQuery, remote: "192.0.2.1:5555", target: "/?api_key=sk%zz",
			want: want{ip: "192.0.2.1", err: ErrInvalidKey, direct: true},
		},
		{
			name: "query twice", id: withQuery, remote: "192.0.2.1:5555", target: "/?api_key=a&api_key=b",
			want: want{ip: "192.0.2.1", err: ErrInvalidKey, direct: true},
		},
		{
			name: "query empty falls through", id: withQuery, remote: "192.0.2.1:5555", target: "/?api_key=",
			want: want{ip: "192.0.2.1", direct: true},
		},
		{
			name: "trusted auth header", id: &Identity{Sources: mustSources(t, "header:X-Auth-Key")}, remote: "192.0.2.1:5555",
			header: [][2]string{{"X-API-Key", "sk_ignored"}, {"X-Auth-Key", "sk_auth"}},
			want:   want{key: "sk_auth", ip: "192.0.2.1", direct: true},
		},
		{
			name: "xff from untrusted peer ignored", id: trusted, remote: "203.0.113.50:1234",
			header: [][2]string{{"X-Forwarded-For", "1.2.3.4"}, {"X-Tenant", "evil"}, {"X-Tier", "enterprise"}, {"X-Cost", "1"}},
			want:   want{ip: "203.0.113.50", direct: true},
		},
		{
			name: "no trusted proxies configured", remote: "10.0.0.1:1234",
			header: [][2]string{{"X-Forwarded-For", "1.2.3.4"}},
			want:   want{ip: "10.0.0.1", direct: true},
		},
		{
			name: "trusted chain walked from the right", id: trusted, remote: "10.0.0.1:1234",
			header: [][2]string{{"X-Forwarded-For", "1.1.1.1, 198.51.100.7, 10.2.3.4"}},
			want:   want{ip: "198.51.100.7"},
		},
		{
			name: "several xff lines", id: trusted, remote: "10.0.0.1:1234",
			header: [][2]string{{"X-Forwarded-For", "1.1.1.1, 198.51.100.7"}, {"X-Forwarded-For", "10.9.9.9,10.8.8.8"}},
			want:   want{ip: "198.51.100.7"},
		},
		{
			name: "every hop trusted", id: trusted, remote: "10.0.0.1:1234",
			header: [][2]string{{"X-Forwarded-For", "10.0.0.3, 10.0.0.2"}},
			want:   want{ip: "10.0.0.3"},
		},
		{
			name: "trusted peer without xff", id: trusted, remote: "10.0.0.1:1234",
			want: want{ip: "10.0.0.1"},
		},
		{
			name: "malformed hop stops at last good", id: trusted, remote: "10.0.0.1:1234",
			header: [][2]string{{"X-Forwarded-For", "198.51.100.7, garbage, 10.0.0.2"}},
			want:   want{ip: "10.0.0.2"},
		},
		{
			name: "malformed first hop gives peer", id: trusted, remote: "10.0.0.1:1234",
			header: [][2]string{{"X-Forwarded-For", "198.51.100.7, unknown"}},
			want:   want{ip: "10.0.0.1"},
		},
		{
			name: "empty elements skipped", id: trusted, remote: "10.0.0.1:1234",
			header: [][2]string{{"X-Forwarded-For", "198.51.100.7,, 10.0.0.2 ,"}},
			want:   want{ip: "198.51.100.7"},
		},
		{
			name: "hops with ports", id: trusted, remote: "10.0.0.1:1234",
			header: [][2]string{{"X-Forwarded-For", "[2001:db8::9]:443, 10.0.0.2:8080"}},
			want:   want{ip: "2001:db8::9"},
		},
		{
			name: "ipv6 peer", id: trusted, remote: "[2001:db8::1]:443",
			header: [][2]string{{"X-Forwarded-For", "1.2.3.4"}},
			want:   want{ip: "2001:db8::1", direct: true},
		},
		{
			name: "ipv6 trusted proxy", id: trusted, remote: "[fd00::1]:443",
			header: [][2]string{{"X-Forwarded-For", "2001:db8::5, fd00::7"}},
			want:   want{ip: "2001:db8::5"},
		},
		{
			name: "ipv4-mapped peer unmapped", id: trusted, remote: "[::ffff:10.0.0.1]:80",
			header: [][2]string{{"X-Forwarded-For", "::ffff:203.0.113.5"}},
			want:   want{ip: "203.0.113.5"},
		},
		{
			name: "mapped untrusted peer", remote: "[::ffff:192.0.2.9]:80",
			want: want{ip: "192.0.2.9", direct: true},
		},
		{
			name: "zone dropped", remote: "[fe80::1%eth0]:80",
			want: want{ip: "fe80::1", direct: true},
		},
		{
			name: "mapped trusted prefix", id: &Identity{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("::ffff:10.0.0.0/104")}},
			remote: "10.0.0.1:80", header: [][2]string{{"X-Forwarded-For", "192.0.2.3"}},
			want: want{ip: "192.0.2.3"},
		},
		{
			name: "unix socket peer", id: trusted, remote: "@",
			header: [][2]string{{"X-Forwarded-For", "1.2.3.4"}},
			want:   want{ip: "invalid IP"},
		},
		{
			name: "identity headers from trusted proxy", id: trusted, remote: "10.0.0.1:1234",
			header: [][2]string{{"X-API-Key", "sk_a"}, {"X-Tenant", "acme"}, {"X-Tier", "pro"}, {"X-Cost", "5"}},
			want:   want{key: "sk_a", ip: "10.0.0.1", tenant: "acme", tier: "pro", cost: 5},
		},
		{
			name: "cost zero", id: trusted, remote: "10.0.0.1:1234",
			header: [][2]string{{"X-Cost", "0"}},
			want:   want{ip: "10.0.0.1", err: ErrInvalidCost},
		},
		{
			name: "cost negative", id: trusted, remote: "10.0.0.1:1234",
			header: [][2]string{{"X-Cost", "-3"}},
			want:   want{ip: "10.0.0.1", err: ErrInvalidCost},
		},
		{
			name: "cost with sign", id: trusted, remote: "10.0.0.1:1234",
			header: [][2]string{{"X-Cost", "+3"}},
			want:   want{ip: "10.0.0.1", err: ErrInvalidCost},
		},
		{
			name: "cost not a number", id: trusted, remote: "10.0.0.1:1234",
			header: [][2]string{{"X-Cost", "lots"}},
			want:   want{ip: "10.0.0.1", err: ErrInvalidCost},
		},
		{
			name: "cost overflow", id: trusted, remote: "10.0.0.1:1234",
			header: [][2]string{{"X-Cost", "99999999999999999999"}},
			want:   want{ip: "10.0.0.1", err: ErrInvalidCost},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			target := tt.target
			if target == "" {
				target = "/v1/users/42"
			}
			r := &http.Request{Method: http.MethodPost, RemoteAddr: tt.remote, Header: http.Header{}}
			var err error
			if r.URL, err = url.ParseRequestURI(target); err != nil {
				t.Fatal(err)
			}
			for _, kv := range tt.header {
				r.Header[http.CanonicalHeaderKey(kv[0])] = append(r.Header[http.CanonicalHeaderKey(kv[0])], kv[1])
			}
			// A reused Request must not keep identity from before.
			req := guard.Request{Key: "stale", Tenant: "stale", Tier: "stale", Cost: 9, Domain: "kept"}
			err = tt.id.Extract(r, &req)
			if !errIs(err, tt.want.err) {
				t.Fatalf("Extract error = %v, want %v", err, tt.want.err)
			}
			if err != nil {
				for _, kv := range tt.header {
					if len(kv[1]) > 3 && strings.Contains(err.Error(), kv[1]) {
						t.Errorf("error %q quotes header value %q", err, kv[1])
					}
				}
			}
			if req.Key != tt.want.key || req.IP.String() != tt.want.ip || req.Tenant != tt.want.tenant ||
				req.Tier != tt.want.tier || req.Cost != tt.want.cost {
				t.Errorf("Extract = key %q ip %s tenant %q tier %q cost %d; want %+v",
					req.Key, req.IP, req.Tenant, req.Tier, req.Cost, tt.want)
			}
			if req.Path != r.URL.Path || req.Method != http.MethodPost || req.Domain != "kept" {
				t.Errorf("path %q method %q domain %q", req.Path, req.Method, req.Domain)
			}
			if got := tt.id.Direct(r); got != tt.want.direct {
				t.Errorf("Direct = %v, want %v", got, tt.want.direct)
			}
		})
	}
}

// TestTrusted: Trusted is whether the socket peer is a trusted proxy; a
// nil Identity and a peer that is not an IP trust nobody.
func TestTrusted(t *testing.T) {
	t.Parallel()
	id := &Identity{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("::1/128")}}
	for _, tt := range []struct {
		id     *Identity
		remote string
		want   bool
	}{
		{id, "10.1.2.3:80", true},
		{id, "[::ffff:10.1.2.3]:80", true},
		{id, "[::1]:80", true},
		{id, "11.0.0.1:80", false},
		{id, "@unix", false},
		{nil, "10.1.2.3:80", false},
		{&Identity{}, "10.1.2.3:80", false},
	} {
		if got := tt.id.Trusted(&http.Request{RemoteAddr: tt.remote}); got != tt.want {
			t.Errorf("Trusted(%s) with %v = %v, want %v", tt.remote, tt.id, got, tt.want)
		}
		ap, _ := netip.ParseAddrPort(tt.remote)
		if got := tt.id.TrustedAddr(ap.Addr()); got != tt.want {
			t.Errorf("TrustedAddr(%s) with %v = %v, want %v", tt.remote, tt.id, got, tt.want)
		}
	}
}

func BenchmarkExtract(b *testing.B) {
	id := &Identity{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
	r := &http.Request{Method: "GET", RemoteAddr: "10.0.0.1:1234", URL: &url.URL{Path: "/v1/search"}, Header: http.Header{
		"X-Api-Key":       {"sk_prod_acme_1"},
		"X-Forwarded-For": {"198.51.100.7, 10.0.0.2"},
	}}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		var req guard.Request
		n := 0
		for pb.Next() {
			if err := id.Extract(r, &req); err != nil {
				b.Fatal(err)
			}
			n++
		}
		if n > 0 && (req.Key != "sk_prod_acme_1" || req.IP.String() != "198.51.100.7") {
			b.Fatalf("Extract = %+v", req)
		}
	})
}

func FuzzExtract(f *testing.F) {
	f.Add("10.0.0.1:80", "1.2.3.4, 10.0.0.2", "sk_a", "Bearer sk_b", "api_key=sk_c", "3", "acme")
	f.Add("[::ffff:10.0.0.1]:80", "[2001:db8::1]:80,,garbage", "", "Bearer "+strings.Repeat("x", 300), "api_key=%zz", "0", "")
	f.Add("@", "", "sk_\x00", "bearer", "api_key=a&api_key=b", "-1", "t")
	f.Add("[fe80::1%eth0]:1", "fd00::1, ::ffff:1.2.3.4", strings.Repeat("k", 257), "Bearer\t", "api%5Fkey=%41", "+1", "\x7f")
	id := &Identity{
		Sources:        mustSources(f, "header:X-API-Key", "bearer", "query:api_key"),
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")},
		TenantHeader:   "X-Tenant", CostHeader: "X-Cost",
	}
	f.Fuzz(func(t *testing.T, remote, xff, apiKey, auth, query, cost, tenant string) {
		r := &http.Request{Method: "GET", RemoteAddr: remote, URL: &url.URL{Path: "/", RawQuery: query}, Header: http.Header{}}
		for name, v := range map[string]string{"X-Forwarded-For": xff, "X-Api-Key": apiKey, "Authorization": auth,
			"X-Cost": cost, "X-Tenant": tenant} {
			if v != "" {
				r.Header[name] = strings.Split(v, "\n")
			}
		}
		var req guard.Request
		err := id.Extract(r, &req)
		switch {
		case err == nil:
		case errors.Is(err, ErrInvalidKey), errors.Is(err, ErrInvalidCost):
			return
		default:
			t.Fatalf("Extract error %v is neither ErrInvalidKey nor ErrInvalidCost", err)
		}
		if len(req.Key) > DefaultMaxKeyLen || !guard.ValidKey(req.Key) {
			t.Fatalf("Extract accepted key %q", req.Key)
		}
		if req.IP.IsValid() && (req.IP.Is4In6() || req.IP.Zone() != "") {
			t.Fatalf("Extract IP %s not normalised", req.IP)
		}
		if req.Cost < 0 {
			t.Fatalf("Extract cost %d", req.Cost)
		}
		if !id.trusted(peerAddr(remote)) && (req.Tenant != "" || req.Cost != 0 || req.IP != peerAddr(remote)) {
			t.Fatalf("untrusted peer %q set tenant %q cost %d ip %s", remote, req.Tenant, req.Cost, req.IP)
		}
		_ = id.Direct(r)
	})
}
