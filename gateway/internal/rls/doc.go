// Package rls is Tollgate's Envoy rate-limit service:
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit over gRPC
// (docs/gateway.md), so an Envoy or Istio mesh can use Tollgate as a drop-in.
// configs/envoy holds an example Envoy configuration.
//
// # Mapping
//
// Each descriptor of a call becomes one guard.Request. Its entries give the
// request's fields: api_key (else generic_key) the key, tenant the tenant
// (the key registry still wins), remote_address the client IP, path (else
// endpoint) the path (normalised by the guard as the proxy's is:
// unreserved escapes decoded, dot segments removed, slashes merged, a
// trailing slash and a query string dropped, then the route templates),
// method the method. A descriptor without remote_address has no client IP
// and matches no rule counted per IP (ip scope; key and tenant scope for a
// descriptor without a key), as a descriptor lacking an entry matches no
// rule that needs it; such descriptors never share one counter. Every entry, those included, also goes
// into Request.Descriptor, so rules with `match: {descriptor: {k: v}}`
// match it, and the call's domain into Request.Domain, so rules with
// `match: {domain: …}` apply to their domain only while rules without one
// apply to HTTP requests and every domain alike, sharing their counters.
// No other entry (tier, say) changes the identity.
//
// Cost: the descriptor's hits_addend when present, else the call's
// hits_addend when above 0, else 1. The descriptor's own `limit` field is
// ignored: limits come from the rules alone.
//
// # One call, one decision
//
// A call is one all-or-nothing decision over all its descriptors: the
// descriptors are decided by guard.Guard.CheckMany, which sends every
// counter of the call to Redis in one script (one per slot on Cluster,
// with refunds), charges two descriptors hitting one counter the sum of
// their costs, and charges nothing at all unless every descriptor is
// admitted.
//
// A descriptor whose hits_addend is present and 0 is a peek: it answers
// what cost 1 would get and charges nothing. Peeks are decided first, one
// guard.Guard.Peek each; if one would be rejected the call is OVER_LIMIT
// and the other descriptors are not decided at all (nothing is charged;
// their status is UNKNOWN). Otherwise the other descriptors are decided
// together as above. A peek therefore never sees the charges of its own
// call.
//
// # Answer
//
// overall_code is OVER_LIMIT when any descriptor is not admitted: over a
// limit, and also for what HTTP would answer 403 (blocked key, block rule)
// or 400 (invalid key — judged by guard.ValidKey as on every surface —,
// invalid path, cost above a limit), because Envoy has no other refusal
// and a bad or blocked key must not pass. A descriptor matching more rules
// than max_rules_per_request (HTTP's 500 TOO_MANY_RULES) fails the call
// with gRPC Internal instead: a fault of the rules, left to Envoy's
// failure_mode_deny. A blocked key's answer
// carries no rate-limit headers, as its 403 would not. A refusal that HTTP
// answers other than 429 (400, 403) carries the proxy's JSON error body as
// raw_body, with a content-type response header, which Envoy sends as its
// local reply's body: the client sees the error code. 429s stay bodiless.
//
// Each descriptor gets one status: OVER_LIMIT when it was refused on its
// own; OK when it was admitted, or when its own rules admitted it but
// another descriptor refused the call (its figures are then the counters'
// state without any charge); UNKNOWN when it was not decided because the
// call was refused before its counters were consulted. The status carries,
// from the descriptor's deciding rule, current_limit (in the
// rule's own unit where it has one: a window, or a token bucket's `rate:
// N/period`, of exactly one SECOND, MINUTE, HOUR or DAY is its limit — for
// gcra its limit, not its burst — or N per that unit, so 100 per 1m is 100
// per MINUTE; otherwise the rule's rate as floor(rate × unit) in the
// smallest of SECOND, MINUTE, HOUR and DAY where that is at least 1;
// slower rates continue into WEEK, MONTH (30 days) and YEAR (365 days);
// temporary overrides scale it), limit_remaining and
// duration_until_reset. A descriptor without an applicable rule
// (allowlisted, no rule matched) has no current_limit, nor has one whose
// deciding rule failed open while Redis is unavailable (nothing is known
// about its counter).
//
// The rate is exact: the rule's effective limit after overrides and
// penalties divided by its window, or for token_bucket and gcra by the
// full-refill time of the rule's parameters for the key (per-key overrides
// of the rules file included; temporary overrides scale limit and rate
// together and keep that time). Should the ruleset change between the
// decision and the answer so that the rule is gone, the rate is
// approximated by limit ÷ the RateLimit-Policy `w`.
//
// response_headers_to_add holds the rate-limit headers of the call's deciding
// descriptor (guard.CallDeciding: the refused one with the longest
// Retry-After, else the one with the least remaining), Retry-After
// included when it is over limit, rendered by httpguard.HeaderPairs like
// every other surface.
//
// # Errors
//
// Malformed calls get gRPC InvalidArgument and are not decided: an empty
// domain, no descriptors or more than the maximum (WithMaxDescriptors), a
// descriptor without entries or with more than the maximum
// (WithMaxEntries), an entry with an empty key, a key, value or domain
// longer than the maximum (WithMaxValueLen), one key given twice with
// different values in a descriptor (the identity would be ambiguous; equal
// repeats are fine), a remote_address that is not an IP address, and
// is_negative_hits (refunds through Envoy are not supported). When no
// decision can be made at all (no ruleset, Redis and the fallback both
// failed) the call gets Unavailable, and Envoy's failure_mode_deny decides;
// while Redis alone is down the guard answers as it does for HTTP (fail
// open, or locally for `on_failure: closed` rules). Error messages never
// quote an entry's value.
package rls
