package checkapi

import (
	"testing"

	"github.com/tollgate/tollgate/guard"
)

// BenchmarkAppendDecision measures the check API's answer encoder, the
// part of a check's cost that is the error vocabulary's: an admission and
// a 429 with its error object. Both must stay free of allocations but for
// the message string of a refusal.
func BenchmarkAppendDecision(b *testing.B) {
	for _, bc := range []struct {
		name string
		d    guard.Decision
	}{
		{"allowed", guard.Decision{Allowed: true, Status: 200, Reason: guard.ReasonAllowed, Deciding: 0,
			Rules: []guard.RuleResult{{ID: "search", Allowed: true, Limit: 30, Remaining: 12, Window: 60, Reset: 1_700_000_036}}}},
		{"rejected", guard.Decision{Status: 429, Code: guard.CodeRateLimitExceeded, Reason: guard.ReasonRateLimited, Deciding: 0, RetryAfter: 7,
			Rules: []guard.RuleResult{{ID: "search", Limit: 30, Window: 60, Reset: 1_700_000_060, RetryAfter: 7}}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			buf := make([]byte, 0, 1024)
			b.ReportAllocs()
			for b.Loop() {
				buf = appendDecision(buf[:0], &bc.d, bc.d.Status)
			}
		})
	}
}
