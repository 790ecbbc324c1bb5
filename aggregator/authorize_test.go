package aggregator

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestAuthorize: without a valid bearer token no request reaches the
// operator API, whatever its method, content type or origin — with a
// token configured, and with admin_insecure (none configured), where any
// bearer token is taken but a request without one (all a cross-site page
// can send) is still refused.
func TestAuthorize(t *testing.T) {
	t.Parallel()
	const tok = "0123456789abcdef-operator"
	forged := func(r *http.Request) *http.Request {
		r.Header.Set("Content-Type", "text/plain")
		r.Header.Set("Origin", "https://evil.example")
		r.Header.Set("Sec-Fetch-Site", "cross-site")
		return r
	}
	quota := func(auth string) *http.Request {
		r := forged(httptest.NewRequest("POST", "/admin/v1/keys/sk_x/quota", strings.NewReader(`{"tokens":1000}`)))
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		return r
	}
	tests := []struct {
		name   string
		token  string // configured; "" is admin_insecure
		req    *http.Request
		served bool
	}{
		{"cross-site text/plain POST, no token", tok, quota(""), false},
		{"wrong token", tok, quota("Bearer nope-nope-nope-nope"), false},
		{"token prefix", tok, quota("Bearer " + tok[:10]), false},
		{"empty bearer", tok, quota("Bearer "), false},
		{"basic scheme", tok, quota("Basic " + tok), false},
		{"the token", tok, quota("Bearer " + tok), true},
		{"the token, scheme in upper case", tok, quota("BEARER " + tok), true},
		{"GET without a token", tok, httptest.NewRequest("GET", "/admin/v1/rules", nil), false},
		{"insecure: cross-site text/plain POST", "", quota(""), false},
		{"insecure: CORS preflight", "", forged(httptest.NewRequest("OPTIONS", "/admin/v1/keys/sk_x/quota", nil)), false},
		{"insecure: empty bearer", "", quota("Bearer  "), false},
		{"insecure: any bearer token", "", quota("Bearer x"), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := &Server{cfg: Config{AdminToken: tt.token, AdminInsecure: tt.token == "", Listen: "127.0.0.1:8081"},
				log: slog.New(slog.DiscardHandler)}
			served := false
			h := s.authorize(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served = true }))
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, tt.req)
			if served != tt.served {
				t.Fatalf("served %v, want %v (status %d)", served, tt.served, rec.Code)
			}
			if !served && (rec.Code != http.StatusUnauthorized || !strings.Contains(rec.Body.String(), "UNAUTHORIZED") ||
				rec.Header().Get("Access-Control-Allow-Origin") != "") {
				t.Fatalf("refusal: %d %v %s", rec.Code, rec.Header(), rec.Body)
			}
		})
	}
}
