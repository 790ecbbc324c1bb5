package gateway_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/gateway"
)

// /v1/authz, the forward-auth form of a check: the client's
// request as a proxy forwards it, decided as the proxy surface would
// decide it, answered as the proxy should answer.

const authzRules = `
blocklist: ["sk_revoked_*"]
rules:
  - {id: five, match: {api_key: "sk_five_*"}, algorithm: token_bucket, capacity: 5, rate: 5/1h}
  - {id: search, match: {api_key: "sk_search_*", endpoint: "^/v1/search$"}, algorithm: token_bucket, capacity: 100, rate: 100/1h}
  - {id: posts, match: {api_key: "sk_post_*", methods: [POST]}, algorithm: token_bucket, capacity: 100, rate: 100/1h}
  - {id: per-ip, scope: ip, match: {endpoint: "^/ip/"}, algorithm: fixed_window, limit: 1, window: 1h}
  - {id: costly, match: {api_key: "sk_cost_*"}, algorithm: token_bucket, capacity: 100, rate: 100/1h}
`

// authzConfig is the identity of the /v1/authz tests: the query key source
// and a cost header on top of the defaults.
func authzConfig(c *gateway.Config) {
	c.Identity.KeySources = []string{"header:X-API-Key", "bearer", "query:api_key"}
	c.Identity.CostHeader = "X-Cost"
}

// proxyToken is the api_token of authzTokenConfig's gateways.
const proxyToken = "proxy-token-0123456789"

// authzTokenConfig is authzConfig with an api_token, which proxies that
// are not trusted prove themselves with.
func authzTokenConfig(c *gateway.Config) {
	authzConfig(c)
	c.APIToken = proxyToken
}

