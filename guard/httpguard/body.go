package httpguard

import (
	"math"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/tollgate/tollgate/guard"
)

// Problem types of draft-ietf-httpapi-ratelimit-headers, used as the RFC
// 9457 `type` of rejections in application/problem+json.
const (
	ProblemQuotaExceeded = "https://iana.org/assignments/http-problem-types#quota-exceeded"
	ProblemAbnormalUsage = "https://iana.org/assignments/http-problem-types#abnormal-usage-detected"
)

const (
	problemTitleQuotaExceeded = "Request cannot be satisfied as assigned quota has been exceeded"
	problemTitleAbnormalUsage = "Request not satisfied due to detection of abnormal request pattern"
	problemTypeBlank          = "about:blank"
)

// WriteDecision answers a request with d. It always writes d's headers
// (see [SetHeaders]). For an admission (status 200) that is all: the caller
// goes on to write the response. For anything else it writes the status and
// an error body, and the response is complete:
//
//   - 429 (RATE_LIMIT_EXCEEDED, PENALTY):
//     {"error":{"code","message","details":{"rule","limit","remaining",
//     "window_seconds","retry_after_seconds","reset_at"}}}, where the
//     details describe the deciding rule (a penalty without one has only
//     retry_after_seconds). reset_at is X-RateLimit-Reset in RFC 3339, UTC.
//   - 403 (KEY_BLOCKED, ENDPOINT_BLOCKED), 400 (COST_EXCEEDS_LIMIT,
//     INVALID_KEY, INVALID_PATH, ...) and 500 (TOO_MANY_RULES):
//     {"error":{"code","message"}}, the message naming the refusing rule
//     where there is one (see [Message]).
//   - An answer of the penalty ladder (429 PENALTY, or 403 KEY_BLOCKED at
//     its top) says so in its message — the level, until when, the
//     ladder's reason — and its details carry penalty_level,
//     penalty_reason (when known) and expires_at (RFC 3339, UTC; absent
//     for a penalty that lasts until it is lifted).
//
// When the request's Accept header asks for application/problem+json
// (named explicitly with q > 0, and application/json not weighted higher;
// */* alone means JSON) the body is an RFC 9457 problem instead: `type` is
// [ProblemQuotaExceeded] for 429 RATE_LIMIT_EXCEEDED and
// [ProblemAbnormalUsage] for PENALTY (each with `violated-policies`, the ids
// of the enforced rules that rejected the request), "about:blank" for other
// statuses; plus `title`, `status`, `detail` and the extension member `code`
// (the API error code). Messages never contain the API key.
//
// d.Code names the error; when it is empty the code follows from the
// status (and d.Reason for penalties). r may be nil (then the body is
// JSON). A nil d is an admission without headers.
func WriteDecision(w http.ResponseWriter, r *http.Request, d *guard.Decision) {
	SetHeaders(w.Header(), d)
	status := decisionStatus(d)
	if status == http.StatusOK {
		return
	}
	problem := r != nil && wantsProblem(r.Header["Accept"])
	writeBody(w, status, problem, appendBody(make([]byte, 0, 512), d, status, problem))
}

// AppendDecisionBody appends to b the JSON body WriteDecision writes for
// d (without a problem+json Accept) and returns it with d's HTTP status;
// for an admission it appends nothing and the status is 200. Surfaces that
// are not HTTP responses of their own (Envoy RLS) carry it so that every
// surface words a refusal alike.
func AppendDecisionBody(b []byte, d *guard.Decision) ([]byte, int) {
	status := decisionStatus(d)
	if status == http.StatusOK {
		return b, status
	}
	return appendBody(b, d, status, false), status
}

// appendBody appends the error body of a refusal d with HTTP status.
func appendBody(b []byte, d *guard.Decision, status int, problem bool) []byte {
	code := d.Code
	if code == "" {
		code = defaultCode(d, status)
	}
	var scratch [256]byte
	msg := decisionMessage(scratch[:0], d, code)
	if problem {
		return appendDecisionProblem(b, d, status, code, msg)
	}
	return appendDecisionJSON(b, d, status, code, msg)
}

// WriteError writes a complete error response that is not a rate-limit
// decision, such as 400 INVALID_KEY or INVALID_REQUEST: status, and
// {"error":{"code","message"}}, or an RFC 9457 problem (type "about:blank")
// when r's Accept header asks for one as described at [WriteDecision].
// message is shown to the client as is: never put an API key in it. r may
// be nil. No rate-limit headers are written.
func WriteError(w http.ResponseWriter, r *http.Request, status int, code, message string) {
	problem := r != nil && wantsProblem(r.Header["Accept"])
	b := make([]byte, 0, 256)
	if problem {
		b = appendProblemHead(b, problemTypeBlank, http.StatusText(status), status, code, message)
		b = append(b, '}')
	} else {
		b = appendErrorHead(b, code, message)
		b = append(b, "}}"...)
	}
	writeBody(w, status, problem, b)
}

