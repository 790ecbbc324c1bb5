package gateway_test

import (
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tollgate/tollgate/gateway"
	"github.com/tollgate/tollgate/internal/testnet"
	"github.com/tollgate/tollgate/internal/testwait"
)

// The same request through the proxy, the check API (single, batch,
// report) and Envoy RLS is one identity and one endpoint. These
// tests fail if endpoint normalisation, key validation or the missing-IP
// rule is removed from the guard's request path.

// rlsClient connects to g's Envoy RLS listener in plaintext.
func rlsClient(t *testing.T, g *runningGateway) rlsv3.RateLimitServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(g.addrs.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

// rlsCall decides one descriptor of key-value pairs in domain "edge".
func rlsCall(t *testing.T, c rlsv3.RateLimitServiceClient, kv ...string) *rlsv3.RateLimitResponse {
	t.Helper()
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	resp, err := c.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

// rawGet sends GET with a request target written as is (Go's client does
// not clean paths) through g's proxy.
func (e *env) rawGet(g *runningGateway, target, key string) (*http.Response, []byte) {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+g.addrs.Proxy+target, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	return e.do(req)
}

const surfaceRules = `
rules:
  - {id: v0-gone, match: {endpoint: "^/v0/"}, block: true}
  - {id: search, match: {endpoint: "^/v1/search$"}, by_endpoint: true, algorithm: token_bucket, capacity: 8, rate: 8/1h}
`

// TestSpellingsOnEverySurface: a block rule on ^/v0/ blocks every spelling
// on every surface, and the by_endpoint counter of /v1/search is one
// counter for every spelling on every surface.
func TestSpellingsOnEverySurface(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rules: surfaceRules, config: func(c *gateway.Config) { c.GRPCListen = "127.0.0.1:0" }})
	rc := rlsClient(t, e.gw)

	for _, p := range []string{"/v0/x", "//v0/x", "/./v0/x", "/v1/../v0/x", "/%76%30/x", "/v0//x/"} {
		resp, body := e.rawGet(e.gw, p, "sk_block")
		if resp.StatusCode != http.StatusForbidden || !contains(body, `"ENDPOINT_BLOCKED"`) || !contains(body, `rule \"v0-gone\"`) {
			t.Errorf("proxy GET %s: %d %s", p, resp.StatusCode, body)
		}
		cr, d := e.check(map[string]any{"api_key": "sk_block", "endpoint": p})
		if cr.StatusCode != http.StatusForbidden || d.Error == nil || d.Error.Code != "ENDPOINT_BLOCKED" || d.Reason != "block_rule" {
			t.Errorf("check %s: %d %+v", p, cr.StatusCode, d)
		}
		if r := rlsCall(t, rc, "api_key", "sk_block", "path", p); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("RLS %s: %v", p, r.OverallCode)
		}
	}

	// One key, eight spellings of /v1/search over every surface: one
	// counter of capacity 8, so remaining counts down 7 … 0, then 429.
	key := uniqueKey("sk_spell_")
	remaining := func(step int, got int64) {
		t.Helper()
		if want := int64(7 - step); got != want {
			t.Fatalf("step %d: remaining %d, want %d: the spellings are not one counter", step, got, want)
		}
	}
	steps := []func(step int){
		func(step int) { // proxy
			resp, _ := e.rawGet(e.gw, "/v1/search", key)
			remaining(step, headerInt(t, resp.Header, "X-RateLimit-Remaining"))
		},
		func(step int) {
			resp, _ := e.rawGet(e.gw, "//v1/search?q=x", key)
			remaining(step, headerInt(t, resp.Header, "X-RateLimit-Remaining"))
		},
		func(step int) { // check API
			_, d := e.check(map[string]any{"api_key": key, "endpoint": "/v1/search/"})
			remaining(step, d.Remaining)
		},
		func(step int) {
			_, d := e.check(map[string]any{"api_key": key, "endpoint": "/v1/./search"})
			remaining(step, d.Remaining)
		},
		func(step int) { // batch
			_, body := e.post(e.gw, "/v1/check/batch", []map[string]any{{"api_key": key, "endpoint": "/v1/x/../search"}}, nil)
			if !contains(body, fmt.Sprintf(`"remaining":%d`, 7-step)) {
				t.Fatalf("step %d: batch %s", step, body)
			}
		},
		func(step int) { // report: charged after the fact, then read by a peek
			resp, _ := e.post(e.gw, "/v1/report", map[string]any{"api_key": key, "endpoint": "/v1/%73earch", "cost": 1}, nil)
			if resp.StatusCode != http.StatusNoContent {
				t.Fatalf("report: %d", resp.StatusCode)
			}
			// A peek answers what cost 1 would leave.
			_, d := e.check(map[string]any{"api_key": key, "endpoint": "/v1/search", "cost": 0})
			if d.Remaining != int64(7-step-1) {
				t.Fatalf("step %d: after the report remaining %d", step, d.Remaining)
			}
		},
		func(step int) { // Envoy RLS
			r := rlsCall(t, rc, "api_key", key, "path", "/v1//search")
			remaining(step, int64(r.Statuses[0].LimitRemaining))
		},
		func(step int) {
			r := rlsCall(t, rc, "api_key", key, "path", "/v1/search/.")
			remaining(step, int64(r.Statuses[0].LimitRemaining))
		},
	}
	for i, step := range steps {
		step(i)
	}
	if resp, _ := e.rawGet(e.gw, "/v1/search/", key); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("ninth request: %d, want 429", resp.StatusCode)
	}
}

