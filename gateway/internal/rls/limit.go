package rls

import (
	"math"
	"math/bits"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/rules"
)

// units are the units current_limit may use, smallest first, with their
// length in microseconds. The documented mapping uses SECOND to DAY; WEEK, MONTH and
// YEAR (as long as Envoy's reference service makes them) only serve rates
// below one a day, which that mapping leaves open.
var units = [...]struct {
	unit rlsv3.RateLimitResponse_RateLimit_Unit
	us   uint64
}{
	{rlsv3.RateLimitResponse_RateLimit_SECOND, 1_000_000},
	{rlsv3.RateLimitResponse_RateLimit_MINUTE, 60 * 1_000_000},
	{rlsv3.RateLimitResponse_RateLimit_HOUR, 3600 * 1_000_000},
	{rlsv3.RateLimitResponse_RateLimit_DAY, 86400 * 1_000_000},
	{rlsv3.RateLimitResponse_RateLimit_WEEK, 7 * 86400 * 1_000_000},
	{rlsv3.RateLimitResponse_RateLimit_MONTH, 30 * 86400 * 1_000_000},
	{rlsv3.RateLimitResponse_RateLimit_YEAR, 365 * 86400 * 1_000_000},
}

// period returns the time, in microseconds as the fraction num/den, in
// which rr's rule grants rr.Limit units: the window of a windowed rule, the
// full-refill time of a bucket rule for the key (per-key overrides of the
// rules file included; temporary overrides keep it). own is the rule's own
// period when it states one: the window of a windowed or gcra rule, the
// period of a token bucket's `rate: N/period` (0 otherwise). rs may be a
// newer ruleset than the one that decided: when the rule is gone or
// changed algorithm, the RateLimit-Policy `w` stands in.
func period(rs *rules.Ruleset, rr *guard.RuleResult, key, keyID string) (num, den, own uint64) {
	var r *rules.Rule
	if rs != nil {
		r = rs.Rule(rr.ID)
	}
	if r != nil && r.Algorithm == rr.Algorithm {
		p, _ := r.ParamsFor(key, keyID)
		switch {
		case rr.Algorithm == rules.TokenBucket && p.FullNum > 0 && p.FullDen > 0:
			return uint64(p.FullNum), uint64(p.FullDen), uint64(max(p.RatePeriod, 0))
		case rr.Algorithm == rules.GCRA && p.FullNum > 0 && p.FullDen > 0:
			return uint64(p.FullNum), uint64(p.FullDen), uint64(max(p.Window, 0))
		case !rr.Algorithm.Bucket() && p.Window > 0:
			return uint64(p.Window), 1, uint64(p.Window)
		}
	}
	return uint64(max(rr.Window, 1)) * 1_000_000, 1, 0
}

// currentLimit sets rl to limit units per num/den µs as Envoy's
// current_limit. A rule whose own period (own µs, see period) is
// exactly one SECOND, MINUTE, HOUR or DAY is reported in that unit, as its
// rate over it: a window's limit (100 per 1m is 100 per MINUTE), a gcra
// rule's limit rather than its burst, a token bucket's N of `rate:
// N/period`. Otherwise it is floor(rate × unit) in the smallest unit where
// that is at least 1 (YEAR, possibly with 0, below one a year), at most
// MaxUint32.
func currentLimit(rl *rlsv3.RateLimitResponse_RateLimit, name string, limit int64, num, den, own uint64) {
	rl.Name, rl.RequestsPerUnit = name, 0
	if limit <= 0 || num == 0 {
		rl.Unit = units[0].unit
		return
	}
	for _, u := range units[:4] {
		if own == u.us {
			// rate × own = limit × den × own / num.
			if n := mulDiv(uint64(limit), den, u.us, num); n >= 1 {
				rl.Unit, rl.RequestsPerUnit = u.unit, uint32(min(n, math.MaxUint32))
				return
			}
		}
	}
	for _, u := range units {
		// rate × unit = limit × den × unit / num.
		n := mulDiv(uint64(limit), den, u.us, num)
		rl.Unit, rl.RequestsPerUnit = u.unit, uint32(min(n, math.MaxUint32))
		if n >= 1 {
			break
		}
	}
}

// mulDiv returns floor(a × b × c / d) for d > 0, saturating at MaxUint64.
// It keeps 128-bit intermediates, so rules' exact fractions never lose
// precision the way a float64 rate would (1/3 per second is 20 per minute,
// not 19).
func mulDiv(a, b, c, d uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	if hi >= d {
		return math.MaxUint64
	}
	q, r := bits.Div64(hi, lo, d) // a×b = q×d + r, r < d
	// a×b×c/d = q×c + r×c/d.
	qhi, qc := bits.Mul64(q, c)
	if qhi != 0 {
		return math.MaxUint64
	}
	rhi, rlo := bits.Mul64(r, c) // r < d, so rhi < d
	f, _ := bits.Div64(rhi, rlo, d)
	sum, carry := bits.Add64(qc, f, 0)
	if carry != 0 {
		return math.MaxUint64
	}
	return sum
}
