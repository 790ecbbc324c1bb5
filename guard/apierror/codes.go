package apierror

import (
	"slices"
	"strconv"
)

// The API error codes. A code is part of the contract: clients branch on
// it, so a code is never renamed and never changes its meaning. A new code
// gets a constant here and its rows in the table below; the reference's
// error tables follow from the rows.
const (
	// RateLimitExceeded: an enforced rule rejected the request (429).
	RateLimitExceeded = "RATE_LIMIT_EXCEEDED"
	// Penalty: the key is in a penalty cooldown (429).
	Penalty = "PENALTY"
	// KeyBlocked: the key is on the blocklist, or a block rule selecting
	// keys only matched (403).
	KeyBlocked = "KEY_BLOCKED"
	// EndpointBlocked: a block rule selecting requests (endpoint, method,
	// …) matched (403).
	EndpointBlocked = "ENDPOINT_BLOCKED"
	// InvalidKey: an API key no gateway would accept (400).
	InvalidKey = "INVALID_KEY"
	// InvalidPath: a path above the root, or holding an encoded slash,
	// backslash or NUL (400).
	InvalidPath = "INVALID_PATH"
	// CostExceedsLimit: a cost that can never be admitted (400).
	CostExceedsLimit = "COST_EXCEEDS_LIMIT"
	// TooManyRules: the request matched more rules than one request may
	// (500).
	TooManyRules = "TOO_MANY_RULES"

	// InvalidRequest: a malformed request: body, query, header (400).
	InvalidRequest = "INVALID_REQUEST"
	// BatchTooLarge: a check batch above its bound (400).
	BatchTooLarge = "BATCH_TOO_LARGE"
	// Unauthorized: the bearer token is missing or wrong (401).
	Unauthorized = "UNAUTHORIZED"
	// Forbidden: the credentials are valid but may not do this: a change
	// made with the read-only viewer token, or a console change that fails
	// the cross-site checks (403).
	Forbidden = "FORBIDDEN"
	// NotFound: no such route, entry or version (404).
	NotFound = "NOT_FOUND"
	// MethodNotAllowed: a method the route does not take (405).
	MethodNotAllowed = "METHOD_NOT_ALLOWED"
	// BodyTooLarge: a body above its bound (413).
	BodyTooLarge = "BODY_TOO_LARGE"
	// Unavailable: no answer could be made now; retry (503).
	Unavailable = "UNAVAILABLE"
	// UpstreamUnavailable: the proxy's upstream did not answer (502).
	UpstreamUnavailable = "UPSTREAM_UNAVAILABLE"

	// InvalidRules: a ruleset that fails validation; "details" names each
	// rule, field and line (400).
	InvalidRules = "INVALID_RULES"
	// Conflict: an entry kept changing under an unconditional write (409).
	Conflict = "CONFLICT"
	// RulesCorrupt: the active ruleset entry in NATS does not decode; the
	// answer describes it (409, or 412 with a stale If-Match).
	RulesCorrupt = "RULES_CORRUPT"
	// EntryCorrupt: a list or override entry in NATS does not decode (409).
	EntryCorrupt = "ENTRY_CORRUPT"
	// VersionMismatch: If-Match names a version that is not the current
	// one (412).
	VersionMismatch = "VERSION_MISMATCH"
	// RulesTooLarge: a ruleset whose KV value would exceed what NATS takes
	// (413).
	RulesTooLarge = "RULES_TOO_LARGE"
	// Internal: reading local state failed (500).
	Internal = "INTERNAL"
	// NATSUnavailable: NATS did not take a change, or is not reached yet
	// (502, 503).
	NATSUnavailable = "NATS_UNAVAILABLE"
	// OutcomeUnknown: a change was sent but whether it took effect is
	// unknown (502).
	OutcomeUnknown = "OUTCOME_UNKNOWN"
	// KafkaUnavailable: Kafka did not answer: a lift command could not be
	// written (502), or a change or the control plane waits for it (503).
	KafkaUnavailable = "KAFKA_UNAVAILABLE"
	// AuditFailed: a change's audit entry could not be written; nothing
	// changed (503).
	AuditFailed = "AUDIT_FAILED"
	// NATSNotConfigured: a control-plane route without NATS configured
	// (503).
	NATSNotConfigured = "NATS_NOT_CONFIGURED"
	// NotConfigured: a route whose backing store is not configured (503).
	NotConfigured = "NOT_CONFIGURED"
	// RulesUnavailable: a route that needs the ruleset before one can be
	// loaded (503).
	RulesUnavailable = "RULES_UNAVAILABLE"
	// RedisUnavailable: Redis did not answer, or refused a change before
	// it was attempted (503).
	RedisUnavailable = "REDIS_UNAVAILABLE"
	// StateRestoring: the aggregator's state is still being restored from
	// the changelog, so a read of it would be incomplete (503).
	StateRestoring = "STATE_RESTORING"
)

