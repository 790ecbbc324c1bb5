//go:build !race

package httpguard

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tollgate/tollgate/guard"
)

// The race detector changes allocation counts, hence the build tag.
func TestAllocs(t *testing.T) {
	allowed, rejected := allowedDecision(), rejectedDecision()
	h := http.Header{}
	dst := make([][2]string, 0, 16)
	tests := []struct {
		name string
		max  float64
		fn   func()
	}{
		// One string holding every value, one array backing the slices.
		{"SetHeaders", 2, func() { SetHeaders(h, &allowed) }},
		{"HeaderPairs", 1, func() { dst = HeaderPairs(&rejected, dst[:0]) }},
		{"wantsProblem", 0, func() { wantsProblem([]string{"text/html;q=0.9, application/problem+json;q=0.8, */*;q=0.1"}) }},
	}
	// The answers made from the controls alone cost the middleware
	// nothing beyond the checker's own work, on a tracked connection too
	// (its state is allocated once, with the connection).
	for _, d := range []guard.Decision{
		{Status: 429, Code: guard.CodePenalty, Reason: guard.ReasonPenalty, Deciding: -1, RetryAfter: 900, PenaltyLevel: 2},
		{Status: 403, Code: guard.CodeKeyBlocked, Reason: guard.ReasonBlocklisted, Deciding: -1, PenaltyLevel: 3, CloseConnection: true},
	} {
		mw := Middleware(decide(d), WithOnClose(func(*http.Request, *guard.Decision) {}))(http.NotFoundHandler())
		r := httptest.NewRequest(http.MethodGet, "/v1/search", nil)
		r.Header.Set("X-API-Key", "sk_prod_acme_1")
		r.Header.Set("Accept", "application/problem+json")
		r = r.WithContext(TrackConn(context.Background(), 1<<40))
		w := &discardWriter{h: http.Header{}}
		tests = append(tests, struct {
			name string
			max  float64
			fn   func()
		}{"middleware " + d.Code, 0, func() {
			clear(w.h)
			mw.ServeHTTP(w, r)
			if w.code != d.Status {
				panic(w.code)
			}
		}})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := testing.AllocsPerRun(100, tt.fn); got > tt.max {
				t.Errorf("%s: %v allocations, want at most %v", tt.name, got, tt.max)
			}
		})
	}
}
