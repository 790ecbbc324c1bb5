package console

import (
	"crypto/tls"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	adminTok  = "admin-0123456789abcdef"
	viewerTok = "viewer-0123456789abcdef"
	host      = "127.0.0.1:8081"
	self      = "http://" + host
)

// clock is a settable time source.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// server is the console's routes and a guarded API that records what it
// served.
type server struct {
	g      *Guard
	h      http.Handler
	clk    *clock
	served []string
}

func newServer(admin, viewer string) *server {
	clk := &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	s := &server{g: NewGuard(admin, viewer, clk.now), clk: clk}
	mux := http.NewServeMux()
	mux.Handle("/", s.g.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.served = append(s.served, r.Method+" "+r.URL.Path)
	})))
	Register(mux, s.g)
	s.h = mux
	return s
}

func (s *server) do(r *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	s.h.ServeHTTP(rec, r)
	return rec
}

// req builds a request to host with header pairs.
func req(method, path, body string, header ...string) *http.Request {
	r := httptest.NewRequest(method, self+path, strings.NewReader(body))
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	return r
}

// signIn signs in with body from the console's own origin and returns the
// cookie and the session's CSRF token.
func (s *server) signIn(t *testing.T, body string) (*http.Cookie, string) {
	t.Helper()
	rec := s.do(req("POST", "/console/session", body, "Origin", self, "Content-Type", "application/json"))
	if rec.Code != 200 {
		t.Fatalf("sign-in %s: %d %s", body, rec.Code, rec.Body)
	}
	var out sessionJSON
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	cs := rec.Result().Cookies()
	if len(cs) != 1 {
		t.Fatalf("cookies %v", cs)
	}
	return cs[0], out.CSRFToken
}

func errCode(rec *httptest.ResponseRecorder) string {
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	_ = json.Unmarshal(rec.Body.Bytes(), &e)
	return e.Error.Code
}

