package tollgatev1

import (
	"time"
	"unicode/utf8"
)

// Bounds of the DecisionEvent fields. A gateway never writes a value outside
// them: it cuts a longer string (ending it with TruncationMark) and clamps a
// number, counting each correction. The aggregator refuses an event with a
// value outside them, counts it and never applies it, so one bad record
// cannot corrupt a usage row, overflow a total or produce a rollup too large
// to publish. Other consumers may rely on them too.
const (
	// MaxGatewayIDLen bounds gateway_id, in bytes.
	MaxGatewayIDLen = 256
	// MaxNameLen bounds, in bytes, each of tenant, tier, key_id, key_prefix,
	// rule_id, algorithm, reason, method, surface, client_ip, every
	// shadow_would_reject id and command_actor. (Rules already limit
	// tenants and tiers to 128 bytes and rule ids to 64.)
	MaxNameLen = 128
	// MaxEndpointLen bounds endpoint, in bytes (the check API's limit).
	MaxEndpointLen = 2048
	// MaxCommandReasonLen bounds command_reason, in bytes.
	MaxCommandReasonLen = 1024
	// MaxCost bounds cost: 0 ≤ cost ≤ MaxCost, for decisions and reports
	// alike. A gateway's max_cost may not exceed it. Sums of costs saturate
	// at the largest int64 rather than wrap.
	MaxCost = 1_000_000_000
	// MaxRetryAfterSeconds bounds retry_after_seconds: 0 to 366 days.
	MaxRetryAfterSeconds = 366 * 24 * 60 * 60
	// MaxEventAge and MaxEventAhead bound time_unix_micros against the
	// record's Kafka timestamp ts: ts − MaxEventAge ≤ time ≤ ts +
	// MaxEventAhead, and never more than MaxEventAhead after the reader's
	// clock. (A gateway whose spool holds events for longer than
	// MaxEventAge, a Kafka outage of a month, sees them refused.) A gateway
	// replaces a decision time further than MaxEventAhead from its own clock
	// (a Redis clock gone wrong) with its clock.
	MaxEventAge   = 30 * 24 * time.Hour
	MaxEventAhead = 10 * time.Minute
	// MaxSeqJump bounds how far one event may move its source's high-water
	// mark: an event whose seq is more than MaxSeqJump above the highest seq
	// applied is held, not applied, until SeqConfirmRun events continue it
	// with nothing arriving from below (then the numbers it skipped count as
	// missing); an event arriving from below discards it. A gateway skips
	// numbers only for decisions it dropped, so a longer jump means it
	// dropped more than MaxSeqJump decisions in a row of one partition, or a
	// record that is not the gateway's.
	MaxSeqJump = 100_000
	// SeqConfirmRun is the length of the run that confirms a held jump.
	SeqConfirmRun = 16
)

// TruncationMark ends a string a gateway cut to its bound ("…", 3 bytes).
const TruncationMark = "…"

// CutLen returns how many leading bytes of s to keep so that they,
// followed by TruncationMark, fit in max bytes without splitting a UTF-8
// sequence: len(s) when s fits as it is. The result is used as s[:n], then
// TruncationMark when n < len(s).
func CutLen(s string, max int) int { return cutLen(s, max) }

// cutLen is CutLen for a string in bytes too.
func cutLen[S string | []byte](s S, max int) int {
	if len(s) <= max {
		return len(s)
	}
	n := max - len(TruncationMark)
	if n <= 0 {
		return 0
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return n
}