// authz sends method /v1/authz to g's check API with the header pairs hdr
// (name, value, ...).
func (e *env) authz(g *runningGateway, method string, hdr ...string) (*http.Response, []byte) {
	e.t.Helper()
	req, err := http.NewRequest(method, "http://"+g.addrs.API+"/v1/authz", nil)
	if err != nil {
		e.t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	return e.do(req)
}

// errorCode returns the `error.code` of a JSON error body.
func errorCode(t *testing.T, body []byte) string {
	t.Helper()
	var eb errorBody
	if err := json.Unmarshal(body, &eb); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	return eb.Error.Code
}

// TestAuthzDecides: five admissions with the rate-limit headers, then a 429
// with Retry-After and the JSON body (or problem+json), whatever the
// method of the call; a blocked key is 403 without rate-limit headers; and
// the forward-auth check shares its counter with the proxy.
func TestAuthzDecides(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rules: authzRules, config: authzConfig})
	key := uniqueKey("sk_five_")
	for i, method := range []string{"GET", "POST", "HEAD", "PUT", "GET"} {
		resp, body := e.authz(e.gw, method, "X-Forwarded-Uri", "/v1/users/42", "X-Forwarded-Method", "GET", "X-API-Key", key)
		if resp.StatusCode != http.StatusOK || len(body) != 0 {
			t.Fatalf("%s call %d: %d %q", method, i, resp.StatusCode, body)
		}
		h := resp.Header
		if headerInt(t, h, "X-RateLimit-Limit") != 5 || headerInt(t, h, "X-RateLimit-Remaining") != int64(4-i) ||
			headerInt(t, h, "X-RateLimit-Used") != int64(i+1) || h.Get("X-RateLimit-Resource") != "five" ||
			headerInt(t, h, "X-RateLimit-Reset") <= 0 || h.Get("Retry-After") != "" {
			t.Fatalf("call %d headers: %v", i, h)
		}
		if sfList(t, h, "RateLimit")["five"]["r"] != int64(4-i) || sfList(t, h, "RateLimit-Policy")["five"]["q"] != 5 {
			t.Fatalf("call %d RateLimit fields: %v", i, h)
		}
	}
	resp, body := e.authz(e.gw, "GET", "X-Forwarded-Uri", "/v1/users/42", "X-API-Key", key)
	var eb rejectionBody
	if err := json.Unmarshal(body, &eb); err != nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("sixth: %d %s (%v)", resp.StatusCode, body, err)
	}
	ra := headerInt(t, resp.Header, "Retry-After")
	if ra < 1 || ra > 720 || eb.Error.Code != "RATE_LIMIT_EXCEEDED" || eb.Error.Details.Rule != "five" ||
		eb.Error.Details.RetryAfterSeconds != ra || resp.Header.Get("X-RateLimit-Remaining") != "0" ||
		resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("sixth: Retry-After %d, %v, %s", ra, resp.Header, body)
	}
	// The client's Accept, forwarded by the proxy, chooses problem+json.
	resp, body = e.authz(e.gw, "GET", "X-Forwarded-Uri", "/v1/users/42", "X-API-Key", key, "Accept", "application/problem+json")
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Content-Type") != "application/problem+json" ||
		!contains(body, `"violated-policies":["five"]`) {
		t.Fatalf("problem+json: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	// The proxy surface counts on the same counter.
	if resp, _ := e.proxyGet("/v1/users/42", key); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("proxy after authz used the quota: %d", resp.StatusCode)
	}

	resp, body = e.authz(e.gw, "GET", "X-Forwarded-Uri", "/v1/x", "X-API-Key", "sk_revoked_1")
	if resp.StatusCode != http.StatusForbidden || errorCode(t, body) != "KEY_BLOCKED" || resp.Header.Get("X-RateLimit-Limit") != "" {
		t.Fatalf("blocked key: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	// No rule: admitted without headers.
	resp, _ = e.authz(e.gw, "GET", "X-Forwarded-Uri", "/v1/x", "X-API-Key", "sk_nobody")
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-RateLimit-Limit") != "" || resp.Header.Get("RateLimit") != "" {
		t.Fatalf("no rule: %d %v", resp.StatusCode, resp.Header)
	}

	// Every call is a decision in tollgate_checks_total, as on the check API.
	if n := e.metric(e.gw, "tollgate_checks_total", `decision="allowed"`, `rule="five"`); n != 5 {
		t.Errorf("allowed decisions of rule five: %v, want 5", n)
	}
	if n := e.metric(e.gw, "tollgate_checks_total", `decision="rejected"`, `rule="five"`); n != 3 {
		t.Errorf("rejected decisions of rule five: %v, want 3 (two authz, one proxy)", n)
	}
	if n := e.metric(e.gw, "tollgate_checks_total", `decision="blocked"`); n != 1 {
		t.Errorf("blocked decisions: %v, want 1", n)
	}
}

// TestAuthzRequest: the method, path, query and key are the forwarded
// request's, read by the proxy's identity code; a path is normalised as on
// every surface, and one that cannot be is 400 INVALID_PATH.
func TestAuthzRequest(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rules: authzRules, config: authzConfig})
	resource := func(resp *http.Response) string { return resp.Header.Get("X-RateLimit-Resource") }

	t.Run("method", func(t *testing.T) {
		t.Parallel()
		key := uniqueKey("sk_post_")
		tests := []struct {
			name   string
			method string
			hdr    []string
			want   string // the deciding rule: "posts" when the method was POST
		}{
			{"X-Forwarded-Method", "GET", []string{"X-Forwarded-Method", "POST"}, "posts"},
			{"X-Original-Method", "GET", []string{"X-Original-Method", "POST"}, "posts"},
			{"X-Forwarded-Method first", "GET", []string{"X-Forwarded-Method", "GET", "X-Original-Method", "POST"}, ""},
			{"the call's own method without either", "POST", nil, "posts"},
			{"the call's method does not count when forwarded", "POST", []string{"X-Forwarded-Method", "GET"}, ""},
		}
		for _, tt := range tests {
			resp, body := e.authz(e.gw, tt.method, append([]string{"X-Forwarded-Uri", "/v1/x", "X-API-Key", key}, tt.hdr...)...)
			if resp.StatusCode != http.StatusOK || resource(resp) != tt.want {
				t.Errorf("%s: %d resource %q, want %q; %s", tt.name, resp.StatusCode, resource(resp), tt.want, body)
			}
		}
		resp, body := e.authz(e.gw, "GET", "X-Forwarded-Uri", "/v1/x", "X-Forwarded-Method", "GET /", "X-API-Key", key)
		if resp.StatusCode != http.StatusBadRequest || errorCode(t, body) != "INVALID_REQUEST" {
			t.Errorf("bad method: %d %s", resp.StatusCode, body)
		}
	})

	t.Run("path", func(t *testing.T) {
		t.Parallel()
		key := uniqueKey("sk_search_")
		// Every spelling of /v1/search, with or without a query, is one
		// endpoint and one counter; the rule's regex is anchored at $, so
		// a query taken into the endpoint would match nothing.
		spellings := [][]string{
			{"X-Forwarded-Uri", "/v1/search"},
			{"X-Forwarded-Uri", "/v1/search?q=tollgate&page=2"},
			{"X-Original-URI", "//v1/./search/"},
			{"X-Original-URI", "/v1/%73earch?q=%2F"},
			{"X-Forwarded-Uri", "/v1/x/../search", "X-Original-URI", "/elsewhere"},
		}
		for i, sp := range spellings {
			resp, body := e.authz(e.gw, "GET", append(sp, "X-API-Key", key)...)
			if resp.StatusCode != http.StatusOK || resource(resp) != "search" || headerInt(t, resp.Header, "X-RateLimit-Remaining") != int64(99-i) {
				t.Fatalf("%v: %d %v %s", sp, resp.StatusCode, resp.Header, body)
			}
		}
		for _, tt := range []struct{ uri, code string }{
			{"/v1/../../etc/passwd", "INVALID_PATH"},
			{"/v1/a%2fb", "INVALID_PATH"},
			{"/v1/a%5Cb?x=1", "INVALID_PATH"},
			{"/v1/%zz", "INVALID_PATH"},
			{"v1/relative", "INVALID_PATH"},
			{"", "INVALID_REQUEST"},
		} {
			resp, body := e.authz(e.gw, "GET", "X-Forwarded-Uri", tt.uri, "X-API-Key", key)
			if resp.StatusCode != http.StatusBadRequest || errorCode(t, body) != tt.code {
				t.Errorf("uri %q: %d %s, want 400 %s", tt.uri, resp.StatusCode, body, tt.code)
			}
		}
	})

	t.Run("key sources", func(t *testing.T) {
		t.Parallel()
		// The query: source reads the forwarded URI's query.
		resp, body := e.authz(e.gw, "GET", "X-Forwarded-Uri", "/v1/x?a=1&api_key=sk_revoked_q")
		if resp.StatusCode != http.StatusForbidden || errorCode(t, body) != "KEY_BLOCKED" {
			t.Fatalf("query key: %d %s", resp.StatusCode, body)
		}
		// The client's Authorization is the client's: a bearer key.
		resp, body = e.authz(e.gw, "GET", "X-Forwarded-Uri", "/v1/x", "Authorization", "Bearer sk_revoked_b")
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("bearer key: %d %s", resp.StatusCode, body)
		}
		// Sources in order: X-API-Key before the query.
		resp, _ = e.authz(e.gw, "GET", "X-Forwarded-Uri", "/v1/x?api_key=sk_revoked_q", "X-API-Key", uniqueKey("sk_five_"))
		if resp.StatusCode != http.StatusOK || resource(resp) != "five" {
			t.Fatalf("X-API-Key first: %d %v", resp.StatusCode, resp.Header)
		}
		for name, hdr := range map[string][]string{
			"control character": {"X-Forwarded-Uri", "/v1/x", "X-API-Key", "sk_\u0085x"},
			"query key twice":   {"X-Forwarded-Uri", "/v1/x?api_key=a&api_key=b"},
			"300-byte query":    {"X-Forwarded-Uri", "/v1/x?api_key=" + strings.Repeat("k", 300)},
		} {
			if resp, body := e.authz(e.gw, "GET", hdr...); resp.StatusCode != http.StatusBadRequest || errorCode(t, body) != "INVALID_KEY" {
				t.Errorf("%s: %d %s", name, resp.StatusCode, body)
			}
		}
	})
}

