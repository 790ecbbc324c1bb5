package forwardauth_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// rules of the forward-auth tests: five requests per key, refilling one
// every two seconds, so a Retry-After can be waited out; a method rule; a
// per-IP rule that shows which client IP Tollgate used.
const rules = `
blocklist: ["sk_revoked_*"]
rules:
  - {id: five, match: {api_key: "sk_five_*"}, algorithm: token_bucket, capacity: 5, rate: 5/10s}
  - {id: posts, match: {api_key: "sk_post_*", methods: [POST]}, algorithm: token_bucket, capacity: 100, rate: 100/1h}
  - {id: per-ip, scope: ip, match: {endpoint: "^/ip/"}, algorithm: fixed_window, limit: 2, window: 1h}
`

// rateLimitHeaders are the rate-limit headers a proxy copies to the client.
var rateLimitHeaders = []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Used", "X-RateLimit-Reset",
	"X-RateLimit-Resource", "X-RateLimit-Policy", "RateLimit", "RateLimit-Policy", "Retry-After"}

// errorBody is Tollgate's JSON error body.
type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Details struct {
			Rule              string `json:"rule"`
			Limit             int64  `json:"limit"`
			RetryAfterSeconds int64  `json:"retry_after_seconds"`
		} `json:"details"`
	} `json:"error"`
}

func decodeError(t *testing.T, r response) errorBody {
	t.Helper()
	var eb errorBody
	if err := json.Unmarshal([]byte(r.body), &eb); err != nil {
		t.Fatalf("%d body %q is not Tollgate's JSON: %v", r.StatusCode, r.body, err)
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/json" && ct != "application/problem+json" {
		t.Errorf("Content-Type %q", ct)
	}
	return eb
}

// one returns the single value of header name, failing the test when it
// is absent or repeated (an upstream's value beside Tollgate's).
func one(t *testing.T, r response, name string) string {
	t.Helper()
	v := r.Header.Values(name)
	if len(v) != 1 {
		t.Fatalf("%s: %q, want exactly one value; headers %v", name, v, r.Header)
	}
	return v[0]
}

