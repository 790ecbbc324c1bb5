package rules

import (
	"fmt"
	"math/big"
	"strings"
)

// Bounds on parameters. Redis scripts compute in Lua doubles, which hold
// integers exactly up to 2^53; we keep every number they see at or below
// 2^52 so that sums of two stay exact too.
const (
	maxExact    = int64(1) << 52
	maxLimit    = int64(1_000_000_000_000) // limit, capacity, burst, rate count
	maxPrecis   = int64(1000)
	usPerMs     = int64(1000)
	usPerSecond = int64(1_000_000)
	usPerDay    = 86_400 * usPerSecond
	maxDuration = 366 * usPerDay // longest window or rate period, in µs
)

// parseDuration reads a positive duration written as one or more integer
// components with units ms, s, m, h or d ("500ms", "1m", "1h30m", "1d") and
// returns it in microseconds. It refuses zero, negative and fractional
// values, and anything longer than 366 days.
func parseDuration(s string) (int64, error) {
	if s == "" {
		return 0, fmt.Errorf("duration is empty")
	}
	if s[0] == '-' {
		return 0, fmt.Errorf("duration %q must be positive", s)
	}
	bad := func() (int64, error) {
		return 0, fmt.Errorf("invalid duration %q: want an integer with a unit ms, s, m, h or d (e.g. 500ms, 1m, 1h30m, 1d)", s)
	}
	var total int64
	rest := s
	for rest != "" {
		i := 0
		for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
			i++
		}
		if i == 0 || i > 15 {
			return bad()
		}
		var n int64
		for _, c := range rest[:i] {
			n = n*10 + int64(c-'0')
		}
		rest = rest[i:]
		var unit int64
		switch {
		case strings.HasPrefix(rest, "ms"):
			unit, rest = usPerMs, rest[2:]
		case strings.HasPrefix(rest, "s"):
			unit, rest = usPerSecond, rest[1:]
		case strings.HasPrefix(rest, "m"):
			unit, rest = 60*usPerSecond, rest[1:]
		case strings.HasPrefix(rest, "h"):
			unit, rest = 3600*usPerSecond, rest[1:]
		case strings.HasPrefix(rest, "d"):
			unit, rest = usPerDay, rest[1:]
		default:
			return bad()
		}
		// n < 10^15 and unit ≤ 8.64e10 could overflow: compare first.
		if n > maxDuration/unit {
			return 0, fmt.Errorf("duration %q is longer than 366d", s)
		}
		total += n * unit
		if total > maxDuration {
			return 0, fmt.Errorf("duration %q is longer than 366d", s)
		}
	}
	if total == 0 {
		return 0, fmt.Errorf("duration %q must be positive", s)
	}
	return total, nil
}

// parseRate reads "N/duration" (e.g. 30/1m, 7/3s; the duration's count may
// be left out: 100/s) and returns N and the period in microseconds.
func parseRate(s string) (n, period int64, err error) {
	num, per, ok := strings.Cut(s, "/")
	if !ok || num == "" || per == "" {
		return 0, 0, fmt.Errorf("invalid rate %q: want N/duration, e.g. 30/1m or 100/s", s)
	}
	if num[0] == '-' {
		return 0, 0, fmt.Errorf("rate %q must be positive", s)
	}
	n, err = parseDecimalInt(num)
	if err != nil {
		return 0, 0, fmt.Errorf("invalid rate %q: the count must be a positive integer", s)
	}
	if n <= 0 {
		return 0, 0, fmt.Errorf("rate %q must be positive", s)
	}
	if n > maxLimit {
		return 0, 0, fmt.Errorf("rate %q: count exceeds %d", s, maxLimit)
	}
	if per[0] < '0' || per[0] > '9' {
		per = "1" + per
	}
	period, err = parseDuration(per)
	if err != nil {
		return 0, 0, fmt.Errorf("invalid rate %q: %w", s, err)
	}
	return n, period, nil
}

// parseDecimalInt reads a non-negative decimal integer without sign,
// leading zeros (other than "0" itself) or separators.
func parseDecimalInt(s string) (int64, error) {
	if s == "" || len(s) > 18 || (len(s) > 1 && s[0] == '0') {
		return 0, fmt.Errorf("not a decimal integer")
	}
	var n int64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("not a decimal integer")
		}
		n = n*10 + int64(c-'0')
	}
	return n, nil
}

// parseInt reads a YAML integer scalar's text: an optional sign and decimal
// digits. Other YAML integer spellings (0x1F, 0o17, 1_000) are refused so
// the file means the same to every reader.
func parseInt(s string) (int64, error) {
	neg := false
	switch {
	case strings.HasPrefix(s, "-"):
		neg, s = true, s[1:]
	case strings.HasPrefix(s, "+"):
		s = s[1:]
	}
	n, err := parseDecimalInt(s)
	if err != nil {
		return 0, fmt.Errorf("want a decimal integer")
	}
	if neg {
		n = -n
	}
	return n, nil
}

// parseExactDecimal reads a non-negative decimal number ("0.5", "2", "1.25",
// "5e-1") as an exact rational, never through a float. The text is bounded
// (at most 40 digits, exponent within ±40) so that no input is expensive.
func parseExactDecimal(s string) (*big.Rat, error) {
	bad := fmt.Errorf("invalid number %q: want a plain decimal such as 0.5", s)
	if s == "" || len(s) > 64 {
		return nil, bad
	}
	if s[0] == '-' {
		return nil, fmt.Errorf("%q must be positive", s)
	}
	s = strings.TrimPrefix(s, "+")
	mant, expText, hasExp := strings.Cut(s, "e")
	if !hasExp {
		mant, expText, hasExp = strings.Cut(s, "E")
	}
	var exp int64
	if hasExp {
		e, err := parseInt(expText)
		if err != nil || e < -40 || e > 40 {
			return nil, bad
		}
		exp = e
	}
	intPart, frac, _ := strings.Cut(mant, ".")
	digits := intPart + frac
	if digits == "" || len(digits) > 40 {
		return nil, bad
	}
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return nil, bad
		}
	}
	num, ok := new(big.Int).SetString(digits, 10)
	if !ok {
		return nil, bad
	}
	scale := exp - int64(len(frac))
	r := new(big.Rat).SetInt(num)
	pow := new(big.Int).Exp(big.NewInt(10), big.NewInt(abs64(scale)), nil)
	if scale >= 0 {
		r.Mul(r, new(big.Rat).SetInt(pow))
	} else {
		r.Quo(r, new(big.Rat).SetInt(pow))
	}
	return r, nil
}

func abs64(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}

// exactFraction reduces num/den and returns it as int64s, or reports that
// either part exceeds 2^52.
func exactFraction(r *big.Rat) (num, den int64, ok bool) {
	lim := big.NewInt(maxExact)
	if r.Num().Cmp(lim) > 0 || r.Denom().Cmp(lim) > 0 || r.Sign() <= 0 {
		return 0, 0, false
	}
	return r.Num().Int64(), r.Denom().Int64(), true
}