func writeBody(w http.ResponseWriter, status int, problem bool, body []byte) {
	h := w.Header()
	ct := contentTypeJSON
	if problem {
		ct = contentTypeProblem
	}
	h.Set("Content-Type", ct)
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// invalidPathMessage is the message of 400 INVALID_PATH.
const invalidPathMessage = "The request path is invalid: it leads above the root, or holds an encoded slash, backslash or NUL (%2F, %5C, %00)."

// Message returns the human-readable message of a decision that is not an
// admission, as WriteDecision writes it: it names the rule that refused the
// request where there is one, and never contains the API key. The check
// API uses it too, so every surface words a refusal alike. For an
// admission it returns "".
func Message(d *guard.Decision) string {
	status := decisionStatus(d)
	if status == http.StatusOK {
		return ""
	}
	code := d.Code
	if code == "" {
		code = defaultCode(d, status)
	}
	var scratch [256]byte
	return string(decisionMessage(scratch[:0], d, code))
}

// defaultCode is the API error code of a decision whose Code is empty.
func defaultCode(d *guard.Decision, status int) string {
	switch status {
	case http.StatusTooManyRequests:
		if d.Reason == guard.ReasonPenalty {
			return guard.CodePenalty
		}
		return guard.CodeRateLimitExceeded
	case http.StatusForbidden:
		return guard.CodeKeyBlocked
	case http.StatusInternalServerError:
		return guard.CodeTooManyRules
	}
	return guard.CodeInvalidRequest
}

// decisionMessage appends the human-readable message of a non-admission.
// It is printable ASCII: rule ids go through appendSFString.
func decisionMessage(b []byte, d *guard.Decision, code string) []byte {
	dr := d.DecidingRule()
	switch code {
	case guard.CodeRateLimitExceeded:
		if dr == nil {
			b = append(b, "Rate limit exceeded."...)
		} else {
			b = append(b, "Rate limit "...)
			b = appendSFString(b, dr.ID)
			b = append(b, " exceeded: "...)
			b = strconv.AppendInt(b, dr.Limit, 10)
			b = append(b, " per "...)
			b = appendSeconds(b, dr.Window)
			b = append(b, '.')
		}
		b = append(b, " Retry after "...)
		b = appendSeconds(b, retryAfter(d))
		return append(b, '.')
	case guard.CodePenalty:
		if d.PenaltyLevel <= 0 {
			b = append(b, "This API key kept sending requests while asked to wait and is under a temporary penalty. Retry after "...)
		} else {
			b = append(b, "This API key is at level "...)
			b = strconv.AppendInt(b, int64(d.PenaltyLevel), 10)
			b = append(b, " of the penalty ladder (cooldown: every request is refused until it ends)"...)
			b = appendPenaltyReason(b, d)
			b = append(b, ". Retry after "...)
		}
		b = appendSeconds(b, retryAfter(d))
		return append(b, '.')
	case guard.CodeKeyBlocked, guard.CodeEndpointBlocked:
		if d.PenaltyLevel > 0 && code == guard.CodeKeyBlocked && d.Reason == guard.ReasonBlocklisted {
			b = append(b, "This API key is blocked at level "...)
			b = strconv.AppendInt(b, int64(d.PenaltyLevel), 10)
			b = append(b, " of the penalty ladder "...)
			if d.PenaltyUntil > 0 && d.PenaltyUntil < math.MaxInt64 {
				b = append(b, "until "...)
				b = appendUnixMicros(b, d.PenaltyUntil)
			} else {
				b = append(b, "until an operator lifts it"...)
			}
			b = appendPenaltyReason(b, d)
			return append(b, '.')
		}
		if d.Reason == guard.ReasonBlockRule && d.RefusingRule != "" {
			b = append(b, "Requests matching rule "...)
			b = appendSFString(b, d.RefusingRule)
			return append(b, " are blocked."...)
		}
		if code == guard.CodeEndpointBlocked {
			return append(b, "Requests to this endpoint are blocked."...)
		}
		return append(b, "This API key is blocked."...)
	case guard.CodeCostExceedsLimit:
		b = append(b, "The request's cost"...)
		if d.Cost > 0 {
			b = append(b, " of "...)
			b = strconv.AppendInt(b, d.Cost, 10)
		}
		switch {
		case d.RefusingRule != "":
			b = append(b, " exceeds the limit of "...)
			b = strconv.AppendInt(b, d.RefusingLimit, 10)
			b = append(b, " of rule "...)
			b = appendSFString(b, d.RefusingRule)
		case d.RefusingLimit > 0:
			b = append(b, " exceeds the largest cost one request may ask for, "...)
			b = strconv.AppendInt(b, d.RefusingLimit, 10)
		default:
			b = append(b, " exceeds the limit"...)
			if dr != nil {
				b = append(b, " of "...)
				b = strconv.AppendInt(b, dr.Limit, 10)
				b = append(b, " of rule "...)
				b = appendSFString(b, dr.ID)
			}
		}
		return append(b, "; it can never be admitted."...)
	case guard.CodeInvalidKey:
		return append(b, "The API key is malformed: longer than 256 bytes, not valid UTF-8, or holding a space or a control character."...)
	case guard.CodeInvalidPath:
		return append(b, invalidPathMessage...)
	case guard.CodeTooManyRules:
		return append(b, "The request matches more rate-limit rules than one request may; the gateway's rules need fixing."...)
	}
	return append(b, http.StatusText(decisionStatus(d))...)
}

// maxReasonBytes bounds the penalty ladder's reason in a message.
const maxReasonBytes = 200

// appendPenaltyReason appends "; the ladder's reason: <reason>" for a
// decision of the penalty ladder that carries one, as printable ASCII
// (anything else becomes '?'), at most maxReasonBytes of it.
func appendPenaltyReason(b []byte, d *guard.Decision) []byte {
	if d.PenaltyReason == "" {
		return b
	}
	b = append(b, "; the ladder's reason: "...)
	return appendPrintable(b, d.PenaltyReason, maxReasonBytes)
}

// appendPrintable appends at most n bytes of s, each byte outside
// printable ASCII replaced by '?'.
func appendPrintable(b []byte, s string, n int) []byte {
	for i := 0; i < len(s) && i < n; i++ {
		c := s[i]
		if c < 0x20 || c > 0x7e {
			c = '?'
		}
		b = append(b, c)
	}
	return b
}

// appendUnixMicros appends t (Unix microseconds) in RFC 3339, UTC, whole
// seconds rounded up: the moment something that ends at t has ended.
func appendUnixMicros(b []byte, t int64) []byte {
	return time.Unix(ceilDiv(t, 1_000_000), 0).UTC().AppendFormat(b, time.RFC3339)
}

func ceilDiv(x, y int64) int64 {
	q := x / y
	if x%y != 0 && (x < 0) == (y < 0) {
		q++
	}
	return q
}

// PenaltyAnswer reports whether d, answered with error code code, is an
// answer of the penalty ladder (a 429 PENALTY, or a 403 KEY_BLOCKED the
// ladder imposed, without a deciding rule), whose error details carry
// penalty_level, penalty_reason and expires_at; expires is when it ends,
// Unix seconds rounded up, or 0 when it lasts until it is lifted.
// Surfaces that write their own error object (the check API) carry the
// same details with it.
func PenaltyAnswer(d *guard.Decision, code string) (expires int64, ok bool) {
	if d.DecidingRule() != nil || !hasPenaltyDetails(d, code) {
		return 0, false
	}
	if d.PenaltyUntil > 0 && d.PenaltyUntil < math.MaxInt64 {
		expires = ceilDiv(d.PenaltyUntil, 1_000_000)
	}
	return expires, true
}

// hasPenaltyDetails reports whether d's JSON error body carries the
// penalty ladder's details: a 429 PENALTY or a 403 the ladder imposed.
func hasPenaltyDetails(d *guard.Decision, code string) bool {
	return d.PenaltyLevel > 0 && (code == guard.CodePenalty ||
		(code == guard.CodeKeyBlocked && d.Reason == guard.ReasonBlocklisted))
}

// appendPenaltyDetails appends the penalty ladder's members of an error's
// details: penalty_level, penalty_reason (when known) and expires_at (when
// the penalty ends by itself); after a comma when more follows members
// already written.
func appendPenaltyDetails(b []byte, d *guard.Decision, more bool) []byte {
	if more {
		b = append(b, ',')
	}
	b = append(b, `"penalty_level":`...)
	b = strconv.AppendInt(b, int64(d.PenaltyLevel), 10)
	if d.PenaltyReason != "" {
		b = append(b, `,"penalty_reason":`...)
		b = appendJSONString(b, d.PenaltyReason)
	}
	if d.PenaltyUntil > 0 && d.PenaltyUntil < math.MaxInt64 {
		b = append(b, `,"expires_at":"`...)
		b = appendUnixMicros(b, d.PenaltyUntil)
		b = append(b, '"')
	}
	return b
}

// retryAfter is the Retry-After of d in seconds, as SetHeaders writes it.
func retryAfter(d *guard.Decision) int64 {
	ra := d.RetryAfter
	if dr := d.DecidingRule(); ra <= 0 && dr != nil {
		ra = dr.RetryAfter
	}
	return max(ra, 1)
}

func appendSeconds(b []byte, s int64) []byte {
	b = strconv.AppendInt(b, s, 10)
	if s == 1 {
		return append(b, " second"...)
	}
	return append(b, " seconds"...)
}

// appendErrorHead appends `{"error":{"code":…,"message":…` (unterminated).
func appendErrorHead[M string | []byte](b []byte, code string, msg M) []byte {
	b = append(b, `{"error":{"code":`...)
	b = appendJSONString(b, code)
	b = append(b, `,"message":`...)
	return appendJSONString(b, msg)
}

func appendDecisionJSON(b []byte, d *guard.Decision, status int, code string, msg []byte) []byte {
	b = appendErrorHead(b, code, msg)
	if status == http.StatusTooManyRequests {
		b = append(b, `,"details":{`...)
		if dr := d.DecidingRule(); dr != nil {
			b = append(b, `"rule":`...)
			b = appendJSONString(b, dr.ID)
			b = append(b, `,"limit":`...)
			b = strconv.AppendInt(b, dr.Limit, 10)
			b = append(b, `,"remaining":`...)
			b = strconv.AppendInt(b, max(dr.Remaining, 0), 10)
			b = append(b, `,"window_seconds":`...)
			b = strconv.AppendInt(b, dr.Window, 10)
			b = append(b, `,"retry_after_seconds":`...)
			b = strconv.AppendInt(b, retryAfter(d), 10)
			b = append(b, `,"reset_at":"`...)
			b = time.Unix(max(dr.Reset, 0), 0).UTC().AppendFormat(b, time.RFC3339)
			b = append(b, '"')
		} else {
			b = append(b, `"retry_after_seconds":`...)
			b = strconv.AppendInt(b, retryAfter(d), 10)
			if hasPenaltyDetails(d, code) {
				b = appendPenaltyDetails(b, d, true)
			}
		}
		b = append(b, '}')
	} else if hasPenaltyDetails(d, code) {
		b = append(b, `,"details":{`...)
		b = appendPenaltyDetails(b, d, false)
		b = append(b, '}')
	}
	return append(b, "}}"...)
}

// appendProblemHead appends the members every problem has, unterminated.
func appendProblemHead[M string | []byte](b []byte, typ, title string, status int, code string, detail M) []byte {
	b = append(b, `{"type":`...)
	b = appendJSONString(b, typ)
	b = append(b, `,"title":`...)
	b = appendJSONString(b, title)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, `,"detail":`...)
	b = appendJSONString(b, detail)
	b = append(b, `,"code":`...)
	return appendJSONString(b, code)
}