// TestRoles: each token is compared with the configured ones; the viewer
// token never gets the admin's role, not even with admin_insecure.
func TestRoles(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, admin, viewer, token string
		want                       Role
	}{
		{"admin", adminTok, viewerTok, adminTok, RoleAdmin},
		{"viewer", adminTok, viewerTok, viewerTok, RoleViewer},
		{"wrong", adminTok, viewerTok, "nope-nope-nope-nope", RoleNone},
		{"prefix of the admin token", adminTok, viewerTok, adminTok[:10], RoleNone},
		{"empty", adminTok, viewerTok, "", RoleNone},
		{"no viewer token configured", adminTok, "", viewerTok, RoleNone},
		{"insecure: any token", "", viewerTok, "x", RoleAdmin},
		{"insecure: the viewer token", "", viewerTok, viewerTok, RoleViewer},
	}
	for _, tt := range tests {
		if got := NewGuard(tt.admin, tt.viewer, nil).Role(tt.token); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestWrap: who may do what on the guarded API — bearer tokens as before
// (no CSRF token needed), the viewer reads only (403 FORBIDDEN on every
// change), and a session cookie changes only from the console's own
// origin with its CSRF token.
func TestWrap(t *testing.T) {
	t.Parallel()
	type auth int
	const (
		none auth = iota
		adminCookie
		viewerCookie
	)
	tests := []struct {
		name   string
		cookie auth
		method string
		path   string
		header []string // pairs; "CSRF" as a value is replaced by the session's token
		status int      // 0: served
		code   string
	}{
		{"admin bearer GET", none, "GET", "/admin/v1/rules", []string{"Authorization", "Bearer " + adminTok}, 0, ""},
		{"admin bearer PUT, cross-site, no CSRF token", none, "PUT", "/admin/v1/rules", []string{"Authorization", "Bearer " + adminTok, "Origin", "https://evil.example"}, 0, ""},
		{"viewer bearer GET", none, "GET", "/admin/v1/audit", []string{"Authorization", "Bearer " + viewerTok}, 0, ""},
		{"viewer bearer report", none, "GET", "/v1/usage/tenants/acme", []string{"Authorization", "Bearer " + viewerTok}, 0, ""},
		{"viewer bearer validate", none, "POST", "/admin/v1/rules/validate", []string{"Authorization", "Bearer " + viewerTok}, 0, ""},
		{"viewer bearer PUT rules", none, "PUT", "/admin/v1/rules", []string{"Authorization", "Bearer " + viewerTok}, 403, "FORBIDDEN"},
		{"viewer bearer block", none, "PUT", "/admin/v1/blocklist/sk_x", []string{"Authorization", "Bearer " + viewerTok}, 403, "FORBIDDEN"},
		{"viewer bearer quota", none, "POST", "/admin/v1/keys/sk_x/quota", []string{"Authorization", "Bearer " + viewerTok}, 403, "FORBIDDEN"},
		{"viewer bearer lift", none, "DELETE", "/admin/v1/penalties/sk_x", []string{"Authorization", "Bearer " + viewerTok}, 403, "FORBIDDEN"},
		{"wrong bearer", none, "GET", "/admin/v1/rules", []string{"Authorization", "Bearer nope-nope-nope-nope"}, 401, "UNAUTHORIZED"},
		{"nothing", none, "GET", "/admin/v1/rules", nil, 401, "UNAUTHORIZED"},
		{"wrong bearer with a good cookie", adminCookie, "GET", "/admin/v1/rules", []string{"Authorization", "Bearer nope-nope-nope-nope"}, 401, "UNAUTHORIZED"},
		{"cookie GET", adminCookie, "GET", "/admin/v1/rules", nil, 0, ""},
		{"cookie GET, cross-site", adminCookie, "GET", "/admin/v1/rules", []string{"Origin", "https://evil.example"}, 0, ""},
		{"cookie PUT, same origin, CSRF", adminCookie, "PUT", "/admin/v1/rules", []string{"Origin", self, CSRFHeader, "CSRF"}, 0, ""},
		{"cookie PUT, same-origin Referer, CSRF", adminCookie, "PUT", "/admin/v1/rules", []string{"Referer", self + "/console/", CSRFHeader, "CSRF"}, 0, ""},
		{"cookie PUT, Sec-Fetch-Site same-origin", adminCookie, "PUT", "/admin/v1/rules", []string{"Origin", self, "Sec-Fetch-Site", "same-origin", CSRFHeader, "CSRF"}, 0, ""},
		{"cookie PUT, no CSRF token", adminCookie, "PUT", "/admin/v1/rules", []string{"Origin", self}, 403, "FORBIDDEN"},
		{"cookie PUT, wrong CSRF token", adminCookie, "PUT", "/admin/v1/rules", []string{"Origin", self, CSRFHeader, "guess"}, 403, "FORBIDDEN"},
		{"cookie PUT, cross-site Origin", adminCookie, "PUT", "/admin/v1/rules", []string{"Origin", "https://evil.example", CSRFHeader, "CSRF"}, 403, "FORBIDDEN"},
		{"cookie PUT, Origin null", adminCookie, "PUT", "/admin/v1/rules", []string{"Origin", "null", CSRFHeader, "CSRF"}, 403, "FORBIDDEN"},
		{"cookie PUT, no Origin nor Referer", adminCookie, "PUT", "/admin/v1/rules", []string{CSRFHeader, "CSRF"}, 403, "FORBIDDEN"},
		{"cookie PUT, cross-site Referer", adminCookie, "PUT", "/admin/v1/rules", []string{"Referer", "https://evil.example/", CSRFHeader, "CSRF"}, 403, "FORBIDDEN"},
		{"cookie PUT, same host another port", adminCookie, "PUT", "/admin/v1/rules", []string{"Origin", "http://127.0.0.1:9999", CSRFHeader, "CSRF"}, 403, "FORBIDDEN"},
		{"cookie PUT, Sec-Fetch-Site cross-site", adminCookie, "PUT", "/admin/v1/rules", []string{"Origin", self, "Sec-Fetch-Site", "cross-site", CSRFHeader, "CSRF"}, 403, "FORBIDDEN"},
		{"cookie text/plain POST, cross-site", adminCookie, "POST", "/admin/v1/keys/sk_x/quota", []string{"Origin", "https://evil.example", "Content-Type", "text/plain"}, 403, "FORBIDDEN"},
		{"viewer cookie GET", viewerCookie, "GET", "/admin/v1/penalties/sk_x", nil, 0, ""},
		{"viewer cookie validate", viewerCookie, "POST", "/admin/v1/rules/validate", []string{"Origin", self, CSRFHeader, "CSRF"}, 0, ""},
		{"viewer cookie PUT with CSRF", viewerCookie, "PUT", "/admin/v1/blocklist/sk_x", []string{"Origin", self, CSRFHeader, "CSRF"}, 403, "FORBIDDEN"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newServer(adminTok, viewerTok)
			r := req(tt.method, tt.path, "{}")
			var csrf string
			switch tt.cookie {
			case adminCookie:
				c, tok := s.signIn(t, `{"token":"`+adminTok+`"}`)
				r.AddCookie(c)
				csrf = tok
			case viewerCookie:
				c, tok := s.signIn(t, `{"token":"`+viewerTok+`"}`)
				r.AddCookie(c)
				csrf = tok
			}
			for i := 0; i+1 < len(tt.header); i += 2 {
				v := tt.header[i+1]
				if v == "CSRF" {
					v = csrf
				}
				r.Header.Set(tt.header[i], v)
			}
			rec := s.do(r)
			served := len(s.served) == 1
			switch {
			case tt.status == 0 && !served:
				t.Fatalf("refused: %d %s", rec.Code, rec.Body)
			case tt.status != 0 && served:
				t.Fatalf("served, want %d", tt.status)
			case tt.status != 0 && (rec.Code != tt.status || errCode(rec) != tt.code):
				t.Fatalf("%d %s, want %d %s", rec.Code, rec.Body, tt.status, tt.code)
			}
		})
	}
}

