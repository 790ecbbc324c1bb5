package httpguard

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/netip"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/guard"
)

// upstreamHandler plays an upstream API that sets rate-limit headers of
// its own under Tollgate's names.
func upstreamHandler(called *atomic.Int32) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		called.Add(1)
		h := w.Header()
		h.Set("X-RateLimit-Limit", "999")
		h.Add("X-RateLimit-Remaining", "998")
		h.Add("X-RateLimit-Remaining", "997")
		h.Set("X-RateLimit-Policy", "upstream")
		h.Set("RateLimit", `"upstream";r=1`)
		h.Set("RateLimit-Policy", `"upstream";q=1000`)
		h.Set("Retry-After", "30")
		h.Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, "upstream body")
	})
}

func TestMiddleware(t *testing.T) {
	t.Parallel()
	penalty := guard.Decision{Status: 429, Code: guard.CodePenalty, Reason: guard.ReasonPenalty, Deciding: -1, RetryAfter: 900, CloseConnection: true}
	blocked := guard.Decision{Status: 403, Code: guard.CodeKeyBlocked, Reason: guard.ReasonBlocklisted, Deciding: -1}
	trustedID := &Identity{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}

	tests := []struct {
		name       string
		checker    guard.Checker
		opts       []Option
		remote     string
		header     [][2]string
		status     int
		called     bool
		want       wantHeaders
		code       string // error body code
		connClose  bool
		bodyPrefix string
	}{
		{
			name: "allowed replaces upstream headers", checker: decide(allowedDecision()),
			header: [][2]string{{"X-API-Key", "sk_a"}}, status: 202, called: true, bodyPrefix: "upstream body",
			want: wantHeaders{limit: "30", remaining: "12", used: "18", reset: "1700000036", resource: "search", retryAfter: "30",
				policy:    map[string]map[string]int64{"tenant-total": {"q": 10000, "w": 60}, "search": {"q": 30, "w": 60}},
				rateLimit: map[string]map[string]int64{"tenant-total": {"r": 9000, "t": 1}, "search": {"r": 12, "t": 2}},
			},
		},
		{
			name:    "allowlisted removes upstream headers",
			checker: decide(guard.Decision{Allowed: true, Status: 200, Reason: guard.ReasonAllowlisted, Deciding: -1}),
			status:  202, called: true, bodyPrefix: "upstream body", want: wantHeaders{retryAfter: "30"},
		},
		{
			name: "degraded", checker: decide(failOpenDecision()), status: 202, called: true, bodyPrefix: "upstream body",
			want: wantHeaders{limit: "100", remaining: "-1", used: "0", reset: "0", resource: "free-default", xpolicy: "degraded",
				retryAfter: "30", policy: map[string]map[string]int64{"free-default": {"q": 100, "w": 60}}},
		},
		{
			name: "rate limited", checker: decide(rejectedDecision()), status: 429, code: guard.CodeRateLimitExceeded,
			want: wantHeaders{limit: "30", remaining: "0", used: "30", reset: "1700000060", resource: "search", retryAfter: "7",
				policy:    map[string]map[string]int64{"tenant-total": {"q": 10000, "w": 60}, "search": {"q": 30, "w": 60}, "burst": {"q": 5, "w": 1}},
				rateLimit: map[string]map[string]int64{"tenant-total": {"r": 9000, "t": 1}, "search": {"r": 0, "t": 2}, "burst": {"r": 0, "t": 1}},
			},
		},
		{
			name: "penalty closes a direct connection", checker: decide(penalty), status: 429, code: guard.CodePenalty,
			want: wantHeaders{retryAfter: "900"}, connClose: true,
		},
		{
			name: "penalty keeps a proxy's connection", checker: decide(penalty), opts: []Option{WithIdentity(trustedID)},
			remote: "10.0.0.1:1234", header: [][2]string{{"X-Forwarded-For", "192.0.2.1"}},
			status: 429, code: guard.CodePenalty, want: wantHeaders{retryAfter: "900"},
		},
		{
			name: "blocked", checker: decide(blocked), status: 403, code: guard.CodeKeyBlocked, connClose: true,
		},
		{
			name: "invalid key", checker: decide(allowedDecision()), header: [][2]string{{"X-API-Key", "sk_" + strings.Repeat("x", 300)}},
			status: 400, code: guard.CodeInvalidKey,
		},
		{
			name: "invalid cost", checker: decide(allowedDecision()),
			opts:   []Option{WithIdentity(&Identity{TrustedProxies: trustedID.TrustedProxies, CostHeader: "X-Cost"})},
			remote: "10.0.0.1:1234", header: [][2]string{{"X-Cost", "many"}},
			status: 400, code: guard.CodeInvalidRequest,
		},
		{
			name:    "checker error fails open",
			checker: &fakeChecker{fn: func(*guard.Request, *guard.Decision) error { return errors.New("redis: down") }},
			status:  202, called: true, bodyPrefix: "upstream body",
		},
		{
			name:    "checker error handler",
			checker: &fakeChecker{fn: func(*guard.Request, *guard.Decision) error { return errors.New("redis: down") }},
			opts: []Option{WithErrorHandler(func(w http.ResponseWriter, r *http.Request, _ http.Handler, _ error) {
				WriteError(w, r, http.StatusServiceUnavailable, "UNAVAILABLE", "Try again later.")
			})},
			status: 503, code: "UNAVAILABLE",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var called atomic.Int32
			h := Middleware(tt.checker, tt.opts...)(upstreamHandler(&called))
			r := httptest.NewRequest(http.MethodGet, "/v1/search?q=x", nil)
			if tt.remote != "" {
				r.RemoteAddr = tt.remote
			}
			for _, kv := range tt.header {
				r.Header.Add(kv[0], kv[1])
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, r)

			if rec.Code != tt.status {
				t.Errorf("status = %d, want %d", rec.Code, tt.status)
			}
			if got := called.Load() == 1; got != tt.called {
				t.Errorf("handler called = %v, want %v", got, tt.called)
			}
			if got := rec.Header().Get("Connection") == "close"; got != tt.connClose {
				t.Errorf("Connection: close = %v, want %v", got, tt.connClose)
			}
			if tt.code != "" {
				var body errorBody
				decodeStrict(t, rec.Body.String(), &body)
				if body.Error.Code != tt.code {
					t.Errorf("code = %q, want %q", body.Error.Code, tt.code)
				}
				return
			}
			if !strings.HasPrefix(rec.Body.String(), tt.bodyPrefix) {
				t.Errorf("body = %q", rec.Body.String())
			}
			if tt.name == "checker error fails open" {
				// The upstream's own headers pass untouched.
				if got := rec.Header().Values("X-RateLimit-Remaining"); len(got) != 2 {
					t.Errorf("X-RateLimit-Remaining = %q, want the upstream's two", got)
				}
				return
			}
			checkHeaders(t, rec.Header(), tt.want)
		})
	}
}

