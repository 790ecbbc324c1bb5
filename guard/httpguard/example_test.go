package httpguard_test

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/httpguard"
)

// quotaChecker stands in for a *guard.Guard in these examples: every key
// may make two requests; anonymous requests match no rule. The middleware
// calls only CheckInto; the embedded guard.Checker (nil) stands for the
// rest of the interface.
type quotaChecker struct {
	guard.Checker
	mu   sync.Mutex
	used map[string]int64
}

func (c *quotaChecker) CheckInto(_ context.Context, req *guard.Request, d *guard.Decision) error {
	const limit = 2
	if req.Key == "" {
		*d = guard.Decision{Allowed: true, Status: http.StatusOK, Reason: guard.ReasonNoRule, Deciding: -1, Rules: d.Rules[:0]}
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	used := c.used[req.Key]
	allowed := used < limit
	if allowed {
		used++
		c.used[req.Key] = used
	}
	rule := guard.RuleResult{ID: "demo", Allowed: allowed, Limit: limit, Remaining: limit - used,
		Window: 60, Reset: 1_700_000_060, Next: 60}
	*d = guard.Decision{Allowed: true, Status: http.StatusOK, Reason: guard.ReasonAllowed,
		Rules: append(d.Rules[:0], rule), Deciding: 0}
	if !allowed {
		rule.RetryAfter = 60
		d.Rules[0] = rule
		d.Allowed, d.Status, d.Code, d.Reason, d.RetryAfter = false, http.StatusTooManyRequests,
			guard.CodeRateLimitExceeded, guard.ReasonRateLimited, 60
	}
	return nil
}

// A service puts the guard in front of its handler. Admitted requests
// reach the handler with the rate-limit headers set; the third request is
// answered 429 by the middleware itself.
func ExampleMiddleware() {
	checker := &quotaChecker{used: map[string]int64{}}
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello\n")
	})
	handler := httpguard.Middleware(checker)(api)

	for range 3 {
		r := httptest.NewRequest(http.MethodGet, "/v1/search", nil)
		r.Header.Set("X-API-Key", "sk_demo_1")
		w := httptest.NewRecorder()
		handler.ServeHTTP(w, r)
		h := w.Result().Header
		fmt.Printf("%d remaining=%s RateLimit=%s Retry-After=%q\n%s", w.Code,
			h.Get("X-RateLimit-Remaining"), h.Get("RateLimit"), h.Get("Retry-After"), w.Body)
	}
	// Output:
	// 200 remaining=1 RateLimit="demo";r=1;t=60 Retry-After=""
	// hello
	// 200 remaining=0 RateLimit="demo";r=0;t=60 Retry-After=""
	// hello
	// 429 remaining=0 RateLimit="demo";r=0;t=60 Retry-After="60"
	// {"error":{"code":"RATE_LIMIT_EXCEEDED","message":"Rate limit \"demo\" exceeded: 2 per 60 seconds. Retry after 60 seconds.","details":{"rule":"demo","limit":2,"remaining":0,"window_seconds":60,"retry_after_seconds":60,"reset_at":"2023-11-14T22:14:20Z"}}}
}

// SetHeaders writes the rate-limit headers of a decision; HeaderPairs gives
// the same headers as pairs, for Envoy's response_headers_to_add.
func ExampleSetHeaders() {
	d := &guard.Decision{Allowed: true, Status: http.StatusOK, Deciding: 1, Rules: []guard.RuleResult{
		{ID: "tenant-total", Allowed: true, Limit: 10000, Remaining: 9000, Window: 60, Reset: 1_700_000_060, Next: 1},
		{ID: "search", Allowed: true, Limit: 30, Remaining: 12, Window: 60, Reset: 1_700_000_036, Next: 2},
	}}
	h := http.Header{}
	h.Set("X-RateLimit-Limit", "999") // say from the upstream: replaced
	httpguard.SetHeaders(h, d)
	for _, name := range slices.Sorted(maps.Keys(h)) {
		fmt.Printf("%s: %s\n", name, strings.Join(h[name], ", "))
	}
	fmt.Println(httpguard.HeaderPairs(d, nil)[0])
	// Output:
	// Ratelimit: "tenant-total";r=9000;t=1, "search";r=12;t=2
	// Ratelimit-Policy: "tenant-total";q=10000;w=60, "search";q=30;w=60
	// X-Ratelimit-Limit: 30
	// X-Ratelimit-Remaining: 12
	// X-Ratelimit-Reset: 1700000036
	// X-Ratelimit-Resource: search
	// X-Ratelimit-Used: 18
	// [X-RateLimit-Limit 30]
}

// Behind a trusted load balancer the client IP comes from X-Forwarded-For,
// walked from the right; a spoofed left-most entry is never reached.
func ExampleIdentity_Extract() {
	id := &httpguard.Identity{
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		TenantHeader:   "X-Tenant",
	}
	r := httptest.NewRequest(http.MethodGet, "/v1/users/42", nil)
	r.RemoteAddr = "10.1.2.3:41000"
	r.Header.Set("Authorization", "Bearer sk_prod_acme_1")
	r.Header.Set("X-Forwarded-For", "6.6.6.6, 203.0.113.7, 10.0.0.9")
	r.Header.Set("X-Tenant", "acme")

	var req guard.Request
	if err := id.Extract(r, &req); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(req.Key, req.IP, req.Tenant, req.Path, id.Direct(r))

	r.Header.Set("X-API-Key", strings.Repeat("k", 300))
	fmt.Println(id.Extract(r, &req))
	// Output:
	// sk_prod_acme_1 203.0.113.7 acme /v1/users/42 false
	// httpguard: invalid API key: header:X-API-Key is too long
}
