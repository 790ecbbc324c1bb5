package checkapi

import (
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/tollgate/tollgate/guard"
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

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string exactly as encoding/json writes
// it: HTML characters and U+2028/U+2029 escaped, invalid UTF-8 as U+FFFD.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

func appendField(b []byte, name string) []byte {
	b = append(b, '"')
	b = append(b, name...)
	return append(b, '"', ':')
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
	b = append(b, ',')
	b = appendField(b, "details")
	b = append(b, '{')
	if code == guard.CodePenalty {
		b = appendField(b, "retry_after_seconds")
		b = strconv.AppendInt(b, max(d.RetryAfter, 1), 10)
		b = append(b, ',')
	}
	b = appendField(b, "penalty_level")
	b = strconv.AppendInt(b, int64(d.PenaltyLevel), 10)
	if d.PenaltyReason != "" {
		b = append(b, ',')
		b = appendField(b, "penalty_reason")
		b = appendString(b, d.PenaltyReason)
	}
	if expires > 0 {
		b = append(b, ',')
		b = appendField(b, "expires_at")
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
	b = append(b, ',')
	b = appendField(b, "status")
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, ',')
	b = appendField(b, "limit")
	b = strconv.AppendInt(b, limit, 10)
	b = append(b, ',')
	b = appendField(b, "remaining")
	b = strconv.AppendInt(b, remaining, 10)
	b = append(b, ',')
	b = appendField(b, "reset")
	b = strconv.AppendInt(b, reset, 10)
	b = append(b, ',')
	b = appendField(b, "retry_after")
	b = strconv.AppendInt(b, d.RetryAfter, 10)
	b = append(b, ',')
	b = appendField(b, "rule")
	b = appendString(b, rule)
	b = append(b, ',')
	b = appendField(b, "algorithm")
	b = appendString(b, alg)
	b = append(b, ',')
	b = appendField(b, "degraded")
	b = appendBool(b, d.Degraded)
	b = append(b, ',')
	b = appendField(b, "reason")
	b = appendString(b, string(d.Reason))
	if !d.Allowed {
		code := d.Code
		if code == "" {
			code = guard.CodeRateLimitExceeded
		}
		b = append(b, ',')
		b = appendField(b, "error")
		b = append(b, '{')
		b = appendField(b, "code")
		b = appendString(b, code)
		b = append(b, ',')
		b = appendField(b, "message")
		b = appendString(b, httpguard.Message(d))
		if status == http.StatusTooManyRequests && dr != nil {
			b = append(b, ',')
			b = appendField(b, "details")
			b = append(b, '{')
			b = appendField(b, "rule")
			b = appendString(b, dr.ID)
			b = append(b, ',')
			b = appendField(b, "limit")
			b = strconv.AppendInt(b, dr.Limit, 10)
			b = append(b, ',')
			b = appendField(b, "remaining")
			b = append(b, '0')
			b = append(b, ',')
			b = appendField(b, "window_seconds")
			b = strconv.AppendInt(b, dr.Window, 10)
			b = append(b, ',')
			b = appendField(b, "retry_after_seconds")
			b = strconv.AppendInt(b, d.RetryAfter, 10)
			b = append(b, ',')
			b = appendField(b, "reset_at")
			b = append(b, '"')
			b = time.Unix(dr.Reset, 0).UTC().AppendFormat(b, time.RFC3339)
			b = append(b, '"', '}')
		} else if expires, ok := httpguard.PenaltyAnswer(d, code); ok {
			b = appendPenaltyDetails(b, d, code, expires)
		}
		b = append(b, '}')
	}
	return append(b, '}')
}
