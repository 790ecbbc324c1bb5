package httpguard

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/memstore"
	"github.com/tollgate/tollgate/guard/rules"
)

// seenRequest is what a handler behind the middleware was given.
type seenRequest struct{ path, rawPath, escaped, requestURI string }

func recordingHandler(seen *seenRequest) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		*seen = seenRequest{r.URL.Path, r.URL.RawPath, r.URL.EscapedPath(), r.RequestURI}
		w.WriteHeader(http.StatusNoContent)
	})
}

func pathGuard(t *testing.T, rs string, opts ...guard.Option) *guard.Guard {
	t.Helper()
	set, err := rules.Load([]byte(rs))
	if err != nil {
		t.Fatal(err)
	}
	g, err := guard.New(memstore.New(), []byte("path-test-secret-0123456789"), set, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestMiddlewareNormalisesPath: the handler sees the path the limiter
// counted, every spelling of a blocked endpoint is blocked, and
// paths that cannot be normalised are refused with 400 INVALID_PATH.
func TestMiddlewareNormalisesPath(t *testing.T) {
	t.Parallel()
	g := pathGuard(t, `
rules:
  - {id: v0-gone, match: {endpoint: "^/v0/"}, block: true}
  - {id: all, capacity: 100, rate: 100/1m}
`)
	tests := []struct {
		target     string
		status     int
		code       string
		path       string // URL.Path the handler sees
		requestURI string
	}{
		{"/v1/search?q=1", 204, "", "/v1/search", "/v1/search?q=1"},
		{"//v1/search?q=1", 204, "", "/v1/search", "/v1/search?q=1"},
		{"/v1/./search/", 204, "", "/v1/search/", "/v1/search/"},
		{"/v1/x/../search", 204, "", "/v1/search", "/v1/search"},
		{"/v1/%73earch", 204, "", "/v1/search", "/v1/search"},
		{"/v1/a%20b", 204, "", "/v1/a b", "/v1/a%20b"},
		{"/v0/x", 403, guard.CodeEndpointBlocked, "", ""},
		{"//v0/x", 403, guard.CodeEndpointBlocked, "", ""},
		{"/./v0/x", 403, guard.CodeEndpointBlocked, "", ""},
		{"/v1/../v0/x", 403, guard.CodeEndpointBlocked, "", ""},
		{"/v1/a%2Fb", 400, guard.CodeInvalidPath, "", ""},
		{"/v1/a%5cb", 400, guard.CodeInvalidPath, "", ""},
		{"/v1/a%00", 400, guard.CodeInvalidPath, "", ""},
		{"/../etc/passwd", 400, guard.CodeInvalidPath, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.target, func(t *testing.T) {
			t.Parallel()
			var seen seenRequest
			h := Middleware(g)(recordingHandler(&seen))
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tt.target, nil))
			if rec.Code != tt.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tt.status, rec.Body)
			}
			if tt.code != "" {
				var b errorJSON
				if err := json.Unmarshal(rec.Body.Bytes(), &b); err != nil || b.Error.Code != tt.code {
					t.Fatalf("body %s, want code %s", rec.Body, tt.code)
				}
				if tt.code == guard.CodeEndpointBlocked && b.Error.Message != `Requests matching rule "v0-gone" are blocked.` {
					t.Errorf("message %q does not name the rule", b.Error.Message)
				}
				return
			}
			if seen.path != tt.path || seen.requestURI != tt.requestURI {
				t.Errorf("handler saw %+v, want path %q, RequestURI %q", seen, tt.path, tt.requestURI)
			}
			if clean, _ := rules.CleanPath(tt.target); seen.escaped != clean {
				t.Errorf("handler's EscapedPath %q, want %q", seen.escaped, clean)
			}
		})
	}
}

// TestMiddlewareNormalisesOnError: a request let through because the
// Checker could not decide still goes on with its normal path.
func TestMiddlewareNormalisesOnError(t *testing.T) {
	t.Parallel()
	failing := &fakeChecker{fn: func(*guard.Request, *guard.Decision) error { return errors.New("no store") }}
	var seen seenRequest
	h := Middleware(failing)(recordingHandler(&seen))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "//v1/./x?y", nil))
	if rec.Code != 204 || seen.path != "/v1/x" || seen.requestURI != "/v1/x?y" {
		t.Errorf("status %d, handler saw %+v", rec.Code, seen)
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/a/%2e%2e/%2e%2e/x", nil))
	if rec.Code != 400 {
		t.Errorf("path above the root on error: status %d", rec.Code)
	}
}

