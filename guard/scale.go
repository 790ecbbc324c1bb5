package guard

import "github.com/tollgate/tollgate/guard/rules"

// exactLimit bounds the integers the algorithms compute with, so that Lua's
// doubles (exact below 2^53) and the Go reference model agree bit for bit.
const exactLimit = 1 << 52

// BucketScale derives the integer representation of a token_bucket or gcra
// counter from its parameters: one unit of debt is a, the debt refills by b
// per tick of k microseconds, and a full bucket holds Limit*a. Ticks are
// 1 µs unless that would leave exact arithmetic, then the coarsest power of
// ten up to 1 s that keeps the refill time exact; failing that, the refill
// time is rounded up to whole seconds (never admitting more than the rule).
func BucketScale(p rules.Params) (a, b, k int64) {
	num, den := p.FullNum, p.FullDen
	if num <= 0 || den <= 0 {
		return 1, max(p.Limit, 1), 1
	}
	fits := func(a, b int64) bool {
		return a > 0 && b > 0 && a <= exactLimit/max(2*p.Limit, 1) && b <= exactLimit
	}
	for k = 1; k <= 1_000_000; k *= 10 {
		g := gcd(num, den*k)
		a, b = num/g, (den*k/g)*p.Limit
		if (den*k/g) <= exactLimit/max(p.Limit, 1) && fits(a, b) {
			return a, b, k
		}
	}
	k = 1_000_000
	a = (num + den*k - 1) / (den * k)
	return max(a, 1), max(p.Limit, 1), k
}

// WindowScale derives the integer representation of a
// sliding_window_counter: the sub-window length s in time units of q µs.
// q is 1 unless Limit*s would leave exact arithmetic.
func WindowScale(p rules.Params) (s, q int64) {
	prec := max(p.Precision, 1)
	s, q = p.Window/prec, 1
	for s%10 == 0 && s > 1 && s >= exactLimit/max(2*p.Limit, 1) {
		s /= 10
		q *= 10
	}
	return max(s, 1), q
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