// Surface is a group of HTTP surfaces that answer with the same codes: one
// error table of the reference each.
type Surface uint8

// The surfaces, in the reference's order.
const (
	// Decisions: the answer to a request the guard decided, alike on
	// every data-plane surface — the proxy, the check API, /v1/authz,
	// Envoy's rate-limit service and the HTTP middleware.
	Decisions Surface = iota + 1
	// Gateway: the gateway's own answers about a request it could not
	// decide (the check API's and the proxy's).
	Gateway
	// Aggregator: the aggregator's operator API and usage reports.
	Aggregator
)

// String returns the surface's name: "decisions", "gateway" or
// "aggregator".
func (s Surface) String() string {
	switch s {
	case Decisions:
		return "decisions"
	case Gateway:
		return "gateway"
	case Aggregator:
		return "aggregator"
	}
	return "surface(" + strconv.Itoa(int(s)) + ")"
}

// Surfaces lists every surface, in the reference's order.
func Surfaces() []Surface { return []Surface{Decisions, Gateway, Aggregator} }

// Row says that on a surface a code is answered with an HTTP status, and
// when.
type Row struct {
	Surface Surface
	Status  int
	Code    string
	// When is the reference's text: in which case the code is answered,
	// and what the client can do (Markdown).
	When string
}