// The identity reaches the Checker, and through a real server the
// headers of the decision replace the handler's on the wire.
func TestMiddlewareServer(t *testing.T) {
	t.Parallel()
	var (
		mu   sync.Mutex
		seen []guard.Request
	)
	c := &fakeChecker{fn: func(req *guard.Request, d *guard.Decision) error {
		mu.Lock()
		seen = append(seen, *req)
		mu.Unlock()
		*d = allowedDecision()
		return nil
	}}
	var called atomic.Int32
	id := &Identity{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}}
	srv := httptest.NewServer(Middleware(c, WithIdentity(id))(upstreamHandler(&called)))
	t.Cleanup(srv.Close)

	req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/orders/7?x=1", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer sk_prod_acme_1")
	req.Header.Set("X-Forwarded-For", "203.0.113.9")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted || string(body) != "upstream body" {
		t.Fatalf("response %d %q", resp.StatusCode, body)
	}
	checkHeaders(t, resp.Header, wantHeaders{limit: "30", remaining: "12", used: "18", reset: "1700000036", resource: "search",
		retryAfter: "30",
		policy:     map[string]map[string]int64{"tenant-total": {"q": 10000, "w": 60}, "search": {"q": 30, "w": 60}},
		rateLimit:  map[string]map[string]int64{"tenant-total": {"r": 9000, "t": 1}, "search": {"r": 12, "t": 2}},
	})
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 {
		t.Fatalf("checker saw %d requests", len(seen))
	}
	got := seen[0]
	if got.Key != "sk_prod_acme_1" || got.IP.String() != "203.0.113.9" || got.Path != "/v1/orders/7" || got.Method != "POST" {
		t.Errorf("checker saw %+v", got)
	}
}

