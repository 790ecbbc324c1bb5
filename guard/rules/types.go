package rules

import (
	"fmt"
	"net/netip"
)

// Algorithm names a rate-limiting algorithm.
type Algorithm string

// The algorithms a rule may use. TokenBucket is the default.
const (
	TokenBucket          Algorithm = "token_bucket"
	SlidingWindowLog     Algorithm = "sliding_window_log"
	SlidingWindowCounter Algorithm = "sliding_window_counter"
	FixedWindow          Algorithm = "fixed_window"
	GCRA                 Algorithm = "gcra"
)

// Bucket reports whether a is one of the refilling algorithms (token bucket,
// GCRA) whose parameters are a limit and a full-refill time rather than a
// window.
func (a Algorithm) Bucket() bool { return a == TokenBucket || a == GCRA }

// Scope says whose counter a rule charges.
type Scope string

// Scopes. ScopeKey is the default.
const (
	ScopeKey    Scope = "key"
	ScopeTenant Scope = "tenant"
	ScopeIP     Scope = "ip"
	ScopeGlobal Scope = "global"
)

// FailureMode says how a rule is decided while Redis is unavailable.
type FailureMode string

// Failure modes. FailOpen is the default.
const (
	FailOpen   FailureMode = "open"
	FailClosed FailureMode = "closed"
)

// Params are the effective numeric parameters of one counter, after per-key
// and temporary overrides. All times are in microseconds.
//
// For the windowed algorithms (fixed_window, sliding_window_log,
// sliding_window_counter) Limit units are allowed per Window; Precision is
// the number of sub-windows of a sliding_window_counter (1 otherwise).
//
// For the bucket algorithms (token_bucket, gcra) Limit is the capacity (the
// burst of a gcra rule) and FullNum/FullDen is the time in microseconds an
// empty bucket takes to refill completely (Limit ÷ refill rate), kept as an
// exact fraction in lowest terms. Window is, for gcra, the rule's window
// (part of the counter identity) and 0 for token_bucket.
type Params struct {
	Limit     int64
	Window    int64
	Precision int64
	FullNum   int64
	FullDen   int64
	// RatePeriod is, for a token_bucket given as `rate: N/period`, the
	// period in µs (0 for refill_rate and the other algorithms): only for
	// display (Envoy's current_limit in the rule's own unit), never part
	// of the counter.
	RatePeriod int64
}

// PolicyWindow is the `w` of the RateLimit-Policy header: the
// window in whole seconds, rounded up, at least 1. For bucket algorithms it
// is Limit ÷ rate, i.e. ceil(FullNum / (FullDen × 1e6)).
func (p Params) PolicyWindow(a Algorithm) int64 {
	var w int64
	if a.Bucket() {
		// ceil(ceil(n/d)/1e6) = ceil(n/(d·1e6)), and never forms d·1e6,
		// which overflows int64 for denominators above ~9.2e12.
		if p.FullDen > 0 {
			w = (p.FullNum/p.FullDen + min(1, p.FullNum%p.FullDen) + 999_999) / 1_000_000
		}
	} else {
		w = (p.Window + 999_999) / 1_000_000
	}
	return max(w, 1)
}

// RatePerSecond is the refill rate (bucket algorithms) or Limit ÷ Window,
// in units per second, for display and Envoy's current_limit.
func (p Params) RatePerSecond(a Algorithm) float64 {
	if a.Bucket() {
		return float64(p.Limit) * float64(p.FullDen) * 1e6 / float64(p.FullNum)
	}
	return float64(p.Limit) * 1e6 / float64(p.Window)
}

// Override is a temporary change of a counter's limit from the operator API
// or the penalty ladder: absolute (Limit > 0: the limit, capacity
// or burst becomes Limit and the rate scales with it) or multiplicative
// (Factor > 0: limit and rate both scale by Factor). Exactly one of Limit
// and Factor is set. Expiry is Unix microseconds, 0 for none.
type Override struct {
	Limit  int64
	Factor float64
	Expiry int64
	Reason string
}

// Apply returns p with the override applied. The full-refill time of bucket
// algorithms is unchanged, so their rate scales with the limit; a limit never
// drops below 1.
func (o Override) Apply(p Params) Params {
	switch {
	case o.Limit > 0:
		p.Limit = o.Limit
	case o.Factor > 0:
		p.Limit = max(1, int64(float64(p.Limit)*o.Factor))
	}
	return p
}

// Request is what rules are matched against. The raw Key is used only for
// glob matching and registry look-ups in memory; it is never stored or
// printed. An empty Key is an anonymous request.
type Request struct {
	Key        string
	KeyID      string
	Tenant     string
	Tier       string
	Endpoint   string // normalised (see Ruleset.Normalize)
	Method     string
	Domain     string // Envoy RLS domain; empty for HTTP requests
	Descriptor map[string]string
	IP         netip.Addr
}

// ListStatus is the result of the blocklist/allowlist look-up.
type ListStatus int

// List statuses, in precedence order.
const (
	Unlisted ListStatus = iota
	Blocklisted
	Allowlisted
)

// ValidationError names the rule and field a ruleset was refused for.
// Rule is the rule's id, or rules[i] (0-based) for a rule without one, and
// empty for top-level fields (keys, tiers, allowlist, ...). Field is the
// field's path, such as "window", "match.endpoint", "tiers[2].pattern" or
// "overrides[sk_prod_v…].rate" (raw keys shortened to a prefix); Line is
// the 1-based line in the source document, 0 when unknown.
type ValidationError struct {
	Rule  string
	Field string
	Line  int
	Msg   string
}

func (e *ValidationError) Error() string {
	var s string
	switch {
	case e.Rule != "" && e.Field != "":
		s = fmt.Sprintf("rule %q: field %q", e.Rule, e.Field)
	case e.Rule != "":
		s = fmt.Sprintf("rule %q", e.Rule)
	case e.Field != "":
		s = fmt.Sprintf("field %q", e.Field)
	default:
		s = "ruleset"
	}
	if e.Line > 0 {
		s += fmt.Sprintf(" (line %d)", e.Line)
	}
	return "rules: " + s + ": " + e.Msg
}
