package gateway_test

import (
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// TestScopesRejectionConsumesNothing: a key rule and a tenant rule apply
// together; a request rejected by one consumes from neither.
func TestScopesRejectionConsumesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rules: `
keys:
  sk_a1: {tenant: acme, tier: pro}
  sk_a2: {tenant: acme, tier: pro}
rules:
  - {id: per-key, match: {tier: pro}, algorithm: token_bucket, capacity: 2, rate: 2/1h}
  - {id: per-tenant, scope: tenant, match: {tier: pro}, algorithm: token_bucket, capacity: 3, rate: 3/1h}
`})
	type want struct {
		status        int
		key, tenant   int64 // RateLimit r of each rule
		resource      string
		retryAfterSet bool
	}
	steps := []struct {
		key  string
		want want
	}{
		{"sk_a1", want{200, 1, 2, "per-key", false}},
		{"sk_a1", want{200, 0, 1, "per-key", false}},
		// Rejected by the key rule: the tenant keeps its unit.
		{"sk_a1", want{429, 0, 1, "per-key", true}},
		{"sk_a1", want{429, 0, 1, "per-key", true}},
		{"sk_a2", want{200, 1, 0, "per-tenant", false}},
		// Rejected by the tenant rule: sk_a2's own bucket keeps its unit.
		{"sk_a2", want{429, 1, 0, "per-tenant", true}},
	}
	for i, st := range steps {
		resp, _ := e.proxyGet("/x", st.key)
		h := resp.Header
		rl := sfList(t, h, "RateLimit")
		got := want{resp.StatusCode, rl["per-key"]["r"], rl["per-tenant"]["r"], h.Get("X-RateLimit-Resource"), h.Get("Retry-After") != ""}
		if got != st.want {
			t.Errorf("step %d (%s): got %+v, want %+v (RateLimit %q)", i, st.key, got, st.want, h.Get("RateLimit"))
		}
	}
}

func TestReplaces(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rules: `
keys:
  sk_vip: {tier: pro}
  sk_normal: {tier: pro}
rules:
  - {id: tier-default, match: {tier: pro}, algorithm: token_bucket, capacity: 1, rate: 1/1h}
  - {id: vip, match: {api_key: "sk_vip"}, algorithm: token_bucket, capacity: 3, rate: 3/1h, replaces: [tier-default]}
`})
	for i := 0; i < 3; i++ {
		resp, _ := e.proxyGet("/x", "sk_vip")
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-RateLimit-Resource") != "vip" {
			t.Fatalf("vip request %d: %d %q", i, resp.StatusCode, resp.Header.Get("X-RateLimit-Resource"))
		}
		if p := sfList(t, resp.Header, "RateLimit-Policy"); len(p) != 1 || p["vip"]["q"] != 3 {
			t.Fatalf("vip policy %q: the replaced rule must not apply", resp.Header.Get("RateLimit-Policy"))
		}
	}
	if resp, _ := e.proxyGet("/x", "sk_vip"); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("4th vip request: %d", resp.StatusCode)
	}
	resp, _ := e.proxyGet("/x", "sk_normal")
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-RateLimit-Resource") != "tier-default" {
		t.Fatalf("normal key: %d %q", resp.StatusCode, resp.Header.Get("X-RateLimit-Resource"))
	}
	if resp, _ := e.proxyGet("/x", "sk_normal"); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("2nd normal request: %d", resp.StatusCode)
	}
}