// TestSignIn: the cookie is HttpOnly, SameSite=Strict, Path=/, Secure
// over TLS (own or a proxy's) only; neither the token nor the cookie is
// in the answer's body; sign-in is refused cross-site and with a wrong
// token; a page reload gets the session's CSRF token back; sign-out ends
// the session and needs the CSRF token.
func TestSignIn(t *testing.T) {
	t.Parallel()
	s := newServer(adminTok, viewerTok)
	for _, tc := range []struct {
		name   string
		tls    bool
		header []string
		secure bool
	}{
		{"http", false, nil, false},
		{"tls", true, nil, true},
		{"behind a TLS proxy", false, []string{"X-Forwarded-Proto", "https"}, true},
	} {
		r := req("POST", "/console/session", `{"token":"`+adminTok+`"}`, append([]string{"Origin", self}, tc.header...)...)
		if tc.tls {
			r.TLS = &tls.ConnectionState{}
			r.Header.Set("Origin", "https://"+host)
		}
		rec := s.do(r)
		if rec.Code != 200 {
			t.Fatalf("%s: %d %s", tc.name, rec.Code, rec.Body)
		}
		set := rec.Header().Get("Set-Cookie")
		for _, want := range []string{CookieName + "=", "HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=28800"} {
			if !strings.Contains(set, want) {
				t.Errorf("%s: Set-Cookie %q lacks %s", tc.name, set, want)
			}
		}
		if strings.Contains(set, "Secure") != tc.secure {
			t.Errorf("%s: Set-Cookie %q: Secure %v, want %v", tc.name, set, !tc.secure, tc.secure)
		}
		c := rec.Result().Cookies()[0]
		if strings.Contains(rec.Body.String(), adminTok) || strings.Contains(rec.Body.String(), c.Value) || strings.Contains(set, adminTok) {
			t.Errorf("%s: the answer holds the token or the cookie: %s", tc.name, rec.Body)
		}
		if rec.Header().Get("Content-Security-Policy") == "" || rec.Header().Get("Cache-Control") != "no-store" {
			t.Errorf("%s: headers %v", tc.name, rec.Header())
		}
	}

	for _, tc := range []struct {
		name, body string
		header     []string
		status     int
		code       string
	}{
		{"cross-site", `{"token":"` + adminTok + `"}`, []string{"Origin", "https://evil.example"}, 403, "FORBIDDEN"},
		{"no origin", `{"token":"` + adminTok + `"}`, nil, 403, "FORBIDDEN"},
		{"wrong token", `{"token":"nope-nope-nope-nope"}`, []string{"Origin", self}, 401, "UNAUTHORIZED"},
		{"no token", `{}`, []string{"Origin", self}, 401, "UNAUTHORIZED"},
		{"not JSON", `token=` + adminTok, []string{"Origin", self}, 400, "INVALID_REQUEST"},
		{"unknown field", `{"password":"x"}`, []string{"Origin", self}, 400, "INVALID_REQUEST"},
		{"two objects", `{"token":"` + adminTok + `"}{}`, []string{"Origin", self}, 400, "INVALID_REQUEST"},
		{"token and code", `{"token":"` + adminTok + `","code":"x"}`, []string{"Origin", self}, 400, "INVALID_REQUEST"},
		{"too large", `{"token":"` + strings.Repeat("a", 5000) + `"}`, []string{"Origin", self}, 413, "BODY_TOO_LARGE"},
	} {
		rec := s.do(req("POST", "/console/session", tc.body, tc.header...))
		if rec.Code != tc.status || errCode(rec) != tc.code || rec.Header().Get("Set-Cookie") != "" {
			t.Errorf("%s: %d %s %v, want %d %s and no cookie", tc.name, rec.Code, rec.Body, rec.Header(), tc.status, tc.code)
		}
		if strings.Contains(rec.Body.String(), adminTok) {
			t.Errorf("%s: the answer echoes the token: %s", tc.name, rec.Body)
		}
	}

	c, csrf := s.signIn(t, `{"token":"`+viewerTok+`"}`)
	r := req("GET", "/console/session", "")
	r.AddCookie(c)
	rec := s.do(r)
	var got sessionJSON
	if err := json.Unmarshal(rec.Body.Bytes(), &got); rec.Code != 200 || err != nil || got.Role != "viewer" || got.CSRFToken != csrf {
		t.Fatalf("GET session: %d %s", rec.Code, rec.Body)
	}
	for _, h := range [][]string{{"Origin", self}, {"Origin", "https://evil.example", CSRFHeader, csrf}} {
		r := req("DELETE", "/console/session", "", h...)
		r.AddCookie(c)
		if rec := s.do(r); rec.Code != 403 {
			t.Fatalf("sign-out with %v: %d, want 403", h, rec.Code)
		}
	}
	r = req("DELETE", "/console/session", "", "Origin", self, CSRFHeader, csrf)
	r.AddCookie(c)
	if rec := s.do(r); rec.Code != 204 || !strings.Contains(rec.Header().Get("Set-Cookie"), "Max-Age=0") {
		t.Fatalf("sign-out: %d %v", rec.Code, rec.Header())
	}
	r = req("GET", "/admin/v1/rules", "")
	r.AddCookie(c)
	if rec := s.do(r); rec.Code != 401 {
		t.Fatalf("after sign-out: %d, want 401", rec.Code)
	}
}

