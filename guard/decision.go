package guard

import (
	"net/netip"

	"github.com/tollgate/tollgate/guard/rules"
)

// Request is one request to decide. Only Key or IP identify the client; the
// raw Key never leaves the process (it becomes a key_id first).
type Request struct {
	// Key is the raw API key; empty for an anonymous request.
	Key string
	// Tenant and Tier come from a trusted auth layer, if any. The key
	// registry overrides them; without either the key is its own tenant.
	Tenant string
	Tier   string
	// Path is the request path as sent on the wire (percent-encoded; a
	// query string is ignored), or the check API's endpoint or Envoy's
	// path. The guard normalises it (rules.CleanPath: 400 INVALID_PATH when
	// it cannot) and matches rules against its endpoint
	// (rules.Ruleset.Normalize); Decision.Path is the normal form.
	Path   string
	Method string
	// Domain and Descriptor are Envoy RLS fields; empty for HTTP requests.
	Domain     string
	Descriptor map[string]string
	// IP is the client address (the socket peer, or the first untrusted
	// X-Forwarded-For hop behind a trusted proxy).
	IP netip.Addr
	// Cost is the number of units the request asks for; 0 means 1 (use
	// Guard.Peek for a cost-0 peek). A rule's own cost takes precedence.
	Cost int64
	// Surface names where the request was decided ("proxy", "check",
	// "batch", "report", "rls", "authz"): Observers pass it on (decision
	// events carry it); the guard itself ignores it.
	Surface string
}

// Reason says why a decision came out the way it did.
type Reason string

// Reasons, used in decision events, metrics and the check API's `reason`.
const (
	ReasonAllowed          Reason = "allowed"
	ReasonRateLimited      Reason = "rate_limited"
	ReasonBlocklisted      Reason = "blocklisted"
	ReasonAllowlisted      Reason = "allowlisted"
	ReasonNoRule           Reason = "no_rule"
	ReasonPenalty          Reason = "penalty"
	ReasonBlockRule        Reason = "block_rule"
	ReasonCostExceedsLimit Reason = "cost_exceeds_limit"
	ReasonInvalidKey       Reason = "invalid_key"
	ReasonInvalidPath      Reason = "invalid_path"
	// ReasonTooManyRules: the request matched more rules than the guard
	// decides for one request (WithMaxRules); answered 500 without a store
	// call.
	ReasonTooManyRules     Reason = "too_many_rules"
	ReasonRedisUnavailable Reason = "redis_unavailable"
	// ReasonCallRejected: a CheckMany request that was refused with the
	// rest of its call because another request of the call was rejected.
	ReasonCallRejected Reason = "call_rejected"
)

// API error codes. One table for every surface.
const (
	CodeRateLimitExceeded = "RATE_LIMIT_EXCEEDED" // 429
	CodeKeyBlocked        = "KEY_BLOCKED"         // 403: blocklist, or a block rule selecting keys only
	CodeEndpointBlocked   = "ENDPOINT_BLOCKED"    // 403: a block rule selecting requests (endpoint, method, ...)
	CodePenalty           = "PENALTY"             // 429
	CodeCostExceedsLimit  = "COST_EXCEEDS_LIMIT"  // 400
	CodeInvalidKey        = "INVALID_KEY"         // 400
	CodeInvalidPath       = "INVALID_PATH"        // 400: a path above the root, or with %2F, %5C or %00
	CodeTooManyRules      = "TOO_MANY_RULES"      // 500: more rules matched than max_rules_per_request
	CodeBatchTooLarge     = "BATCH_TOO_LARGE"     // 400
	CodeInvalidRequest    = "INVALID_REQUEST"     // 400
	CodeUnauthorized      = "UNAUTHORIZED"        // 401
)