func appendDecisionProblem(b []byte, d *guard.Decision, status int, code string, msg []byte) []byte {
	typ, title := problemTypeBlank, http.StatusText(status)
	if status == http.StatusTooManyRequests {
		typ, title = ProblemQuotaExceeded, problemTitleQuotaExceeded
		if code == guard.CodePenalty {
			typ, title = ProblemAbnormalUsage, problemTitleAbnormalUsage
		}
	}
	b = appendProblemHead(b, typ, title, status, code, msg)
	if status == http.StatusTooManyRequests {
		b = append(b, `,"violated-policies":[`...)
		n := 0
		for i := range d.Rules {
			rr := &d.Rules[i]
			if rr.Shadow || rr.Allowed {
				continue
			}
			if n > 0 {
				b = append(b, ',')
			}
			n++
			b = appendJSONString(b, rr.ID)
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

// appendJSONString appends s as a JSON string: quotes, backslashes and
// control characters escaped, invalid UTF-8 replaced by U+FFFD, and U+2028
// and U+2029 escaped so that the body is also valid JavaScript. It takes
// []byte too, so messages built in a stack buffer need no string copy.
func appendJSONString[S string | []byte](b []byte, s S) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, `\n`...)
			case '\r':
				b = append(b, `\r`...)
			case '\t':
				b = append(b, `\t`...)
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := decodeRune(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, `\u202`...)
			b = append(b, hex[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// decodeRune is utf8.DecodeRune for a string or a byte slice, without
// converting (and copying) either.
func decodeRune[S string | []byte](s S) (rune, int) {
	var buf [utf8.UTFMax]byte
	n := copy(buf[:], s)
	return utf8.DecodeRune(buf[:n])
}
