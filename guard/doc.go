// Package guard decides, for every request, whether it may pass and when a
// rejected client may retry, against a ruleset (package rules) with counters
// in a Store: redisstore in production, where one Lua script decides every
// rule of a request atomically with Redis time, or memstore.
//
// Most users need only this package and an HTTP integration:
//
//	g, err := guard.New(redisstore.New(client), secret, ruleset)
//	d, err := g.Check(ctx, &guard.Request{Key: apiKey, Path: r.URL.Path, Method: r.Method})
//
// A Decision carries everything the rate-limit headers, the check API, Envoy
// RLS and decision events need; package httpguard writes it to HTTP.
//
// Precedence: blocklist (403) > allowlist (no limits) > penalty (429) >
// rules. Every matching rule applies; a request is admitted only when all
// enforced rules admit it, and a rejected request consumes nothing. API keys
// become key_ids (package keyid) before anything leaves the process.
//
// When the store fails, or refuses at once because a node's circuit breaker
// is open (ErrUnavailable), checks are decided degraded: `on_failure: open`
// rules allow, `on_failure: closed` rules are limited locally by the
// fallback store (WithFallback), and the decision says Degraded with reason
// redis_unavailable. Nothing decided degraded is charged afterwards.
//
// Guard implements Checker, the interface a local fast path wraps, so
// callers never change. See docs/guard.md for the design and
// docs/operations.md for failure modes.
package guard