// TestCodes: a one-time code signs in once, within its lifetime, with
// the role it was made for.
func TestCodes(t *testing.T) {
	t.Parallel()
	s := newServer(adminTok, viewerTok)
	c := s.g.NewCode(RoleAdmin)
	if strings.Contains(c, adminTok) {
		t.Fatal("the code holds the token")
	}
	cookie, _ := s.signIn(t, `{"code":"`+c+`"}`)
	r := req("PUT", "/admin/v1/rules", "")
	r.AddCookie(cookie)
	if sess, ok := s.g.Sessions().Get(cookie.Value); !ok || sess.Role != RoleAdmin {
		t.Fatalf("session %v %v", sess, ok)
	}
	if rec := s.do(req("POST", "/console/session", `{"code":"`+c+`"}`, "Origin", self)); rec.Code != 401 {
		t.Fatalf("second use: %d, want 401", rec.Code)
	}
	late := s.g.NewCode(RoleAdmin)
	s.clk.add(CodeLifetime)
	if rec := s.do(req("POST", "/console/session", `{"code":"`+late+`"}`, "Origin", self)); rec.Code != 401 {
		t.Fatalf("expired code: %d, want 401", rec.Code)
	}
	for range 3 * maxCodes {
		s.g.NewCode(RoleAdmin)
	}
	if n := len(s.g.codes); n > maxCodes {
		t.Fatalf("%d codes kept, want at most %d", n, maxCodes)
	}
}

