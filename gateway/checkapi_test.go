package gateway_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/gateway"
)

const apiRules = `
keys:
  sk_acme: {tenant: acme, tier: pro}
rules:
  - {id: five, match: {}, algorithm: token_bucket, capacity: 5, rate: 5/1h}
  - {id: orders, match: {endpoint: "^/v1/orders"}, algorithm: token_bucket, capacity: 100, rate: 100/1h, cost: 5}
`

func TestCheckAPIBadInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rules: apiRules, config: func(c *gateway.Config) {
		c.MaxBatch = 3
		c.Limits.MaxBodyBytes = 1024
		c.MaxCost = 50
	}})
	tests := []struct {
		name   string
		path   string
		body   string
		status int
		code   string
	}{
		{"300-byte key", "/v1/check", `{"api_key":"` + strings.Repeat("k", 300) + `"}`, 400, "INVALID_KEY"},
		{"control character in key", "/v1/check", `{"api_key":"sk_\u0001bad"}`, 400, "INVALID_KEY"},
		{"space in key", "/v1/check", `{"api_key":"sk bad"}`, 400, "INVALID_KEY"},
		{"C1 control in key", "/v1/check", `{"api_key":"sk_\u0085bad"}`, 400, "INVALID_KEY"},
		{"raw C1 control in key", "/v1/check", "{\"api_key\":\"sk_\u0085bad\"}", 400, "INVALID_KEY"},
		{"invalid UTF-8 in key", "/v1/check", "{\"api_key\":\"sk_\xffbad\"}", 400, "INVALID_KEY"},
		{"lone surrogate in key", "/v1/check", `{"api_key":"sk_\ud800bad"}`, 400, "INVALID_KEY"},
		{"report invalid UTF-8 key", "/v1/report", "{\"api_key\":\"sk_\xfe\",\"cost\":2}", 400, "INVALID_KEY"},
		{"path above the root", "/v1/check", `{"api_key":"sk_x","endpoint":"/v1/../../etc"}`, 400, "INVALID_PATH"},
		{"encoded slash in path", "/v1/check", `{"api_key":"sk_x","endpoint":"/v1/a%2fb"}`, 400, "INVALID_PATH"},
		{"report path above the root", "/v1/report", `{"api_key":"sk_x","endpoint":"/..","cost":2}`, 400, "INVALID_PATH"},
		{"malformed JSON", "/v1/check", `{"api_key":`, 400, "INVALID_REQUEST"},
		{"not an object", "/v1/check", `["sk_x"]`, 400, "INVALID_REQUEST"},
		{"null", "/v1/check", `null`, 400, "INVALID_REQUEST"},
		{"empty body", "/v1/check", ``, 400, "INVALID_REQUEST"},
		{"unknown field", "/v1/check", `{"api_key":"sk_x","costs":2}`, 400, "INVALID_REQUEST"},
		{"trailing data", "/v1/check", `{"api_key":"sk_x"} {}`, 400, "INVALID_REQUEST"},
		{"cost not an integer", "/v1/check", `{"api_key":"sk_x","cost":1.5}`, 400, "INVALID_REQUEST"},
		{"cost a string", "/v1/check", `{"api_key":"sk_x","cost":"1"}`, 400, "INVALID_REQUEST"},
		{"negative cost", "/v1/check", `{"api_key":"sk_x","cost":-1}`, 400, "INVALID_REQUEST"},
		{"cost above the limit", "/v1/check", `{"api_key":"sk_x","cost":6}`, 400, "COST_EXCEEDS_LIMIT"},
		{"cost above max_cost", "/v1/check", `{"api_key":"sk_x","cost":51}`, 400, "COST_EXCEEDS_LIMIT"},
		{"bad ip", "/v1/check", `{"api_key":"sk_x","ip":"10.0.0.300"}`, 400, "INVALID_REQUEST"},
		{"control character in endpoint", "/v1/check", `{"api_key":"sk_x","endpoint":"/a\nb"}`, 400, "INVALID_REQUEST"},
		{"bad method", "/v1/check", `{"api_key":"sk_x","method":"GET /"}`, 400, "INVALID_REQUEST"},
		{"oversized body", "/v1/check", `{"api_key":"sk_x","endpoint":"/` + strings.Repeat("a", 2000) + `"}`, 413, "BODY_TOO_LARGE"},
		{"batch too long", "/v1/check/batch", `[{},{},{},{}]`, 400, "BATCH_TOO_LARGE"},
		{"batch not an array", "/v1/check/batch", `{"api_key":"sk_x"}`, 400, "INVALID_REQUEST"},
		{"batch malformed", "/v1/check/batch", `[{"api_key":"sk_x"},`, 400, "INVALID_REQUEST"},
		{"report unknown field", "/v1/report", `{"api_key":"sk_x","x":1}`, 400, "INVALID_REQUEST"},
		{"report 300-byte key", "/v1/report", `{"api_key":"` + strings.Repeat("k", 300) + `","cost":2}`, 400, "INVALID_KEY"},
		{"unknown path", "/v1/nope", `{}`, 404, "NOT_FOUND"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			resp, body := e.post(e.gw, tt.path, tt.body, nil)
			var eb errorBody
			if err := json.Unmarshal(body, &eb); err != nil {
				t.Fatalf("body %s: %v", body, err)
			}
			if resp.StatusCode != tt.status || eb.Error.Code != tt.code {
				t.Fatalf("status %d code %q, want %d %q; body %s", resp.StatusCode, eb.Error.Code, tt.status, tt.code, body)
			}
			if eb.Error.Message == "" {
				t.Error("no message")
			}
			if strings.Contains(string(body), "kkkkkkkk") || strings.Contains(string(body), "sk_x") {
				t.Errorf("the body quotes the key: %s", body)
			}
			if resp.Header.Get("Retry-After") != "" {
				t.Errorf("Retry-After %q on a %d", resp.Header.Get("Retry-After"), resp.StatusCode)
			}
		})
	}
	t.Run("refusals name their rule", func(t *testing.T) {
		t.Parallel()
		for body, want := range map[string]string{
			`{"api_key":"sk_x","cost":6}`:  `The request's cost of 6 exceeds the limit of 5 of rule "five"`,
			`{"api_key":"sk_x","cost":51}`: `exceeds the largest cost one request may ask for, 50`,
		} {
			_, raw := e.post(e.gw, "/v1/check", body, nil)
			var d decisionBody
			if err := json.Unmarshal(raw, &d); err != nil || d.Error == nil || !strings.Contains(d.Error.Message, want) {
				t.Errorf("%s: %s, want a message with %q", body, raw, want)
			}
		}
	})
	t.Run("GET", func(t *testing.T) {
		t.Parallel()
		status, _ := e.get("http://" + e.gw.addrs.API + "/v1/check")
		if status != http.StatusMethodNotAllowed {
			t.Fatalf("GET /v1/check: %d", status)
		}
	})
}