// TestRefusalMessages: bodies name the rule that refused the request.
func TestRefusalMessages(t *testing.T) {
	t.Parallel()
	g := pathGuard(t, `
rules:
  - {id: small, capacity: 3, rate: 3/1m}
  - {id: keys-gone, match: {api_key: "sk_gone_*"}, block: true}
`, guard.WithMaxCost(10))
	tests := []struct {
		key, cost string
		status    int
		code, msg string
	}{
		{"sk_a", "4", 400, guard.CodeCostExceedsLimit, `The request's cost of 4 exceeds the limit of 3 of rule "small"; it can never be admitted.`},
		{"sk_a", "11", 400, guard.CodeCostExceedsLimit, `The request's cost of 11 exceeds the largest cost one request may ask for, 10; it can never be admitted.`},
		{"sk_gone_1", "", 403, guard.CodeKeyBlocked, `Requests matching rule "keys-gone" are blocked.`},
	}
	// The cost header counts from trusted proxies only.
	id := &Identity{CostHeader: "X-Cost", TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
	for _, tt := range tests {
		var seen seenRequest
		r := httptest.NewRequest(http.MethodGet, "/x", nil)
		r.RemoteAddr = "10.0.0.1:1"
		r.Header.Set("X-API-Key", tt.key)
		if tt.cost != "" {
			r.Header.Set("X-Cost", tt.cost)
		}
		rec := httptest.NewRecorder()
		Middleware(g, WithIdentity(id))(recordingHandler(&seen)).ServeHTTP(rec, r)
		var b errorJSON
		if err := json.Unmarshal(rec.Body.Bytes(), &b); err != nil || rec.Code != tt.status || b.Error.Code != tt.code || b.Error.Message != tt.msg {
			t.Errorf("%s cost %s: %d %s, want %d %s %q", tt.key, tt.cost, rec.Code, rec.Body, tt.status, tt.code, tt.msg)
		}
	}
}

// TestTooManyRulesAnswer: 500 TOO_MANY_RULES, the handler never runs.
func TestTooManyRulesAnswer(t *testing.T) {
	t.Parallel()
	g := pathGuard(t, `
rules:
  - {id: a, match: {endpoint: "^/x"}, capacity: 3, rate: 3/1m}
  - {id: b, match: {endpoint: "^/x"}, capacity: 3, rate: 3/1m}
`, guard.WithMaxRules(1))
	var seen seenRequest
	rec := httptest.NewRecorder()
	Middleware(g)(recordingHandler(&seen)).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/x", nil))
	var b errorJSON
	if err := json.Unmarshal(rec.Body.Bytes(), &b); err != nil || rec.Code != 500 || b.Error.Code != guard.CodeTooManyRules || seen.path != "" {
		t.Errorf("%d %s, handler saw %+v", rec.Code, rec.Body, seen)
	}
}

type errorJSON struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// TestPenaltyMessages: an answer of the penalty ladder says so — its
// level, until when and the ladder's reason — through a real guard, on
// the prebuilt path as on the rendered one; an operator's block and a
// penalty without a level keep their plain words.
func TestPenaltyMessages(t *testing.T) {
	t.Parallel()
	g := pathGuard(t, "rules:\n  - {id: small, capacity: 3, rate: 3/1m}\n")
	until := time.Now().Add(24 * time.Hour).Truncate(time.Second)
	end := until.UTC().Format(time.RFC3339)
	const why = "20 of 20 requests in 60s arrived while a Retry-After was running (100%)"
	g.Controls().SetPenalty(g.KeyID("sk_cool"), guard.Penalty{Level: 2, Until: until.UnixMicro(), Reason: why})
	g.Controls().SetPenalty(g.KeyID("sk_plain"), guard.Penalty{Until: until.UnixMicro()})
	g.Controls().Block(g.KeyID("sk_top"), guard.Entry{Level: 3, Close: true, Expiry: until.UnixMicro(), Reason: why + "\n\x00é"})
	g.Controls().Block(g.KeyID("sk_forever"), guard.Entry{Level: 3})
	g.Controls().Block(g.KeyID("sk_operator"), guard.Entry{Reason: "internal ticket 42"})
	tests := []struct {
		key    string
		status int
		msg    string // the message, with <N> for the Retry-After
	}{
		{"sk_cool", 429, "This API key is at level 2 of the penalty ladder (cooldown: every request is refused until it ends); the ladder's reason: " +
			why + ". Retry after <N> seconds."},
		{"sk_plain", 429, "This API key kept sending requests while asked to wait and is under a temporary penalty. Retry after <N> seconds."},
		{"sk_top", 403, "This API key is blocked at level 3 of the penalty ladder until " + end + "; the ladder's reason: " + why + "????."},
		{"sk_forever", 403, "This API key is blocked at level 3 of the penalty ladder until an operator lifts it."},
		{"sk_operator", 403, "This API key is blocked."},
	}
	h := Middleware(g)(http.NotFoundHandler())
	for _, tt := range tests {
		for round := range 2 { // built, then the prebuilt answer
			r := httptest.NewRequest(http.MethodGet, "/x", nil)
			r.Header.Set("X-API-Key", tt.key)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, r)
			want := strings.ReplaceAll(tt.msg, "<N>", rec.Header().Get("Retry-After"))
			var b errorJSON
			if err := json.Unmarshal(rec.Body.Bytes(), &b); err != nil || rec.Code != tt.status || b.Error.Message != want {
				t.Errorf("%s, round %d: %d %s, want %d %q", tt.key, round, rec.Code, rec.Body, tt.status, want)
			}
			if strings.Contains(rec.Body.String(), "internal ticket") {
				t.Errorf("%s: an operator's reason reached the client: %s", tt.key, rec.Body)
			}
		}
	}
}