func oneInt(t *testing.T, r response, name string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(one(t, r, name), 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return n
}

// noRateLimitHeaders fails the test when r carries any rate-limit header,
// empty ones included.
func noRateLimitHeaders(t *testing.T, what string, r response) {
	t.Helper()
	for _, h := range rateLimitHeaders {
		if v, ok := r.Header[http.CanonicalHeaderKey(h)]; ok {
			t.Errorf("%s: %s: %q, want none", what, h, v)
		}
	}
}

func TestNginx(t *testing.T) {
	t.Parallel()
	testProxy(t, "nginx", startNginx)
}

func TestCaddy(t *testing.T) {
	t.Parallel()
	testProxy(t, "caddy", startCaddy)
}

// testProxy runs the scenarios through one proxy kind. They run in order:
// the last kills the gateways.
func testProxy(t *testing.T, kind string, startProxy startProxyFunc) {
	w := newWorld(t, rules, startProxy)
	clientA, clientB := client(t, "127.0.0.2"), client(t, "127.0.0.3")

	t.Run("five 200s then 429 with Retry-After", func(t *testing.T) {
		key := "sk_five_" + kind
		for i := range 5 {
			r := send(t, clientA, "GET", w.viaTrusted+"/v1/users/42", "", "X-API-Key", key)
			if r.StatusCode != http.StatusOK || !strings.HasPrefix(r.body, "upstream GET /v1/users/42") {
				t.Fatalf("request %d: %d %q", i+1, r.StatusCode, r.body)
			}
			// Tollgate's headers, replacing the upstream's own.
			if oneInt(t, r, "X-RateLimit-Limit") != 5 || oneInt(t, r, "X-RateLimit-Remaining") != int64(4-i) ||
				oneInt(t, r, "X-RateLimit-Used") != int64(i+1) || oneInt(t, r, "X-RateLimit-Reset") <= time.Now().Unix()-1 ||
				one(t, r, "X-RateLimit-Resource") != "five" || one(t, r, "RateLimit-Policy") != `"five";q=5;w=10` ||
				!strings.HasPrefix(one(t, r, "RateLimit"), fmt.Sprintf(`"five";r=%d`, 4-i)) || r.Header.Get("Retry-After") != "" {
				t.Fatalf("request %d headers: %v", i+1, r.Header)
			}
		}
		r := send(t, clientA, "GET", w.viaTrusted+"/v1/users/42", "", "X-API-Key", key)
		rejectedAt := time.Now()
		if r.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("sixth: %d %q, want 429", r.StatusCode, r.body)
		}
		ra := oneInt(t, r, "Retry-After")
		eb := decodeError(t, r)
		// One unit refills every 2 s: an honest Retry-After is 1 or 2.
		if ra < 1 || ra > 2 || eb.Error.Code != "RATE_LIMIT_EXCEEDED" || eb.Error.Details.Rule != "five" ||
			eb.Error.Details.RetryAfterSeconds != ra || oneInt(t, r, "X-RateLimit-Remaining") != 0 ||
			one(t, r, "X-RateLimit-Resource") != "five" || r.Header.Get("RateLimit") == "" {
			t.Fatalf("429: Retry-After %d, headers %v, body %s", ra, r.Header, r.body)
		}
		if strings.Contains(r.body, "upstream") {
			t.Fatalf("the upstream answered a rejected request: %s", r.body)
		}
		// A client that waits exactly Retry-After and retries once is
		// admitted.
		waitUntil(t, rejectedAt.Add(time.Duration(ra)*time.Second))
		if r := send(t, clientA, "GET", w.viaTrusted+"/v1/users/42", "", "X-API-Key", key); r.StatusCode != http.StatusOK {
			t.Fatalf("after Retry-After %ds: %d %s", ra, r.StatusCode, r.body)
		}
	})

	t.Run("blocked key 403", func(t *testing.T) {
		r := send(t, clientA, "GET", w.viaTrusted+"/v1/x", "", "X-API-Key", "sk_revoked_"+kind)
		if r.StatusCode != http.StatusForbidden || decodeError(t, r).Error.Code != "KEY_BLOCKED" {
			t.Fatalf("%d %s", r.StatusCode, r.body)
		}
		noRateLimitHeaders(t, "blocked", r)
	})

	t.Run("invalid path 400", func(t *testing.T) {
		r := send(t, clientA, "GET", w.viaTrusted+"/v1/a%2Fb", "", "X-API-Key", "sk_five_path_"+kind)
		if r.StatusCode != http.StatusBadRequest || decodeError(t, r).Error.Code != "INVALID_PATH" {
			t.Fatalf("%d %s", r.StatusCode, r.body)
		}
	})

	t.Run("no rule, no headers", func(t *testing.T) {
		r := send(t, clientA, "GET", w.viaTrusted+"/v1/x", "", "X-API-Key", "sk_nobody")
		if r.StatusCode != http.StatusOK || !strings.HasPrefix(r.body, "upstream") {
			t.Fatalf("%d %s", r.StatusCode, r.body)
		}
		// Not even the upstream's own: Tollgate owns the names.
		noRateLimitHeaders(t, "no rule", r)
	})

	t.Run("key from the forwarded query", func(t *testing.T) {
		r := send(t, clientA, "GET", w.viaTrusted+"/v1/x?page=2&api_key=sk_revoked_q", "")
		if r.StatusCode != http.StatusForbidden {
			t.Fatalf("revoked key in the query: %d %s", r.StatusCode, r.body)
		}
		r = send(t, clientA, "GET", w.viaTrusted+"/v1/x?api_key=sk_five_q_"+kind, "")
		if r.StatusCode != http.StatusOK || one(t, r, "X-RateLimit-Resource") != "five" ||
			!strings.HasPrefix(r.body, "upstream GET /v1/x?api_key=") {
			t.Fatalf("key in the query: %d %v %s", r.StatusCode, r.Header, r.body)
		}
	})

	t.Run("method and body", func(t *testing.T) {
		key := "sk_post_" + kind
		r := send(t, clientA, "POST", w.viaTrusted+"/v1/orders", "hello", "X-API-Key", key, "Authorization", "Bearer not-the-key")
		if r.StatusCode != http.StatusOK || one(t, r, "X-RateLimit-Resource") != "posts" || r.body != `upstream POST /v1/orders body="hello"` {
			t.Fatalf("POST: %d %v %s", r.StatusCode, r.Header, r.body)
		}
		// The bearer source: the client's Authorization reaches Tollgate.
		r = send(t, clientA, "POST", w.viaTrusted+"/v1/orders", "", "Authorization", "Bearer "+key)
		if r.StatusCode != http.StatusOK || oneInt(t, r, "X-RateLimit-Remaining") != 98 {
			t.Fatalf("POST, bearer key: %d %v %s", r.StatusCode, r.Header, r.body)
		}
		if r := send(t, clientA, "GET", w.viaTrusted+"/v1/orders", "", "X-API-Key", key); r.StatusCode != http.StatusOK {
			t.Fatalf("GET: %d %s", r.StatusCode, r.body)
		} else {
			noRateLimitHeaders(t, "GET matches no POST rule", r)
		}
	})

	t.Run("client IP from X-Forwarded-For only behind a trusted proxy", func(t *testing.T) {
		// per-ip allows two requests per client IP. Client A's spoofed
		// X-Forwarded-For changes every time; the proxy appends (nginx) or
		// sets (Caddy) A's real address, which a trusted proxy's Tollgate
		// uses: A's third request is over, B has a counter of its own.
		status := func(c *http.Client, base string, i int) int {
			return send(t, c, "GET", base+"/ip/x", "", "X-Forwarded-For", fmt.Sprintf("203.0.113.%d", i)).StatusCode
		}
		got := []int{status(clientA, w.viaTrusted, 1), status(clientA, w.viaTrusted, 2), status(clientA, w.viaTrusted, 3), status(clientB, w.viaTrusted, 4)}
		if fmt.Sprint(got) != "[200 200 429 200]" {
			t.Fatalf("trusted proxy: A, A, A, B got %v, want [200 200 429 200]", got)
		}
		// Untrusted, the proxy's own address is every client's: A and B
		// share one counter. (The proxy proves itself with the token here.)
		got = []int{status(clientA, w.viaUntrusted, 5), status(clientB, w.viaUntrusted, 6), status(clientB, w.viaUntrusted, 7)}
		if fmt.Sprint(got) != "[200 200 429]" {
			t.Fatalf("untrusted proxy: A, B, B got %v, want [200 200 429]", got)
		}
	})

	if kind == "caddy" {
		t.Run("problem+json", func(t *testing.T) {
			r := send(t, clientA, "GET", w.viaTrusted+"/v1/x", "", "X-API-Key", "sk_revoked_p", "Accept", "application/problem+json")
			if r.StatusCode != http.StatusForbidden || r.Header.Get("Content-Type") != "application/problem+json" {
				t.Fatalf("%d %v %s", r.StatusCode, r.Header, r.body)
			}
		})
	}

	t.Run("gateway hangs: fail open after the timeout", func(t *testing.T) {
		// The shipped timeouts: an answer within 1 s, or Tollgate is down.
		via := "http://" + startProxy(t, hangingServer(t), strings.TrimPrefix(w.upstream.URL, "http://"))
		start := time.Now()
		r := send(t, clientA, "GET", via+"/v1/users/42", "", "X-API-Key", "sk_five_"+kind)
		if took := time.Since(start); r.StatusCode != http.StatusOK || !strings.HasPrefix(r.body, "upstream GET /v1/users/42") || took > 5*time.Second {
			t.Fatalf("with Tollgate hanging: %d %q after %v, want the upstream's 200 after about 1 s", r.StatusCode, r.body, took)
		}
		noRateLimitHeaders(t, "failing open", r)
	})

	t.Run("gateway killed: fail open", func(t *testing.T) {
		w.trusted.kill()
		w.untrusted.kill()
		for i, base := range []string{w.viaTrusted, w.viaTrusted, w.viaUntrusted} {
			r := send(t, clientA, "GET", base+"/v1/users/42", "", "X-API-Key", "sk_five_"+kind)
			if r.StatusCode != http.StatusOK || !strings.HasPrefix(r.body, "upstream GET /v1/users/42") {
				t.Fatalf("request %d with Tollgate down: %d %q, want the upstream's 200", i, r.StatusCode, r.body)
			}
			noRateLimitHeaders(t, "failing open", r)
		}
	})
}