// TestProxyForwardsNormalisedPath: the upstream receives the normalised
// path, with its trailing slash and query string, and the limiter counts
// what the upstream serves.
func TestProxyForwardsNormalisedPath(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var seen []string
	e := newEnv(t, envOptions{rules: proxyRules, upstream: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.RequestURI)
		mu.Unlock()
	})})
	tests := map[string]string{
		"//v1/./users/42/?q=1":  "/v1/users/42/?q=1",
		"/v1/x/../users/%34%32": "/v1/users/42",
		"/v1/users//42":         "/v1/users/42",
		"/v1/users/caf%c3%a9":   "/v1/users/caf%C3%A9",
		"/v1/users/42":          "/v1/users/42",
	}
	for target, want := range tests {
		mu.Lock()
		seen = seen[:0]
		mu.Unlock()
		resp, body := e.rawGet(e.gw, target, "sk_fwd_norm")
		mu.Lock()
		got := append([]string(nil), seen...)
		mu.Unlock()
		if resp.StatusCode != http.StatusOK || len(got) != 1 || got[0] != want {
			t.Errorf("GET %s: %d %s, upstream saw %q, want %q", target, resp.StatusCode, body, got, want)
		}
	}
	mu.Lock()
	seen = seen[:0]
	mu.Unlock()
	for _, target := range []string{"/v1/a%2Fb", "/v1/../../etc/passwd", "/v1/%5c"} {
		resp, body := e.rawGet(e.gw, target, "sk_fwd_norm")
		if resp.StatusCode != http.StatusBadRequest || !contains(body, `"INVALID_PATH"`) || contains(body, "upstream") {
			t.Errorf("GET %s: %d %s, want 400 INVALID_PATH", target, resp.StatusCode, body)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 0 {
		t.Errorf("refused paths reached the upstream: %q", seen)
	}
}

// TestKeysAlikeOnEverySurface: one key rule everywhere — UTF-8 keys are
// keys on the proxy and the check API alike (one counter), C1 controls
// and invalid UTF-8 are INVALID_KEY everywhere, and a bearer token that is
// not a valid key falls through to the next source.
func TestKeysAlikeOnEverySurface(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rules: `
rules:
  - {id: per-key, match: {anonymous: false}, algorithm: token_bucket, capacity: 10, rate: 10/1h}
  - {id: anon, match: {anonymous: true}, scope: ip, algorithm: token_bucket, capacity: 10, rate: 10/1h}
`, config: func(c *gateway.Config) {
		c.GRPCListen = "127.0.0.1:0"
		c.Identity.KeySources = []string{"bearer", "header:X-API-Key"}
	}})
	rc := rlsClient(t, e.gw)

	utf := uniqueKey("sk_clé_")
	resp, _ := e.proxyGet("/x", utf)
	if resp.StatusCode != http.StatusOK || headerInt(t, resp.Header, "X-RateLimit-Remaining") != 9 {
		t.Fatalf("proxy, UTF-8 key: %d %v", resp.StatusCode, resp.Header)
	}
	if _, d := e.check(map[string]any{"api_key": utf}); !d.Allowed || d.Remaining != 8 {
		t.Fatalf("check API, same UTF-8 key: %+v, want the proxy's counter", d)
	}
	if r := rlsCall(t, rc, "api_key", utf); r.Statuses[0].LimitRemaining != 7 {
		t.Fatalf("RLS, same UTF-8 key: %v", r)
	}

	for name, key := range map[string]string{"C1 control": "sk_\u0085x", "DEL": "sk_\x7fx", "space": "sk_ x"} {
		// Go's client refuses to send DEL in a header: the proxy's own test
		// of it is in httpguard.
		if name != "DEL" {
			if resp, body := e.proxyGet("/x", key); resp.StatusCode != http.StatusBadRequest || !contains(body, `"INVALID_KEY"`) {
				t.Errorf("proxy, %s: %d %s", name, resp.StatusCode, body)
			}
		}
		if resp, d := e.check(map[string]any{"api_key": key}); resp.StatusCode != http.StatusBadRequest || d.Reason != "invalid_key" {
			t.Errorf("check API, %s: %d %+v", name, resp.StatusCode, d)
		}
		if r := rlsCall(t, rc, "api_key", key); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("RLS, %s: %v", name, r.OverallCode)
		}
	}
	// Two keys differing only in invalid bytes never become one key.
	for _, k := range []string{"sk_\xff", "sk_\xfe"} {
		resp, body := e.post(e.gw, "/v1/check", `{"api_key":"`+k+`"}`, nil)
		if resp.StatusCode != http.StatusBadRequest || !contains(body, `"INVALID_KEY"`) {
			t.Errorf("check API, invalid UTF-8: %d %s", resp.StatusCode, body)
		}
	}

	// A JWT in the bearer source falls through to X-API-Key, or to an
	// anonymous request.
	jwt := "eyJ" + strings.Repeat("a", 400)
	req, _ := http.NewRequest(http.MethodGet, "http://"+e.gw.addrs.Proxy+"/x", nil)
	req.Header.Set("Authorization", "Bearer "+jwt)
	req.Header.Set("X-API-Key", utf)
	if resp, _ := e.do(req); resp.StatusCode != http.StatusOK || resp.Header.Get("X-RateLimit-Resource") != "per-key" ||
		headerInt(t, resp.Header, "X-RateLimit-Remaining") != 6 {
		t.Errorf("JWT then X-API-Key: %d %v", resp.StatusCode, resp.Header)
	}
	req.Header.Del("X-API-Key")
	if resp, _ := e.do(req); resp.StatusCode != http.StatusOK || resp.Header.Get("X-RateLimit-Resource") != "anon" {
		t.Errorf("JWT alone: %d %v, want an anonymous request", resp.StatusCode, resp.Header)
	}
}