// A penalty answered to a directly connected client closes the
// connection; the client sees it.
func TestMiddlewarePenaltyClosesConnection(t *testing.T) {
	t.Parallel()
	c := decide(guard.Decision{Status: 429, Code: guard.CodePenalty, Reason: guard.ReasonPenalty, Deciding: -1, RetryAfter: 5, CloseConnection: true})
	srv := httptest.NewServer(Middleware(c)(http.NotFoundHandler()))
	t.Cleanup(srv.Close)
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 429 || !resp.Close || resp.Header.Get("Retry-After") != "5" {
		t.Errorf("status %d, Close %v, Retry-After %q", resp.StatusCode, resp.Close, resp.Header.Get("Retry-After"))
	}
}

// The wrapper sets headers at each way a handler can start the response.
func TestMiddlewareWriter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		handler http.HandlerFunc
		status  int
		flushed bool
	}{
		{"implicit 200", func(w http.ResponseWriter, r *http.Request) { w.Header().Set("X-RateLimit-Limit", "1") }, 200, false},
		{"write", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-RateLimit-Limit", "1")
			w.Write([]byte("x"))
		}, 200, false},
		{"in-place edit", func(w http.ResponseWriter, r *http.Request) {
			w.Header()["X-Ratelimit-Limit"][0] = "1"
			w.WriteHeader(201)
		}, 201, false},
		{"read from", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-RateLimit-Limit", "1")
			w.(io.ReaderFrom).ReadFrom(strings.NewReader("x"))
		}, 200, false},
		{"flusher", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-RateLimit-Limit", "1")
			w.(http.Flusher).Flush()
		}, 200, true},
		{"response controller", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-RateLimit-Limit", "1")
			if err := http.NewResponseController(w).Flush(); err != nil {
				panic(err)
			}
		}, 200, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := Middleware(decide(allowedDecision()))(tt.handler)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
			if rec.Code != tt.status || rec.Flushed != tt.flushed {
				t.Errorf("status %d flushed %v, want %d %v", rec.Code, rec.Flushed, tt.status, tt.flushed)
			}
			// The recorder snapshots the header at WriteHeader.
			if got := rec.Result().Header.Values("X-RateLimit-Limit"); len(got) != 1 || got[0] != "30" {
				t.Errorf("X-RateLimit-Limit = %q, want 30", got)
			}
		})
	}
}

// An informational response does not count as the response header: the
// final one still gets the decision's headers.
func TestMiddlewareEarlyHints(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(Middleware(decide(allowedDecision()))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</a.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Set("X-RateLimit-Limit", "1")
		w.WriteHeader(204)
	})))
	t.Cleanup(srv.Close)
	var hints atomic.Int32
	req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(t.Context(), &httptrace.ClientTrace{
		Got1xxResponse: func(code int, _ textproto.MIMEHeader) error {
			hints.Add(1)
			return nil
		},
	}), http.MethodGet, srv.URL, nil)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 204 || hints.Load() != 1 || resp.Header.Get("X-RateLimit-Limit") != "30" {
		t.Errorf("status %d, %d hints, X-RateLimit-Limit %q", resp.StatusCode, hints.Load(), resp.Header.Get("X-RateLimit-Limit"))
	}
}

// http.ResponseController reaches the server's writer through Unwrap, and
// hijacking works for HTTP/1.
func TestMiddlewareUnwrap(t *testing.T) {
	t.Parallel()
	mw := Middleware(decide(allowedDecision()))
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		if err := rc.SetWriteDeadline(time.Now().Add(time.Minute)); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		if r.URL.Path != "/hijack" {
			w.WriteHeader(204)
			return
		}
		conn, brw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n\r\nhijacked")
		brw.Flush()
	})))
	t.Cleanup(srv.Close)

	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 204 || resp.Header.Get("X-RateLimit-Remaining") != "12" {
		t.Errorf("status %d, X-RateLimit-Remaining %q", resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"))
	}

	resp, err = srv.Client().Get(srv.URL + "/hijack")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "hijacked" {
		t.Errorf("hijacked body = %q", body)
	}
}