// TestProxyBadKeys: the proxy answers malformed keys itself with 400
// INVALID_KEY and forwards nothing.
func TestProxyBadKeys(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rules: apiRules})
	for name, key := range map[string]string{
		"300 bytes":     strings.Repeat("k", 300),
		"tab inside":    "sk_\tbad",
		"space inside":  "sk_ bad",
		"C1 control":    "sk_\u0085",
		"invalid UTF-8": "sk_\xff",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			resp, body := e.proxyGet("/x", key)
			if resp.StatusCode != http.StatusBadRequest || !contains(body, `"INVALID_KEY"`) || contains(body, "upstream") {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
		})
	}
	t.Run("JWT bearer falls through to anonymous", func(t *testing.T) {
		t.Parallel()
		req, _ := http.NewRequest(http.MethodGet, "http://"+e.gw.addrs.Proxy+"/x", nil)
		req.Header.Set("Authorization", "Bearer "+strings.Repeat("j", 400))
		resp, body := e.do(req)
		if resp.StatusCode != http.StatusOK || string(body) != "upstream /x" {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
	})
}

func TestCheckAPIToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rules: apiRules, config: func(c *gateway.Config) { c.APIToken = "s3cret-token" }})
	for name, auth := range map[string]string{"none": "", "wrong": "Bearer nope", "basic": "Basic czNjcmV0LXRva2Vu"} {
		h := http.Header{}
		if auth != "" {
			h.Set("Authorization", auth)
		}
		resp, body := e.post(e.gw, "/v1/check", `{"api_key":"sk_t"}`, h)
		if resp.StatusCode != http.StatusUnauthorized || !contains(body, `"UNAUTHORIZED"`) || resp.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("%s: %d %s", name, resp.StatusCode, body)
		}
	}
	h := http.Header{"Authorization": {"Bearer s3cret-token"}}
	if resp, body := e.post(e.gw, "/v1/check", `{"api_key":"sk_t"}`, h); resp.StatusCode != http.StatusOK {
		t.Fatalf("with the token: %d %s", resp.StatusCode, body)
	}
}

func TestCheckAPIBatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rules: apiRules})
	body := `[
		{"api_key":"sk_b","endpoint":"/x"},
		{"api_key":"sk_b","endpoint":"/x","cost":4},
		{"api_key":"sk_b","endpoint":"/x"},
		{"api_key":"sk_b","bogus":true},
		{"api_key":"` + strings.Repeat("k", 300) + `"},
		{"api_key":"sk_b","cost":0},
		{"api_key":"sk_internal_nothing_matches_but_five"}
	]`
	resp, raw := e.post(e.gw, "/v1/check/batch", body, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("batch: %d %s", resp.StatusCode, raw)
	}
	var ds []decisionBody
	if err := json.Unmarshal(raw, &ds); err != nil {
		t.Fatal(err)
	}
	type item struct {
		status    int
		remaining int64
		code      string
	}
	want := []item{
		{200, 4, ""},
		{200, 0, ""},
		{429, 0, "RATE_LIMIT_EXCEEDED"}, // in order: the bucket is empty
		{400, 0, "INVALID_REQUEST"},     // independent: the others still decided
		{400, 0, "INVALID_KEY"},
		{429, 0, "RATE_LIMIT_EXCEEDED"}, // a peek of an empty bucket
		{200, 4, ""},
	}
	if len(ds) != len(want) {
		t.Fatalf("%d decisions, want %d: %s", len(ds), len(want), raw)
	}
	for i, w := range want {
		code := ""
		if ds[i].Error != nil {
			code = ds[i].Error.Code
		}
		if got := (item{ds[i].Status, ds[i].Remaining, code}); got != w {
			t.Errorf("item %d: %+v, want %+v", i, got, w)
		}
		if ds[i].Allowed != (w.status == 200) {
			t.Errorf("item %d: allowed %v", i, ds[i].Allowed)
		}
	}
}

func TestCheckAPIPeekAndReport(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rules: apiRules})
	peek := map[string]any{"api_key": "sk_acme", "endpoint": "/p", "cost": 0}
	for i := 0; i < 3; i++ {
		resp, d := e.check(peek)
		if resp.StatusCode != 200 || d.Remaining != 4 {
			t.Fatalf("peek %d: %d %+v (a peek answers as cost 1 would and charges nothing)", i, resp.StatusCode, d)
		}
	}
	resp, raw := e.post(e.gw, "/v1/report", map[string]any{"api_key": "sk_acme", "endpoint": "/p", "cost": 3}, nil)
	if resp.StatusCode != http.StatusNoContent || len(raw) != 0 {
		t.Fatalf("report: %d %s", resp.StatusCode, raw)
	}
	if _, d := e.check(peek); d.Remaining != 1 {
		t.Fatalf("after reporting 3: remaining %d, want 1", d.Remaining)
	}
	// Reports may drive the counter into debt; checks are then refused.
	if resp, _ := e.post(e.gw, "/v1/report", map[string]any{"api_key": "sk_acme", "endpoint": "/p", "cost": 5}, nil); resp.StatusCode != 204 {
		t.Fatalf("report into debt: %d", resp.StatusCode)
	}
	if resp, d := e.check(map[string]any{"api_key": "sk_acme", "endpoint": "/p"}); resp.StatusCode != 429 || d.RetryAfter < 1200 {
		t.Fatalf("check in debt: %d %+v", resp.StatusCode, d)
	}
	// The rule's own cost wins over the body's.
	resp, d := e.check(map[string]any{"api_key": "sk_o", "endpoint": "/v1/orders", "cost": 1})
	if resp.StatusCode != 200 {
		t.Fatalf("order: %d %+v", resp.StatusCode, d)
	}
	if rl := sfList(t, resp.Header, "RateLimit"); rl["orders"]["r"] != 95 {
		t.Fatalf("orders RateLimit %q, want r=95", resp.Header.Get("RateLimit"))
	}
}

// TestCheckAPIIPAndTenant: anonymous checks are limited per IP (IPv6 per
// /64); the registry overrides a body's tenant.
func TestCheckAPIIPAndTenant(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rules: `
keys:
  sk_reg: {tenant: acme}
rules:
  - {id: anon, scope: ip, match: {anonymous: true}, algorithm: token_bucket, capacity: 1, rate: 1/1h}
  - {id: acme-only, scope: tenant, match: {tenant: acme}, algorithm: token_bucket, capacity: 1, rate: 1/1h}
`})
	steps := []struct {
		body   map[string]any
		status int
	}{
		{map[string]any{"ip": "2001:db8:1:2::1"}, 200},
		{map[string]any{"ip": "2001:db8:1:2::ffff"}, 429}, // same /64
		{map[string]any{"ip": "2001:db8:1:3::1"}, 200},
		{map[string]any{"ip": "::ffff:192.0.2.7"}, 200},
		{map[string]any{"ip": "192.0.2.7"}, 429}, // the same address, unmapped
		{map[string]any{"api_key": "sk_other", "tenant": "acme"}, 200},
		{map[string]any{"api_key": "sk_reg", "tenant": "globex"}, 429}, // the registry says acme
	}
	for i, st := range steps {
		if resp, d := e.check(st.body); resp.StatusCode != st.status {
			t.Errorf("step %d %v: %d %+v, want %d", i, st.body, resp.StatusCode, d, st.status)
		}
	}
}