// TestMissingClientIP: check bodies and Envoy descriptors without an IP
// match no per-IP rule: they never share one counter.
func TestMissingClientIP(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rules: `
rules:
  - {id: per-ip, scope: ip, algorithm: token_bucket, capacity: 1, rate: 1/1h}
  - {id: anon-key-scope, match: {anonymous: true}, algorithm: token_bucket, capacity: 1, rate: 1/1h}
`, config: func(c *gateway.Config) { c.GRPCListen = "127.0.0.1:0" }})
	rc := rlsClient(t, e.gw)
	for i := range 3 {
		for _, body := range []map[string]any{{"endpoint": "/x"}, {"api_key": "sk_no_ip", "endpoint": "/x"}} {
			if resp, d := e.check(body); resp.StatusCode != http.StatusOK || d.Reason != "no_rule" {
				t.Fatalf("check %d %v without ip: %d %+v, want no rule", i, body, resp.StatusCode, d)
			}
		}
		if r := rlsCall(t, rc, "path", "/x"); r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].CurrentLimit != nil {
			t.Fatalf("RLS %d without remote_address: %v", i, r)
		}
	}
	// With an IP the rules apply: the second request from one IP is over.
	body := map[string]any{"ip": "198.51.100.9", "endpoint": "/x"}
	if _, d := e.check(body); !d.Allowed || d.Rule == "" {
		t.Fatalf("first with ip: %+v", d)
	}
	if _, d := e.check(body); d.Allowed {
		t.Fatalf("second with ip: %+v", d)
	}
}

