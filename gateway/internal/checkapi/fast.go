package checkapi

import (
	"cmp"
	"net/http"
	"strconv"
	"time"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/apierror"
	"github.com/tollgate/tollgate/guard/httpguard"
)

// The check API's common case without encoding/json: a body of plain
// fields decoded by hand, and the decision encoded by hand, byte for byte
// as encoding/json would (tests hold both to it). Anything unusual in a
// body (an escape, null, a duplicate or unknown field, a number that is
// not a plain integer) goes to the strict decoder, which has the error
// messages.

// fields of a check body, as bits.
const (
	fAPIKey = 1 << iota
	fEndpoint
	fMethod
	fCost
	fTenant
	fIP
)

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

// fastBody decodes a check body of plain fields into b; ok is false when
// the body needs the strict decoder (it may still be valid).
func fastBody(data []byte, b *checkBody) (ok bool) {
	i := 0
	ws := func() {
		for i < len(data) && isSpace(data[i]) {
			i++
		}
	}
	// str reads a string without escapes or control characters (ascii:
	// nor bytes above 0x7f) and returns its bytes.
	str := func(ascii bool) ([]byte, bool) {
		if i >= len(data) || data[i] != '"' {
			return nil, false
		}
		i++
		start := i
		for i < len(data) {
			c := data[i]
			switch {
			case c == '"':
				s := data[start:i]
				i++
				return s, true
			case c == '\\' || c < 0x20 || (ascii && c >= 0x80):
				return nil, false
			}
			i++
		}
		return nil, false
	}
	ws()
	if i >= len(data) || data[i] != '{' {
		return false
	}
	i++
	ws()
	seen := 0
	if i < len(data) && data[i] == '}' {
		i++
	} else {
		for {
			ws()
			name, ok := str(true)
			if !ok {
				return false
			}
			ws()
			if i >= len(data) || data[i] != ':' {
				return false
			}
			i++
			ws()
			var bit int
			switch string(name) {
			case "api_key":
				bit = fAPIKey
			case "endpoint":
				bit = fEndpoint
			case "method":
				bit = fMethod
			case "cost":
				bit = fCost
			case "tenant":
				bit = fTenant
			case "ip":
				bit = fIP
			default:
				return false
			}
			if seen&bit != 0 {
				return false
			}
			seen |= bit
			if bit == fCost {
				start := i
				if i < len(data) && data[i] == '-' {
					i++
				}
				digits := i
				for i < len(data) && data[i] >= '0' && data[i] <= '9' {
					i++
				}
				if i == digits || (data[digits] == '0' && i-digits > 1) || (i < len(data) && (data[i] == '.' || data[i] == 'e' || data[i] == 'E')) {
					return false
				}
				n, err := strconv.ParseInt(string(data[start:i]), 10, 64)
				if err != nil {
					return false
				}
				b.Cost = &n
			} else {
				v, ok := str(bit == fMethod || bit == fIP)
				if !ok {
					return false
				}
				switch bit {
				case fAPIKey:
					b.APIKey = exactString(v)
				case fEndpoint:
					b.Endpoint = exactString(v)
				case fMethod:
					b.Method = methodString(v)
				case fTenant:
					b.Tenant = exactString(v)
				case fIP:
					b.IP = string(v)
				}
			}
			ws()
			if i >= len(data) {
				return false
			}
			if data[i] == '}' {
				i++
				break
			}
			if data[i] != ',' {
				return false
			}
			i++
		}
	}
	ws()
	return i == len(data)
}

// methodString returns the method, without allocating for the common ones.
func methodString(b []byte) string {
	for _, m := range [...]string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch, http.MethodHead, http.MethodOptions} {
		if string(b) == m {
			return m
		}
	}
	return string(b)
}

func appendField(b []byte, name string) []byte {
	b = append(b, '"')
	b = append(b, name...)
	return append(b, '"', ':')
}

// appendNext appends the name of a field after the first: ,"name":
func appendNext(b []byte, name string) []byte {
	return appendField(append(b, ','), name)
}

// appendIntField appends a field after the first with an integer value.
func appendIntField(b []byte, name string, v int64) []byte {
	return strconv.AppendInt(appendNext(b, name), v, 10)
}

// appendStringField appends a field after the first with a string value,
// escaped for HTML as every JSON answer of the check API is.
func appendStringField(b []byte, name, v string) []byte {
	return apierror.AppendString(appendNext(b, name), v, apierror.EscapeHTML)
}

