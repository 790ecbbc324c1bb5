package rls

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/rules"
)

func TestCurrentLimit(t *testing.T) {
	t.Parallel()
	const (
		second = rlsv3.RateLimitResponse_RateLimit_SECOND
		minute = rlsv3.RateLimitResponse_RateLimit_MINUTE
		hour   = rlsv3.RateLimitResponse_RateLimit_HOUR
		day    = rlsv3.RateLimitResponse_RateLimit_DAY
		week   = rlsv3.RateLimitResponse_RateLimit_WEEK
		month  = rlsv3.RateLimitResponse_RateLimit_MONTH
		year   = rlsv3.RateLimitResponse_RateLimit_YEAR
	)
	rs, err := rules.Load([]byte(`
rules:
  - {id: half, match: {}, algorithm: token_bucket, capacity: 1, refill_rate: 0.5}
  - {id: hundred-per-minute, match: {}, algorithm: fixed_window, limit: 100, window: 1m}
  - {id: ten-per-second, match: {}, algorithm: token_bucket, capacity: 10, rate: 10/1s}
  - {id: thousand-a-day, match: {}, algorithm: sliding_window_counter, limit: 1000, window: 1d}
  - {id: sixty-per-minute, match: {}, algorithm: sliding_window_log, limit: 60, window: 1m}
  - {id: fifty-ninety-per-minute, match: {}, algorithm: sliding_window_log, limit: 59, window: 1m}
  - {id: tenth, match: {}, algorithm: token_bucket, capacity: 5, refill_rate: 0.1}
  - {id: gcra, match: {}, algorithm: gcra, limit: 7, window: 1h, burst: 100}
  - {id: subsecond, match: {}, algorithm: fixed_window, limit: 3, window: 500ms}
  - {id: huge, match: {}, algorithm: fixed_window, limit: 1000000000000, window: 1s}
  - {id: two-a-week, match: {}, algorithm: fixed_window, limit: 2, window: 7d}
  - {id: one-a-fortnight, match: {}, algorithm: fixed_window, limit: 1, window: 14d}
  - {id: one-a-quarter, match: {}, algorithm: fixed_window, limit: 1, window: 90d}
  - {id: once-in-366-days, match: {}, algorithm: fixed_window, limit: 1, window: 366d}
  - {id: bucket-per-minute, match: {}, algorithm: token_bucket, capacity: 500, rate: 100/1m}
  - {id: gcra-per-minute, match: {}, algorithm: gcra, limit: 600, window: 1m, burst: 20}
  - {id: bucket-per-90s, match: {}, algorithm: token_bucket, capacity: 10, rate: 90/90s}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		id   string
		n    uint32
		unit rlsv3.RateLimitResponse_RateLimit_Unit
	}{
		{"half", 30, minute},
		// A window of exactly one unit is the rule's limit per
		// that unit: 100 per 1m is 100 per MINUTE, not 1 per SECOND.
		{"hundred-per-minute", 100, minute},
		{"ten-per-second", 10, second},
		{"thousand-a-day", 1000, day},
		{"sixty-per-minute", 60, minute},
		{"fifty-ninety-per-minute", 59, minute},
		// rate: N/period of exactly one unit: N per that unit, whatever
		// the capacity; gcra: its limit, not its burst.
		{"bucket-per-minute", 100, minute},
		{"gcra-per-minute", 600, minute},
		// Otherwise the smallest unit where floor(rate × unit) ≥ 1.
		{"bucket-per-90s", 1, second},
		{"tenth", 6, minute},
		{"gcra", 7, hour},
		{"subsecond", 6, second},
		{"huge", math.MaxUint32, second},
		{"two-a-week", 2, week},
		{"one-a-fortnight", 2, month},
		{"one-a-quarter", 4, year},
		{"once-in-366-days", 0, year},
	} {
		t.Run(tt.id, func(t *testing.T) {
			r := rs.Rule(tt.id)
			rr := guard.RuleResult{ID: r.ID, Algorithm: r.Algorithm, Limit: r.Params.Limit, Window: r.Params.PolicyWindow(r.Algorithm)}
			num, den, own := period(rs, &rr, "", "")
			cl := limitOf(rr.ID, rr.Limit, num, den, own)
			if cl.Name != tt.id || cl.RequestsPerUnit != tt.n || cl.Unit != tt.unit {
				t.Errorf("current_limit %v, want %d per %v", cl, tt.n, tt.unit)
			}
		})
	}

	// A rule that is gone (the ruleset changed since the decision):
	// limit ÷ RateLimit-Policy w.
	rr := guard.RuleResult{ID: "gone", Algorithm: rules.FixedWindow, Limit: 120, Window: 60}
	num, den, own := period(rs, &rr, "", "")
	if cl := limitOf(rr.ID, rr.Limit, num, den, own); cl.RequestsPerUnit != 2 || cl.Unit != second {
		t.Errorf("gone rule: %v, want 2 per SECOND", cl)
	}
	rr = guard.RuleResult{ID: "half", Algorithm: rules.FixedWindow, Limit: 1, Window: 2}
	num, den, own = period(rs, &rr, "", "")
	if cl := limitOf(rr.ID, rr.Limit, num, den, own); cl.RequestsPerUnit != 30 || cl.Unit != minute {
		t.Errorf("rule whose algorithm changed: %v, want 30 per MINUTE", cl)
	}
}

// TestMulDiv checks mulDiv against math/big on random and extreme values.
func TestMulDiv(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func() uint64 {
		switch rng.IntN(4) {
		case 0:
			return rng.Uint64N(100) + 1
		case 1:
			return rng.Uint64N(1<<40) + 1
		case 2:
			return math.MaxUint64 - rng.Uint64N(3)
		}
		return rng.Uint64() | 1
	}
	maxU := new(big.Int).SetUint64(math.MaxUint64)
	for range 100_000 {
		a, b, c, d := pick(), pick(), pick(), pick()
		want := new(big.Int).SetUint64(a)
		want.Mul(want, new(big.Int).SetUint64(b))
		want.Mul(want, new(big.Int).SetUint64(c))
		want.Quo(want, new(big.Int).SetUint64(d))
		if want.Cmp(maxU) > 0 {
			want = maxU
		}
		if got := mulDiv(a, b, c, d); got != want.Uint64() {
			t.Fatalf("mulDiv(%d, %d, %d, %d) = %d, want %d", a, b, c, d, got, want)
		}
	}
}

// limitOf returns currentLimit's answer.
func limitOf(name string, limit int64, num, den, own uint64) *rlsv3.RateLimitResponse_RateLimit {
	rl := new(rlsv3.RateLimitResponse_RateLimit)
	currentLimit(rl, name, limit, num, den, own)
	return rl
}