// Pooled decisions never leak between concurrent requests.
func TestMiddlewareConcurrent(t *testing.T) {
	t.Parallel()
	c := &fakeChecker{fn: func(req *guard.Request, d *guard.Decision) error {
		n, err := strconv.Atoi(strings.TrimPrefix(req.Key, "sk_"))
		if err != nil {
			return err
		}
		if len(d.Rules) != 0 || d.Deciding != -1 || d.KeyID != "" {
			return fmt.Errorf("decision not reset: %+v", d)
		}
		rules := d.Rules[:0]
		for i := range n%4 + 1 {
			rules = append(rules, guard.RuleResult{ID: fmt.Sprintf("r%d-%d", n, i), Allowed: true, Limit: int64(n), Remaining: int64(i), Window: 1})
		}
		*d = guard.Decision{Allowed: true, Status: 200, Rules: rules, Deciding: 0, KeyID: req.Key}
		return nil
	}}
	h := Middleware(c, WithErrorHandler(func(w http.ResponseWriter, _ *http.Request, _ http.Handler, err error) {
		http.Error(w, err.Error(), 500)
	}))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))

	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				n := g*1000 + i
				r := httptest.NewRequest(http.MethodGet, "/", nil)
				r.Header.Set("X-API-Key", "sk_"+strconv.Itoa(n))
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, r)
				if rec.Code != 200 {
					t.Errorf("request %d: %d %s", n, rec.Code, rec.Body)
					return
				}
				items, err := parseSFList(rec.Header().Get("RateLimit-Policy"))
				if err != nil || len(items) != n%4+1 || items[0].Value != fmt.Sprintf("r%d-0", n) {
					t.Errorf("request %d: RateLimit-Policy %q (%v)", n, rec.Header().Get("RateLimit-Policy"), err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// Keys never reach the log, whatever goes wrong.
func TestMiddlewareLogsNoKeys(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(&lockedWriter{w: &buf, mu: &mu}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	failing := &fakeChecker{fn: func(*guard.Request, *guard.Decision) error { return errors.New("store: timeout") }}
	h := Middleware(failing, WithLogger(log))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))

	const key = "sk_live_topsecret_0123456789"
	for _, v := range []string{key, key + " with space", key + strings.Repeat("x", 300)} {
		r := httptest.NewRequest(http.MethodGet, "/?api_key="+key, nil)
		r.Header.Set("X-API-Key", v)
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	mu.Lock()
	defer mu.Unlock()
	out := buf.String()
	if !strings.Contains(out, "store: timeout") || !strings.Contains(out, "INVALID_KEY") {
		t.Errorf("log lacks the events:\n%s", out)
	}
	if strings.Contains(out, "topsecret") {
		t.Errorf("log contains the key:\n%s", out)
	}
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func BenchmarkMiddleware(b *testing.B) {
	for _, bc := range []struct {
		name string
		d    guard.Decision
	}{
		{"allowed", allowedDecision()},
		{"rejected", rejectedDecision()},
		// Answered from the controls: prebuilt.
		{"penalty", guard.Decision{Status: 429, Code: guard.CodePenalty, Reason: guard.ReasonPenalty, Deciding: -1, RetryAfter: 900}},
		{"blocked", guard.Decision{Status: 403, Code: guard.CodeKeyBlocked, Reason: guard.ReasonBlocklisted, Deciding: -1}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			h := Middleware(decide(bc.d))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(204)
			}))
			serveParallel(b, h, "sk_prod_acme_1", nil, map[bool]int{true: 204, false: bc.d.Status}[bc.d.Allowed])
		})
	}
}

// serveParallel has b's parallel goroutines serve GET /v1/search with key
// as X-API-Key through h, each its own request (changed by prepare unless
// nil), and fails if an answer's status is not want.
func serveParallel(b *testing.B, h http.Handler, key string, prepare func(*http.Request) *http.Request, want int) {
	b.Helper()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		r := httptest.NewRequest(http.MethodGet, "/v1/search", nil)
		r.Header.Set("X-API-Key", key)
		if prepare != nil {
			r = prepare(r)
		}
		w := &discardWriter{h: http.Header{}}
		n := 0
		for pb.Next() {
			clear(w.h)
			h.ServeHTTP(w, r)
			n++
		}
		if n > 0 && w.code != want {
			b.Fatalf("status %d, want %d", w.code, want)
		}
	})
}

// discardWriter is a minimal ResponseWriter for benchmarks.
type discardWriter struct {
	h    http.Header
	code int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(code int)        { w.code = code }