func appendBool(b []byte, v bool) []byte {
	if v {
		return append(b, "true"...)
	}
	return append(b, "false"...)
}

// appendPenaltyDetails appends the details of an answer of the penalty
// ladder (penaltyDetailsJSON's layout), as the proxy's error body has
// them; expires is Unix seconds, 0 for none.
func appendPenaltyDetails(b []byte, d *guard.Decision, code string, expires int64) []byte {
	b = appendNext(b, "details")
	b = append(b, '{')
	if code == apierror.Penalty {
		b = appendField(b, "retry_after_seconds")
		b = strconv.AppendInt(b, max(d.RetryAfter, 1), 10)
		b = append(b, ',')
	}
	b = appendField(b, "penalty_level")
	b = strconv.AppendInt(b, int64(d.PenaltyLevel), 10)
	if d.PenaltyReason != "" {
		b = appendStringField(b, "penalty_reason", d.PenaltyReason)
	}
	if expires > 0 {
		b = appendNext(b, "expires_at")
		b = append(b, '"')
		b = time.Unix(expires, 0).UTC().AppendFormat(b, time.RFC3339)
		b = append(b, '"')
	}
	return append(b, '}')
}

// appendDecision appends d as JSON (decisionJSON's layout). Without a
// deciding rule (allowlisted, no rule matched, blocked) rule and algorithm
// are empty and limit, remaining and reset 0; while the deciding rule
// fails open remaining is -1, as in X-RateLimit-Remaining.
func appendDecision(b []byte, d *guard.Decision, status int) []byte {
	b = appendDecisionHead(b, d, status)
	if !d.Allowed {
		b = appendDecisionError(b, d, status)
	}
	return append(b, '}')
}

// appendDecisionHead appends d as appendDecision does up to its error
// object, without the closing brace.
func appendDecisionHead(b []byte, d *guard.Decision, status int) []byte {
	var limit, remaining, reset int64
	var rule, alg string
	dr := d.DecidingRule()
	if dr != nil {
		limit, remaining, reset = dr.Limit, max(dr.Remaining, 0), dr.Reset
		if dr.FailOpen {
			remaining = -1
		}
		rule, alg = dr.ID, string(dr.Algorithm)
	}
	b = append(b, '{')
	b = appendField(b, "allowed")
	b = appendBool(b, d.Allowed)
	b = appendIntField(b, "status", int64(status))
	b = appendIntField(b, "limit", limit)
	b = appendIntField(b, "remaining", remaining)
	b = appendIntField(b, "reset", reset)
	b = appendIntField(b, "retry_after", d.RetryAfter)
	b = appendStringField(b, "rule", rule)
	b = appendStringField(b, "algorithm", alg)
	b = appendNext(b, "degraded")
	b = appendBool(b, d.Degraded)
	b = appendStringField(b, "reason", string(d.Reason))
	return b
}

// appendDecisionError appends the error object of a decision that is not
// an admission, with the deciding rule's details on a 429.
func appendDecisionError(b []byte, d *guard.Decision, status int) []byte {
	dr := d.DecidingRule()
	code := cmp.Or(d.Code, apierror.RateLimitExceeded)
	b = appendNext(b, "error")
	b = append(b, '{')
	b = apierror.AppendFields(b, code, httpguard.Message(d), apierror.EscapeHTML)
	if status == http.StatusTooManyRequests && dr != nil {
		b = appendNext(b, "details")
		b = append(b, '{')
		b = appendField(b, "rule")
		b = apierror.AppendString(b, dr.ID, apierror.EscapeHTML)
		b = appendIntField(b, "limit", dr.Limit)
		b = appendNext(b, "remaining")
		b = append(b, '0')
		b = appendIntField(b, "window_seconds", dr.Window)
		b = appendIntField(b, "retry_after_seconds", d.RetryAfter)
		b = appendNext(b, "reset_at")
		b = append(b, '"')
		b = time.Unix(dr.Reset, 0).UTC().AppendFormat(b, time.RFC3339)
		b = append(b, '"', '}')
	} else if expires, ok := httpguard.PenaltyAnswer(d, code); ok {
		b = appendPenaltyDetails(b, d, code, expires)
	}
	b = append(b, '}')
	return b
}
