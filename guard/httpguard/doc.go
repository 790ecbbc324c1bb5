// Package httpguard is everything HTTP about guard decisions: the rate-limit
// response headers, the 429/403/400 bodies, identity extraction (API key,
// client IP behind trusted proxies, tenant, tier, cost) and a net/http
// middleware that puts any [guard.Checker] in front of a handler.
//
// The gateway's proxy, its check API and its Envoy rate-limit service all
// render headers through this package ([SetHeaders], [HeaderPairs]), so the
// three surfaces cannot drift apart.
//
// # Headers
//
// A decision with a deciding rule carries X-RateLimit-Limit, -Remaining,
// -Used, -Reset and -Resource (values of the deciding rule), RateLimit-Policy
// and RateLimit (RFC 9651 Lists, one item per applicable enforced rule,
// draft-ietf-httpapi-ratelimit-headers), X-RateLimit-Policy: degraded while
// Redis is unavailable (RateLimit is then omitted), and Retry-After on every
// 429. Tollgate owns those names: they replace same-named headers from the
// upstream, and a decision without headers (allowlisted, no rule, blocked)
// deletes them. Retry-After is the one exception: Tollgate sets it on its own
// 429s and otherwise leaves an upstream's Retry-After (say on a 503) alone,
// because that value speaks for the upstream, not for the rate limiter.
//
// # Bodies
//
// Rejections are JSON, {"error":{"code","message","details"}}, or RFC 9457
// application/problem+json when the client's Accept header asks for it
// (see [WriteDecision] for the negotiation rule). Messages never contain the
// API key.
//
// # Identity
//
// [Identity] takes the key from an ordered list of [KeySource]s and the
// client IP from the socket peer, walking X-Forwarded-For only when the peer
// is a configured trusted proxy. Headers naming a tenant, tier or cost are
// honoured only from trusted proxies.
//
// # Middleware
//
// [Middleware] extracts the identity, asks the Checker, answers rejections
// itself and otherwise calls the next handler with the headers set, replacing
// any same-named headers the handler sets. When the Checker cannot decide at
// all it fails open by default ([WithErrorHandler] changes that).
//
// # Repeat offenders
//
// Keys at the top of the penalty ladder and blocklisted keys are decided
// from the guard's memory; the middleware answers them with prebuilt
// bodies (no rendering, no allocation), and with Connection: close where
// the client is connected directly, never through a trusted proxy, whose
// connection other clients share. On a connection tracked with
// [TrackConn] (http.Server.ConnContext) the close comes at the n-th such
// answer, so that only a client that keeps sending after being told pays
// a new handshake; [WithOnClose] hears of each close.
package httpguard
