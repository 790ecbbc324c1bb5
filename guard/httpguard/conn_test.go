package httpguard

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/memstore"
	"github.com/tollgate/tollgate/guard/rules"
)

// rawConn sends requests on one TCP connection and reads the answers, so
// a test sees exactly which answer closes the connection.
type rawConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{t: t, c: c, br: bufio.NewReader(c)}
}

// do sends one request with headers and returns its response (body read).
func (rc *rawConn) do(header string) *http.Response {
	rc.t.Helper()
	if _, err := fmt.Fprintf(rc.c, "GET /v1/x HTTP/1.1\r\nHost: t\r\n%s\r\n", header); err != nil {
		rc.t.Fatalf("write: %v", err)
	}
	resp, err := http.ReadResponse(rc.br, nil)
	if err != nil {
		rc.t.Fatalf("read: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// closedByPeer reports whether the server has closed the connection.
func (rc *rawConn) closedByPeer() bool {
	_, err := rc.br.ReadByte()
	return err == io.EOF
}

// A tracked connection is closed at its closeAfter-th rejection asking for
// it, not before, and only where the peer is the client: a trusted proxy's
// connection is shared and stays open however many it carries.
func TestTrackedConnectionClosesAfterN(t *testing.T) {
	t.Parallel()
	top := guard.Decision{Status: 429, Code: guard.CodePenalty, Reason: guard.ReasonPenalty, Deciding: -1,
		RetryAfter: 60, PenaltyLevel: 3, CloseConnection: true}
	level2 := top
	level2.PenaltyLevel, level2.CloseConnection = 2, false
	blocked := guard.Decision{Status: 403, Code: guard.CodeKeyBlocked, Reason: guard.ReasonBlocklisted, Deciding: -1,
		PenaltyLevel: 3, CloseConnection: true}

	for _, tc := range []struct {
		name       string
		d          guard.Decision
		trusted    bool
		closeAfter int
		closesAt   int // 0: never within 6 requests
	}{
		{"top penalty, direct", top, false, 3, 3},
		{"top block, direct", blocked, false, 3, 3},
		{"close at once", top, false, 1, 1},
		{"top penalty, trusted proxy", top, true, 3, 0},
		{"level 2 never closes", level2, false, 3, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var closes atomic.Int32
			id := &Identity{}
			if tc.trusted {
				id.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
			}
			h := Middleware(decide(tc.d), WithIdentity(id), WithOnClose(func(r *http.Request, d *guard.Decision) {
				if d.PenaltyLevel != 3 {
					t.Errorf("OnClose got level %d", d.PenaltyLevel)
				}
				closes.Add(1)
			}))(http.NotFoundHandler())
			srv := httptest.NewUnstartedServer(h)
			srv.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
				return TrackConn(ctx, tc.closeAfter)
			}
			srv.Start()
			t.Cleanup(srv.Close)

			for conn := range 2 { // the count starts afresh on a new connection
				rc := dialRaw(t, srv.Listener.Addr().String())
				for i := 1; i <= 6; i++ {
					resp := rc.do("X-API-Key: sk_x\r\nX-Forwarded-For: 192.0.2.7\r\n")
					if resp.StatusCode != tc.d.Status {
						t.Fatalf("conn %d request %d: status %d", conn, i, resp.StatusCode)
					}
					if resp.Close != (i == tc.closesAt) {
						t.Fatalf("conn %d request %d: Connection: close %v, want it at request %d", conn, i, resp.Close, tc.closesAt)
					}
					if resp.Close {
						if !rc.closedByPeer() {
							t.Fatalf("conn %d: answered Connection: close but left open", conn)
						}
						break
					}
				}
			}
			want := int32(0)
			if tc.closesAt > 0 {
				want = 2
			}
			if got := closes.Load(); got != want {
				t.Errorf("OnClose called %d times, want %d", got, want)
			}
		})
	}
}

// A prebuilt answer is exactly what WriteDecision writes, for every code,
// body format and Retry-After, through the cache's hits and collisions.
func TestPrebuiltAnswersMatchWriteDecision(t *testing.T) {
	t.Parallel()
	a := &answers{}
	var decisions []guard.Decision
	for _, ra := range []int64{0, 1, 2, 59, 60 + answerSlots/4, 900, 86_400} {
		decisions = append(decisions,
			guard.Decision{Status: 429, Code: guard.CodePenalty, Reason: guard.ReasonPenalty, Deciding: -1, RetryAfter: ra, PenaltyLevel: 2},
			guard.Decision{Status: 429, Reason: guard.ReasonPenalty, Deciding: -1, RetryAfter: ra})
	}
	// The penalty ladder's answers state level, end and reason: answers
	// that differ in any of them never share a cached body.
	until := time.Date(2026, 11, 27, 19, 21, 2, 0, time.UTC).UnixMicro()
	for _, why := range []string{"", "20 of 20 requests in 60s arrived while a Retry-After was running (100%)", "120 of 130 requests in 60s were rejected (92%)"} {
		for _, end := range []int64{until, until + 1_000_000, math.MaxInt64} {
			decisions = append(decisions,
				guard.Decision{Status: 429, Code: guard.CodePenalty, Reason: guard.ReasonPenalty, Deciding: -1, RetryAfter: 900,
					PenaltyLevel: 2, PenaltyReason: why, PenaltyUntil: end},
				guard.Decision{Status: 403, Code: guard.CodeKeyBlocked, Reason: guard.ReasonBlocklisted, Deciding: -1,
					PenaltyLevel: 3, PenaltyReason: why, PenaltyUntil: end, CloseConnection: true})
		}
	}
	decisions = append(decisions,
		guard.Decision{Status: 403, Code: guard.CodeKeyBlocked, Reason: guard.ReasonBlocklisted, Deciding: -1},
		guard.Decision{Status: 403, Code: guard.CodeKeyBlocked, Reason: guard.ReasonBlocklisted, Deciding: -1, PenaltyLevel: 3, CloseConnection: true},
		guard.Decision{Status: 403, Code: guard.CodeKeyBlocked, Reason: guard.ReasonBlocklisted, Deciding: -1, PenaltyLevel: 2, CloseConnection: true})
	for round := range 2 { // built, then from the cache
		for _, d := range decisions {
			for _, accept := range []string{"", "application/problem+json"} {
				r := httptest.NewRequest(http.MethodGet, "/", nil)
				if accept != "" {
					r.Header.Set("Accept", accept)
				}
				want := httptest.NewRecorder()
				want.Header().Set("X-RateLimit-Limit", "stale")
				WriteDecision(want, r, &d)
				p := a.get(r, &d)
				if p == nil {
					t.Fatalf("no prebuilt answer for %+v", d)
				}
				got := httptest.NewRecorder()
				got.Header().Set("X-RateLimit-Limit", "stale")
				p.write(got)
				name := fmt.Sprintf("round %d, %s retry %d, accept %q", round, d.Code, d.RetryAfter, accept)
				if got.Code != want.Code || got.Body.String() != want.Body.String() {
					t.Errorf("%s: got %d %s, want %d %s", name, got.Code, got.Body, want.Code, want.Body)
				}
				gh, wh := got.Header().Clone(), want.Header().Clone()
				gh.Del("Content-Length")
				for k, v := range wh {
					if !slices.Equal(gh[k], v) {
						t.Errorf("%s: header %s = %q, want %q", name, k, gh[k], v)
					}
				}
				if len(gh) != len(wh) {
					t.Errorf("%s: headers %v, want %v", name, gh, wh)
				}
			}
		}
	}
	// Decisions that name rules are rendered each time.
	for _, d := range []guard.Decision{rejectedDecision(),
		{Status: 403, Code: guard.CodeKeyBlocked, Reason: guard.ReasonBlockRule, RefusingRule: "banned", Deciding: -1},
		{Status: 400, Code: guard.CodeInvalidPath, Reason: guard.ReasonInvalidPath, Deciding: -1}} {
		if p := a.get(httptest.NewRequest(http.MethodGet, "/", nil), &d); p != nil {
			t.Errorf("prebuilt answer for %s %s", d.Code, d.Reason)
		}
	}
}

// An answer through the middleware, prebuilt or not, reads the same to a
// client: same body, Retry-After and no rate-limit headers.
func TestMiddlewarePrebuiltBody(t *testing.T) {
	t.Parallel()
	d := guard.Decision{Status: 429, Code: guard.CodePenalty, Reason: guard.ReasonPenalty, Deciding: -1, RetryAfter: 61}
	rec := httptest.NewRecorder()
	Middleware(decide(d))(http.NotFoundHandler()).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	var body errorBody
	decodeStrict(t, rec.Body.String(), &body)
	if rec.Code != 429 || body.Error.Code != guard.CodePenalty || rec.Header().Get("Retry-After") != "61" ||
		!strings.Contains(body.Error.Message, "61 seconds") {
		t.Errorf("status %d, body %s, Retry-After %q", rec.Code, rec.Body, rec.Header().Get("Retry-After"))
	}
}

// BenchmarkMiddlewareWithGuard answers keys the guard decides from its
// controls — a level 2 penalty, a level 3 block — through the middleware
// and a real guard (no store call): what a penalised storm costs beyond
// net/http. The guard's own allocations (the key's HMAC and prefix) are
// the guard's; the middleware adds none.
func BenchmarkMiddlewareWithGuard(b *testing.B) {
	set, err := rules.Load([]byte("rules:\n  - {id: all, capacity: 100, rate: 100/1m}\n"))
	if err != nil {
		b.Fatal(err)
	}
	g, err := guard.New(memstore.New(), []byte("bench-secret-0123456789"), set)
	if err != nil {
		b.Fatal(err)
	}
	until := time.Now().Add(time.Hour).UnixMicro()
	g.Controls().SetPenalty(g.KeyID("sk_penalised"), guard.Penalty{Level: 2, Until: until})
	g.Controls().Block(g.KeyID("sk_top"), guard.Entry{Level: 3, Close: true, Expiry: until})
	for _, bc := range []struct {
		key    string
		status int
	}{{"sk_penalised", 429}, {"sk_top", 403}} {
		b.Run(bc.key, func(b *testing.B) {
			serveParallel(b, Middleware(g)(http.NotFoundHandler()), bc.key, func(r *http.Request) *http.Request {
				return r.WithContext(TrackConn(context.Background(), 1<<40))
			}, bc.status)
		})
	}
}