// TestAuthzTrust: X-Forwarded-For and the cost header count only when the
// calling proxy is a trusted proxy; with api_token set the proxy proves
// itself with X-Tollgate-Token (never Authorization, the client's) or by
// being trusted.
func TestAuthzTrust(t *testing.T) {
	t.Parallel()
	const token = proxyToken
	e := newEnv(t, envOptions{rules: authzRules, config: authzTokenConfig})
	trusted := e.startGateway(func(c *gateway.Config) {
		authzConfig(c)
		c.APIToken = token
		c.Identity.TrustedProxies = []string{"127.0.0.1/32"}
	})
	untrusted := e.gw

	t.Run("token", func(t *testing.T) {
		t.Parallel()
		key := uniqueKey("sk_five_")
		for name, hdr := range map[string][]string{
			"no token":         nil,
			"wrong token":      {"X-Tollgate-Token", token + "x"},
			"short token":      {"X-Tollgate-Token", token[:5]},
			"bearer api_token": {"Authorization", "Bearer " + token},
		} {
			resp, body := e.authz(untrusted, "GET", append([]string{"X-Forwarded-Uri", "/v1/x", "X-API-Key", key}, hdr...)...)
			if resp.StatusCode != http.StatusUnauthorized || errorCode(t, body) != "UNAUTHORIZED" {
				t.Errorf("%s: %d %s", name, resp.StatusCode, body)
			}
		}
		resp, _ := e.authz(untrusted, "GET", "X-Forwarded-Uri", "/v1/x", "X-API-Key", key, "X-Tollgate-Token", token)
		if resp.StatusCode != http.StatusOK || headerInt(t, resp.Header, "X-RateLimit-Remaining") != 4 {
			t.Fatalf("with X-Tollgate-Token: %d %v", resp.StatusCode, resp.Header)
		}
		// A trusted peer needs no token.
		resp, _ = e.authz(trusted, "GET", "X-Forwarded-Uri", "/v1/x", "X-API-Key", key)
		if resp.StatusCode != http.StatusOK || headerInt(t, resp.Header, "X-RateLimit-Remaining") != 3 {
			t.Fatalf("trusted peer: %d %v", resp.StatusCode, resp.Header)
		}
		// The rest of the check API still wants the bearer token.
		if resp, _ := e.post(untrusted, "/v1/check", `{}`, http.Header{"X-Tollgate-Token": {token}}); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("/v1/check with X-Tollgate-Token: %d", resp.StatusCode)
		}
	})

	t.Run("client IP", func(t *testing.T) {
		t.Parallel()
		// per-ip allows one request per client IP: a second request from
		// the same IP is 429, from another IP 200.
		call := func(g *runningGateway, xff string) int {
			resp, _ := e.authz(g, "GET", "X-Forwarded-Uri", "/ip/x", "X-Forwarded-For", xff, "X-Tollgate-Token", token)
			return resp.StatusCode
		}
		// Trusted: two clients behind the proxy, two counters; the walk
		// skips trusted hops from the right.
		if a, b, a2 := call(trusted, "198.51.100.1"), call(trusted, "198.51.100.2, 127.0.0.1"), call(trusted, "198.51.100.1"); a != 200 || b != 200 || a2 != 429 {
			t.Fatalf("trusted proxy: %d %d %d, want 200 200 429", a, b, a2)
		}
		// Untrusted: X-Forwarded-For is the client's say-so; the peer
		// (127.0.0.1) is the client IP, one counter.
		if a, b := call(untrusted, "198.51.100.3"), call(untrusted, "198.51.100.4"); a != 200 || b != 429 {
			t.Fatalf("untrusted proxy: %d %d, want 200 429: X-Forwarded-For was believed", a, b)
		}
	})

	t.Run("cost header", func(t *testing.T) {
		t.Parallel()
		key := uniqueKey("sk_cost_")
		remaining := func(g *runningGateway) int64 {
			resp, body := e.authz(g, "GET", "X-Forwarded-Uri", "/v1/x", "X-API-Key", key, "X-Cost", "7", "X-Tollgate-Token", token)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			return headerInt(t, resp.Header, "X-RateLimit-Remaining")
		}
		if r := remaining(untrusted); r != 99 {
			t.Fatalf("untrusted cost header believed: remaining %d, want 99", r)
		}
		if r := remaining(trusted); r != 92 {
			t.Fatalf("trusted cost header: remaining %d, want 92", r)
		}
	})
}

