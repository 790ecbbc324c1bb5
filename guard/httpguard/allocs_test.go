//go:build !race

package httpguard

import (
	"net/http"
	"testing"
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
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := testing.AllocsPerRun(100, tt.fn); got > tt.max {
				t.Errorf("%s: %v allocations, want at most %v", tt.name, got, tt.max)
			}
		})
	}
}