// TestTooManyRulesPerRequest: max_rules_per_request refuses a rules file
// where every request of a tier matches more rules, at start and on
// reload, and answers a request matching more 500 TOO_MANY_RULES without
// Redis, counted.
func TestTooManyRulesPerRequest(t *testing.T) {
	t.Parallel()
	wide := "tiers: [{pattern: 'sk_free_*', tier: free}]\nrules:\n" +
		strings.Join(testnet.Numbered("  - {id: free-%d, match: {tier: free}, capacity: 9, rate: 9/1h}\n", 3), "")
	narrow := `
rules:
  - {id: a, match: {endpoint: "^/many"}, capacity: 9, rate: 9/1h}
  - {id: b, match: {endpoint: "^/many"}, capacity: 9, rate: 9/1h}
  - {id: c, match: {endpoint: "^/many"}, capacity: 9, rate: 9/1h}
  - {id: d, match: {endpoint: "^/few"}, capacity: 9, rate: 9/1h}
`
	e := newEnv(t, envOptions{rules: narrow, config: func(c *gateway.Config) { c.MaxRulesPerRequest = 2 }})

	resp, body := e.proxyGet("/many", "sk_many")
	if resp.StatusCode != http.StatusInternalServerError || !contains(body, `"TOO_MANY_RULES"`) || contains(body, "upstream") {
		t.Fatalf("proxy: %d %s", resp.StatusCode, body)
	}
	if resp, d := e.check(map[string]any{"api_key": "sk_many", "endpoint": "/many"}); resp.StatusCode != 500 || d.Reason != "too_many_rules" {
		t.Fatalf("check API: %d %+v", resp.StatusCode, d)
	}
	if resp, _ := e.proxyGet("/few", "sk_many"); resp.StatusCode != http.StatusOK {
		t.Fatalf("one rule: %d", resp.StatusCode)
	}
	if v := e.metric(e.gw, "tollgate_too_many_rules_total"); v != 2 {
		t.Errorf("tollgate_too_many_rules_total = %v, want 2", v)
	}
	if v := e.metric(e.gw, "tollgate_redis_calls_total"); v != 1 {
		t.Errorf("tollgate_redis_calls_total = %v, want 1 (refusals touch no Redis)", v)
	}

	// A reload where every free key would match three rules is refused.
	errs := e.metric(e.gw, "tollgate_rules_reload_errors_total")
	e.writeRules(wide)
	testwait.Eventually(t, 5*time.Second, func() error {
		if v := e.metric(e.gw, "tollgate_rules_reload_errors_total"); v != errs+1 {
			return fmt.Errorf("reload errors %v, want %v", v, errs+1)
		}
		return nil
	})
	if resp, _ := e.proxyGet("/few", "sk_free_1"); resp.StatusCode != http.StatusOK || resp.Header.Get("X-RateLimit-Resource") != "d" {
		t.Errorf("the running rules did not stay: %d %v", resp.StatusCode, resp.Header)
	}

	// And so is such a file at start, naming the rule.
	path := filepath.Join(t.TempDir(), "wide.yaml")
	if err := os.WriteFile(path, []byte(wide), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := e.config()
	cfg.RulesFile, cfg.MaxRulesPerRequest = path, 2
	if _, err := gateway.New(cfg, nil); err == nil || !strings.Contains(err.Error(), `rule "free-2"`) ||
		!strings.Contains(err.Error(), "max_rules_per_request") {
		t.Errorf("New with a file over the bound: %v", err)
	}
}

// TestRLSTooManyRules: Envoy gets Internal, not OVER_LIMIT.
func TestRLSTooManyRules(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rules: `
rules:
  - {id: a, match: {endpoint: "^/many"}, capacity: 9, rate: 9/1h}
  - {id: b, match: {endpoint: "^/many"}, capacity: 9, rate: 9/1h}
`, config: func(c *gateway.Config) { c.MaxRulesPerRequest = 1; c.GRPCListen = "127.0.0.1:0" }})
	_, err := rlsClient(t, e.gw).ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "edge",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "api_key", Value: "sk_k"}, {Key: "path", Value: "/many"}}}}})
	if status.Code(err) != codes.Internal {
		t.Fatalf("err %v, want Internal", err)
	}
	if v := e.metric(e.gw, "tollgate_too_many_rules_total"); v != 1 {
		t.Errorf("tollgate_too_many_rules_total = %v", v)
	}
}

// TestStartLogExposure: the start log says whether api_token is set and
// which listeners are exposed beyond loopback, never the token itself.
func TestStartLogExposure(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rules: proxyRules})
	for _, tc := range []struct {
		name    string
		mutate  func(*gateway.Config)
		want    []string
		notWant []string
	}{
		{"loopback", func(c *gateway.Config) {}, []string{"api_token_set=false", "exposed=[]", "grpc_tls=off"}, []string{"WARN"}},
		{"exposed without token", func(c *gateway.Config) { c.APIListen = "0.0.0.0:0"; c.GRPCListen = "0.0.0.0:0" },
			[]string{"api_token_set=false", "exposed=\"[api grpc]\"", "grpc_tls=plaintext", "check API is reachable beyond loopback", "Envoy RLS is reachable beyond loopback"}, nil},
		{"exposed with token", func(c *gateway.Config) { c.APIListen = "0.0.0.0:0"; c.APIToken = "s3cr3t-token-value" },
			[]string{"api_token_set=true", "exposed=[api]"}, []string{"s3cr3t-token-value", "check API is reachable"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf testnet.Buffer
			cfg := e.config()
			tc.mutate(&cfg)
			srv, err := gateway.New(cfg, slog.New(slog.NewTextHandler(&buf, nil)))
			if err != nil {
				t.Fatal(err)
			}
			run(t, srv)
			testwait.Eventually(t, 5*time.Second, func() error {
				if !strings.Contains(buf.String(), "gateway started") {
					return fmt.Errorf("no start line yet")
				}
				return nil
			})
			log := buf.String()
			for _, w := range tc.want {
				if !strings.Contains(log, w) {
					t.Errorf("log lacks %q:\n%s", w, log)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(log, w) {
					t.Errorf("log holds %q:\n%s", w, log)
				}
			}
		})
	}
}