// TestShadow: a shadow rule never rejects and never shows in headers, but
// its would-rejects are counted.
func TestShadow(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rules: `
rules:
  - {id: enforced, match: {}, algorithm: token_bucket, capacity: 10, rate: 10/1h}
  - {id: trial, match: {}, algorithm: fixed_window, limit: 1, window: 1h, shadow: true}
`})
	for i := 0; i < 3; i++ {
		resp, _ := e.proxyGet("/s", "sk_shadow")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
		if p := sfList(t, resp.Header, "RateLimit-Policy"); len(p) != 1 || p["enforced"] == nil {
			t.Fatalf("RateLimit-Policy %q shows the shadow rule", resp.Header.Get("RateLimit-Policy"))
		}
		if r := sfList(t, resp.Header, "RateLimit"); r["enforced"]["r"] != int64(9-i) {
			t.Fatalf("request %d: RateLimit %q", i, resp.Header.Get("RateLimit"))
		}
	}
	if got := e.metric(e.gw, "tollgate_shadow_would_reject_total", `rule="trial"`); got != 2 {
		t.Fatalf("shadow would-rejects = %v, want 2", got)
	}
}

func TestAllowlistAndBlocklist(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rules: `
allowlist: ["sk_internal_*"]
blocklist: ["sk_revoked_*"]
rules:
  - {id: all, match: {}, algorithm: token_bucket, capacity: 1, rate: 1/1h}
`})
	rateHeaders := []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Used", "X-RateLimit-Reset",
		"X-RateLimit-Resource", "RateLimit", "RateLimit-Policy", "Retry-After"}
	noHeaders := func(what string, h http.Header) {
		t.Helper()
		for _, name := range rateHeaders {
			if v := h.Get(name); v != "" {
				t.Errorf("%s: header %s = %q, want none", what, name, v)
			}
		}
	}
	for i := 0; i < 3; i++ {
		resp, _ := e.proxyGet("/a", "sk_internal_1")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("allowlisted request %d: %d", i, resp.StatusCode)
		}
		noHeaders("allowlisted (proxy)", resp.Header)
		resp, d := e.check(map[string]any{"api_key": "sk_internal_1", "endpoint": "/a"})
		if resp.StatusCode != http.StatusOK || d.Reason != "allowlisted" {
			t.Fatalf("allowlisted check %d: %d %+v", i, resp.StatusCode, d)
		}
		noHeaders("allowlisted (api)", resp.Header)
	}

	resp, body := e.proxyGet("/a", "sk_revoked_1")
	if resp.StatusCode != http.StatusForbidden || !contains(body, `"KEY_BLOCKED"`) {
		t.Fatalf("blocklisted: %d %s", resp.StatusCode, body)
	}
	noHeaders("blocklisted (proxy)", resp.Header)
	resp, d := e.check(map[string]any{"api_key": "sk_revoked_1", "endpoint": "/a"})
	if resp.StatusCode != http.StatusForbidden || d.Status != 403 || d.Error == nil || d.Error.Code != "KEY_BLOCKED" || d.Reason != "blocklisted" {
		t.Fatalf("blocklisted check: %d %+v", resp.StatusCode, d)
	}
	noHeaders("blocklisted (api)", resp.Header)
}

// TestTwoGatewaysStrictBucket: gateways sharing one Redis never admit more
// than a strict bucket holds, however requests are spread and raced.
func TestTwoGatewaysStrictBucket(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rules: `
rules:
  - {id: strict, match: {}, algorithm: token_bucket, capacity: 25, rate: 25/1h, strict: true}
`})
	second := e.startGateway(nil)
	gws := []*runningGateway{e.gw, second}
	var allowed, rejected atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Go(func() {
			for i := 0; i < 12; i++ {
				resp, _ := e.post(gws[(w+i)%2], "/v1/check", map[string]any{"api_key": "sk_shared", "endpoint": "/c"}, nil)
				switch resp.StatusCode {
				case http.StatusOK:
					allowed.Add(1)
				case http.StatusTooManyRequests:
					rejected.Add(1)
				default:
					t.Errorf("status %d", resp.StatusCode)
				}
			}
		})
	}
	wg.Wait()
	if allowed.Load() != 25 || rejected.Load() != 8*12-25 {
		t.Fatalf("allowed %d, rejected %d; want exactly 25 allowed of %d", allowed.Load(), rejected.Load(), 8*12)
	}
}

func contains(b []byte, s string) bool { return strings.Contains(string(b), s) }