// TestAuthzNginxMode: with X-Tollgate-Authz-Mode: nginx every answer that
// is not an admission is a 401 carrying the real status and the JSON body
// in headers, beside the rate-limit headers, for nginx's auth_request.
func TestAuthzNginxMode(t *testing.T) {
	t.Parallel()
	const token = proxyToken
	e := newEnv(t, envOptions{rules: authzRules, config: authzTokenConfig})
	key := uniqueKey("sk_five_")
	nginx := func(hdr ...string) *http.Response {
		if len(hdr) > 0 && hdr[0] == "no token" {
			hdr = hdr[1:]
		} else {
			hdr = append(hdr, "X-Tollgate-Token", token)
		}
		resp, _ := e.authz(e.gw, "GET", append([]string{"X-Tollgate-Authz-Mode", "nginx", "Accept", "application/problem+json"}, hdr...)...)
		return resp
	}
	for i := range 5 {
		if resp := nginx("X-Original-URI", "/v1/x", "X-API-Key", key); resp.StatusCode != http.StatusOK ||
			resp.Header.Get("X-Tollgate-Status") != "" || headerInt(t, resp.Header, "X-RateLimit-Remaining") != int64(4-i) {
			t.Fatalf("admission %d: %d %v", i, resp.StatusCode, resp.Header)
		}
	}
	tests := []struct {
		name   string
		hdr    []string
		status int
		code   string
	}{
		{"rate limited", []string{"X-Original-URI", "/v1/x", "X-API-Key", key}, 429, "RATE_LIMIT_EXCEEDED"},
		{"blocked", []string{"X-Original-URI", "/v1/x", "X-API-Key", "sk_revoked_n"}, 403, "KEY_BLOCKED"},
		{"invalid path", []string{"X-Original-URI", "/../x", "X-API-Key", key}, 400, "INVALID_PATH"},
		{"invalid key", []string{"X-Original-URI", "/v1/x", "X-API-Key", "sk_\u0085x"}, 400, "INVALID_KEY"},
		{"no token", []string{"no token", "X-Original-URI", "/v1/x"}, 401, "UNAUTHORIZED"},
	}
	for _, tt := range tests {
		resp := nginx(tt.hdr...)
		raw := resp.Header.Get("X-Tollgate-Body")
		if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("X-Tollgate-Status") != strconv.Itoa(tt.status) {
			t.Errorf("%s: %d X-Tollgate-Status %q, want 401 and %d", tt.name, resp.StatusCode, resp.Header.Get("X-Tollgate-Status"), tt.status)
			continue
		}
		// JSON whatever the client's Accept: nginx serves it as such.
		if errorCode(t, []byte(raw)) != tt.code || strings.ContainsAny(raw, "\r\n") || resp.Header.Get("WWW-Authenticate") != "" {
			t.Errorf("%s: body header %q", tt.name, raw)
		}
		if tt.status == 429 && (headerInt(t, resp.Header, "Retry-After") < 1 || resp.Header.Get("X-RateLimit-Remaining") != "0") {
			t.Errorf("%s: headers %v", tt.name, resp.Header)
		}
	}
}
