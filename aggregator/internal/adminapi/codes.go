package adminapi

// The operator API's error codes: every error answer is
// {"error": {"code": <one of these>, "message": "…"}}, with more fields
// where a code says so.
const (
	// 400: a malformed request (body, query, If-Match).
	CodeInvalidRequest = "INVALID_REQUEST"
	// 400: {key} is not an API key a gateway would accept (at most 256
	// bytes, no control characters or spaces) nor kid:<key_id>.
	CodeInvalidKey = "INVALID_KEY"
	// 400: the ruleset fails validation; "details" names each rule, field
	// and line.
	CodeInvalidRules = "INVALID_RULES"
	// 404: no such route, entry or version.
	CodeNotFound = "NOT_FOUND"
	// 409: the entry kept changing under an unconditional write (retried a
	// few times).
	CodeConflict = "CONFLICT"
	// 409 (412 with a stale If-Match): the active ruleset entry in NATS
	// does not decode; "revision", "bytes", "sha256" and "cause" describe
	// it, and the ETag is "r<revision>": replace it with PUT rules and
	// If-Match: r<revision>, or roll back.
	CodeRulesCorrupt = "RULES_CORRUPT"
	// 409: a blocklist, allowlist or override entry in NATS does not decode
	// or sits under the wrong KV key; the same fields as RULES_CORRUPT.
	// Replace it with PUT or remove it with DELETE.
	CodeEntryCorrupt = "ENTRY_CORRUPT"
	// 412: If-Match names a version (or revision) that is not the current
	// one; the ETag names the current one.
	CodeVersionMismatch = "VERSION_MISMATCH"
	// 413: a body above its bound.
	CodeBodyTooLarge = "BODY_TOO_LARGE"
	// 413: a ruleset whose KV value would exceed what NATS takes.
	CodeRulesTooLarge = "RULES_TOO_LARGE"
	// 500: reading local state failed.
	CodeInternal = "INTERNAL"
	// 502: NATS did not take the change (nothing changed).
	CodeNATSUnavailable = "NATS_UNAVAILABLE"
	// 502: the change was sent but whether it took effect is unknown (the
	// answer was lost and reading it back failed): read it again. The
	// audit log holds the change and a follow-up entry saying so.
	CodeOutcomeUnknown = "OUTCOME_UNKNOWN"
	// 502: a lift command could not be written to Kafka.
	CodeKafkaUnavailable = "KAFKA_UNAVAILABLE"
	// 503: the change's audit entry could not be written; nothing changed.
	CodeAuditFailed = "AUDIT_FAILED"
	// 503: the control-plane routes without NATS configured, or before it
	// is reached.
	CodeNATSNotConfigured = "NATS_NOT_CONFIGURED"
	// 503: keys/{key} without the rules and Redis, penalties without state.
	CodeNotConfigured = "NOT_CONFIGURED"
	CodeUnavailable   = "UNAVAILABLE"
	// 503: keys/{key} while no ruleset can be loaded.
	CodeRulesUnavailable = "RULES_UNAVAILABLE"
	// 503: Redis did not answer a keys/{key} read, or refused a change
	// before it was attempted.
	CodeRedisUnavailable = "REDIS_UNAVAILABLE"
)