// table is the vocabulary: every code, on every surface that answers it,
// with its status. A code answered with two statuses has a row for each.
// Within a surface rows are in the reference's order (by status).
var table = []Row{
	{Decisions, 429, RateLimitExceeded, "an enforced rule rejected the request; nothing was consumed from any rule"},
	{Decisions, 429, Penalty, "the key is in a penalty cooldown (penalty ladder level 2); `Retry-After` = the cooldown left"},
	{Decisions, 403, KeyBlocked, "the key is on the blocklist (by an operator, or at the penalty ladder's top), or a `block: true` rule selecting keys only matched"},
	{Decisions, 403, EndpointBlocked, "a `block: true` rule selecting requests (by endpoint, method, …) matched; the message names the rule"},
	{Decisions, 400, InvalidKey, "the API key is longer than 256 bytes, not valid UTF-8, or holds a space or a control character"},
	{Decisions, 400, InvalidPath, "the path leads above the root, or holds `%2F`, `%5C`, `%00` (either case), a raw backslash or a control character"},
	{Decisions, 400, CostExceedsLimit, "the request's cost is above `max_cost` or above the limit of an applicable enforced rule: it can never be admitted; nothing consumed, no `Retry-After`"},
	{Decisions, 500, TooManyRules, "the request matches more than `max_rules_per_request` rules (a ruleset to fix); no Redis call"},

	{Gateway, 400, InvalidRequest, "a body that is not valid JSON for the endpoint (unknown fields, wrong types, trailing data), an invalid `ip`, a cost that is not a positive integer, or `/v1/authz` without a forwarded URI"},
	{Gateway, 400, BatchTooLarge, "`POST /v1/check/batch` with more than `max_batch` items (default 100); refused whole"},
	{Gateway, 401, Unauthorized, "`api_token` is set and the request lacks `Authorization: Bearer <token>` (`/v1/authz`: `X-Tollgate-Token`, or a caller in `identity.trusted_proxies`)"},
	{Gateway, 404, NotFound, "a path the check API does not serve"},
	{Gateway, 405, MethodNotAllowed, "a method the path does not take"},
	{Gateway, 413, BodyTooLarge, "a body above `limits.max_body_bytes` (default 64 KiB)"},
	{Gateway, 502, UpstreamUnavailable, "the proxy's upstream did not answer"},
	{Gateway, 503, Unavailable, "no decision could be made — `POST /v1/report` while Redis is unavailable, say (a charge cannot be made degraded); `Retry-After: 1`. In a batch, the failed item's `status` and `error`"},

	{Aggregator, 400, InvalidRules, "a ruleset that fails validation; `details` lists every problem with its rule, field and line"},
	{Aggregator, 400, InvalidRequest, "a malformed body, query parameter or `If-Match` (the message says which and what is expected)"},
	{Aggregator, 400, InvalidKey, "`{key}` is not an API key a gateway would accept (at most 256 bytes, valid UTF-8, no control characters or spaces) nor `kid:<22-character key_id>`; for `keys/{key}`, a `kid:` of a key not in the rules' key registry"},
	{Aggregator, 401, Unauthorized, "no or a wrong `Authorization: Bearer <TOLLGATE_ADMIN_TOKEN>` (with `WWW-Authenticate: Bearer realm=\"tollgate\"`); a request without a bearer token never changes anything, whatever its content type or origin"},
	{Aggregator, 403, Forbidden, "a change made with `TOLLGATE_VIEWER_TOKEN` (the viewer token reads only), or a change made with a console session cookie whose `Origin` (else `Referer`) is not the API's own host or that lacks the session's `X-CSRF-Token`; nothing changed"},
	{Aggregator, 404, NotFound, "no such route, no ruleset yet, a rollback version outside the kept history, a key not on the list, no override, no penalty state to lift"},
	{Aggregator, 409, Conflict, "an entry kept changing under an unconditional write (retried a few times first)"},
	{Aggregator, 409, RulesCorrupt, "the ruleset entry in NATS does not decode; `revision`, `bytes`, `sha256` and `cause` describe it and the `ETag` is `\"r<revision>\"`: replace it with `PUT rules` and `If-Match: r<revision>`, or roll back"},
	{Aggregator, 409, EntryCorrupt, "a blocklist, allowlist or override entry in NATS does not decode or sits under the wrong KV key (the same fields): replace it with `PUT` or remove it with `DELETE`"},
	{Aggregator, 412, VersionMismatch, "`If-Match` names a version that is no longer current (rules, overrides); the answer's `ETag` is the current one"},
	{Aggregator, 412, RulesCorrupt, "`PUT rules` with an `If-Match` other than `r<revision>` while the ruleset entry is corrupt; the `ETag` is `\"r<revision>\"`"},
	{Aggregator, 413, BodyTooLarge, "a body above the route's limit (rulesets: 512 KiB)"},
	{Aggregator, 413, RulesTooLarge, "a ruleset whose stored entry would exceed what NATS takes"},
	{Aggregator, 500, Internal, "reading the local state or audit log failed"},
	{Aggregator, 502, NATSUnavailable, "NATS did not take the change (nothing changed)"},
	{Aggregator, 502, OutcomeUnknown, "the change was sent but its answer was lost and reading it back failed: read it again (the audit log says so too)"},
	{Aggregator, 502, KafkaUnavailable, "a penalty lift could not be sent to Kafka"},
	{Aggregator, 503, KafkaUnavailable, "a change while Kafka does not answer (every change is audited through Kafka first, so nothing is changed), and the control-plane routes until Kafka first answers; with `Retry-After: 1`"},
	{Aggregator, 503, StateRestoring, "usage reports, `GET /admin/v1/audit` and `penalties/{key}` before the instance's state is restored (the answer would be incomplete); with `Retry-After: 1`"},
	{Aggregator, 503, AuditFailed, "the change's audit entry could not be written (Kafka down): nothing changed, since a change is audited before it takes effect"},
	{Aggregator, 503, NATSNotConfigured, "a control-plane route on an aggregator without `TOLLGATE_NATS_URL`"},
	{Aggregator, 503, NATSUnavailable, "NATS JetStream not reached yet"},
	{Aggregator, 503, RedisUnavailable, "`keys/{key}` routes while Redis is unavailable (a change is then not attempted)"},
	{Aggregator, 503, RulesUnavailable, "`keys/{key}` routes before the ruleset is known"},
	{Aggregator, 503, NotConfigured, "`keys/{key}` routes on an aggregator without Redis settings"},
	{Aggregator, 503, Unavailable, "`penalties/{key}` on an instance that does not serve penalty state; a change that gave up waiting for another change on the same instance to finish"},
}

// Rows returns the table: every code on every surface that answers it,
// with its status, grouped by surface in Surfaces' order. The slice is
// the caller's.
func Rows() []Row { return slices.Clone(table) }

// Status returns the HTTP status code is always answered with, and true;
// or 0 and false for a code answered with several statuses (Rows says
// when each) or not in the table.
func Status(code string) (int, bool) {
	status := 0
	for i := range table {
		switch {
		case table[i].Code != code:
		case status == 0:
			status = table[i].Status
		case status != table[i].Status:
			return 0, false
		}
	}
	return status, status != 0
}

// Known reports whether code is in the table.
func Known(code string) bool {
	return slices.ContainsFunc(table, func(r Row) bool { return r.Code == code })
}

// Answers reports whether the table has code answered with status on some
// surface.
func Answers(status int, code string) bool {
	return slices.ContainsFunc(table, func(r Row) bool { return r.Code == code && r.Status == status })
}