// RuleResult is the state of one applicable rule after a decision.
type RuleResult struct {
	ID        string
	Algorithm rules.Algorithm
	Shadow    bool
	// Allowed: this rule admitted (or, for a shadow rule, would have
	// admitted) the request.
	Allowed bool
	// Limit is the rule's effective limit, capacity or burst (after
	// overrides and penalties).
	Limit int64
	// Remaining is the floor of the units available now, ≥ 0 (debt shows
	// as 0); -1 when FailOpen.
	Remaining int64
	// Window is the RateLimit-Policy `w` in whole seconds.
	Window int64
	// Reset is the Unix time in seconds (rounded up) at which the counter is
	// full again if no more requests come.
	Reset int64
	// Next is the RateLimit `t`: whole seconds (rounded up) until at least
	// one more unit is available; 0 when the counter is full.
	Next int64
	// RetryAfter is, for a rejecting rule, the whole seconds (≥ 1, rounded
	// up, never shorter than Next) until the request's cost is admitted.
	RetryAfter int64
	// Degraded: decided without Redis (fail-open or local fail-closed).
	Degraded bool
	// FailOpen: allowed without any counter because Redis is unavailable
	// and the rule fails open (headers show remaining -1).
	FailOpen bool
}

// Decision is the answer for one request: everything the rate-limit headers,
// the check API, Envoy RLS and decision events need.
type Decision struct {
	Allowed bool
	// Status is the HTTP status to answer with: 200, 429, 403, 400, or 500
	// for TOO_MANY_RULES.
	Status int
	// Code is the API error code when Status is not 200.
	Code   string
	Reason Reason
	// Degraded: at least one rule was decided without Redis.
	Degraded bool
	// Peek: the request was only peeked (cost 0); nothing was charged.
	Peek bool
	// PenaltyLevel is the key's penalty ladder level when Reason is
	// ReasonPenalty, or ReasonBlocklisted for a block the ladder imposed
	// (0 for an operator's block); CloseConnection asks the HTTP layer to
	// answer with Connection: close where the peer is the client itself
	// (the controls' Close). Both are decided from memory, without the
	// store.
	PenaltyLevel    int
	CloseConnection bool
	// PenaltyUntil and PenaltyReason, for a decision of the penalty ladder
	// (PenaltyLevel > 0): when the penalty ends (Unix microseconds;
	// math.MaxInt64 until it is lifted, 0 unknown) and why the ladder
	// imposed it, in the words of the step that did ("20 of 20 requests in
	// 60s arrived while a Retry-After was running (100%)"; empty when not
	// known). The HTTP layer tells the client both, so that a penalised
	// client, or whoever runs a load test, sees what happened and until
	// when.
	PenaltyUntil  int64
	PenaltyReason string

	// Rules holds the applicable enforced rules, in ruleset order, then the
	// shadow rules. Deciding indexes the rule whose values go into the
	// X-RateLimit-* headers (-1 when no rule applied).
	Rules    []RuleResult
	Deciding int

	// RetryAfter is the Retry-After header value in seconds (0 unless
	// Status is 429).
	RetryAfter int64

	// Time is the decision's time in Unix microseconds (Redis time when
	// Redis decided).
	Time int64

	// RefusingRule and RefusingLimit name what refused the request before
	// any counter was consulted, for messages: the block rule (403
	// ENDPOINT_BLOCKED or KEY_BLOCKED), or for COST_EXCEEDS_LIMIT the rule
	// whose limit the cost exceeds and that limit (RefusingRule empty when
	// the cost exceeds the guard's max cost, RefusingLimit).
	RefusingRule  string
	RefusingLimit int64

	// Identity, resolved from the request. KeyID is the keyed hash of the
	// key, KeyPrefix a short non-secret prefix for humans.
	KeyID     string
	KeyPrefix string
	Tenant    string
	Tier      string
	// Endpoint is what rules matched: the normal path without its trailing
	// slash, or its route template (rules.Ruleset.Normalize).
	Endpoint string
	// Path is the request path in normal form, trailing slash kept
	// (rules.CleanPath): what a proxy forwards, so that the limiter and the
	// upstream see the same resource. Empty for an invalid path (400
	// INVALID_PATH) and for a request without one.
	Path string
	Cost int64
}

// DecidingRule returns the deciding rule's result, or nil.
func (d *Decision) DecidingRule() *RuleResult {
	if d.Deciding < 0 || d.Deciding >= len(d.Rules) {
		return nil
	}
	return &d.Rules[d.Deciding]
}

// HasHeaders reports whether the response carries rate-limit headers: not
// for allowlisted, blocked or unmatched requests.
func (d *Decision) HasHeaders() bool { return d.Deciding >= 0 }