// TestSessionBounds: sessions end after their lifetime, and at most
// MaxSessions are kept, the one expiring first giving way.
func TestSessionBounds(t *testing.T) {
	t.Parallel()
	clk := &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	ss := NewSessions(clk.now)
	first, _ := ss.Create(RoleAdmin)
	clk.add(time.Second)
	second, _ := ss.Create(RoleAdmin)
	for range MaxSessions - 1 {
		ss.Create(RoleViewer)
	}
	if n := ss.Len(); n != MaxSessions {
		t.Fatalf("%d sessions, want %d", n, MaxSessions)
	}
	if _, ok := ss.Get(first); ok {
		t.Fatal("the oldest session survived the bound")
	}
	if _, ok := ss.Get(second); !ok {
		t.Fatal("the second session was dropped")
	}
	clk.add(SessionLifetime)
	if _, ok := ss.Get(second); ok {
		t.Fatal("a session outlived its lifetime")
	}
}

// TestPages: the console's pages carry the Content-Security-Policy and
// hold no inline script or handler, nothing from elsewhere, and no token.
func TestPages(t *testing.T) {
	t.Parallel()
	s := newServer(adminTok, viewerTok)
	rec := s.do(req("GET", "/console/", ""))
	if rec.Code != 200 || rec.Header().Get("Content-Security-Policy") != ContentSecurityPolicy ||
		rec.Header().Get("X-Content-Type-Options") != "nosniff" {
		t.Fatalf("%d %v", rec.Code, rec.Header())
	}
	if !strings.Contains(ContentSecurityPolicy, "default-src 'self'") || strings.Contains(ContentSecurityPolicy, "unsafe") {
		t.Fatalf("policy %q", ContentSecurityPolicy)
	}
	entries, err := assets.ReadDir("assets")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := assets.ReadFile("assets/" + e.Name())
		if err != nil {
			t.Fatal(err)
		}
		// The SVG namespace is a name, never fetched.
		page := strings.ReplaceAll(strings.ToLower(string(b)), `"http://www.w3.org/2000/svg"`, "")
		for _, bad := range []string{"http://", "https://", "//cdn", "javascript:", adminTok} {
			if strings.Contains(page, bad) {
				t.Errorf("%s holds %q", e.Name(), bad)
			}
		}
		if strings.HasSuffix(e.Name(), ".html") {
			for _, bad := range []string{"<script>", " onclick=", " onload=", " onsubmit=", " style="} {
				if strings.Contains(page, bad) {
					t.Errorf("%s holds %q (inline script or style; the policy refuses them)", e.Name(), bad)
				}
			}
		}
		if e.Name() == "index.html" {
			continue // served as /console/
		}
		rec := s.do(req("GET", "/console/"+e.Name(), ""))
		if rec.Code != 200 || rec.Header().Get("Content-Security-Policy") == "" {
			t.Errorf("%s: %d %v", e.Name(), rec.Code, rec.Header())
		}
	}
	if rec := s.do(req("GET", "/console/../aggregator.go", "")); rec.Code == 200 {
		t.Fatalf("path escape: %d", rec.Code)
	}
}

// TestConsoleWithoutSlash: /console leads to the console.
func TestConsoleWithoutSlash(t *testing.T) {
	t.Parallel()
	s := newServer(adminTok, viewerTok)
	rec := s.do(req("GET", "/console", ""))
	if rec.Code != http.StatusMovedPermanently || rec.Header().Get("Location") != "/console/" {
		t.Fatalf("%d %v", rec.Code, rec.Header())
	}
}
