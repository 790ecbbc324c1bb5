package httpguard

import (
	"net/http"
	"strconv"

	"github.com/tollgate/tollgate/guard"
)

// field is one of the headers a decision may carry, in the order
// HeaderPairs returns them.
type field uint8

const (
	fLimit field = iota
	fRemaining
	fUsed
	fReset
	fResource
	fPolicy     // RateLimit-Policy
	fRateLimit  // RateLimit
	fXPolicy    // X-RateLimit-Policy: degraded
	fRetryAfter // Retry-After
	numFields
)

// headerNames holds each field's name as the wire spells it (used on the
// wire by HeaderPairs) and in net/http's canonical form (the http.Header map
// key, textproto.CanonicalMIMEHeaderKey of the first).
var headerNames = [numFields]struct{ wire, canon string }{
	fLimit:      {"X-RateLimit-Limit", "X-Ratelimit-Limit"},
	fRemaining:  {"X-RateLimit-Remaining", "X-Ratelimit-Remaining"},
	fUsed:       {"X-RateLimit-Used", "X-Ratelimit-Used"},
	fReset:      {"X-RateLimit-Reset", "X-Ratelimit-Reset"},
	fResource:   {"X-RateLimit-Resource", "X-Ratelimit-Resource"},
	fPolicy:     {"RateLimit-Policy", "Ratelimit-Policy"},
	fRateLimit:  {"RateLimit", "Ratelimit"},
	fXPolicy:    {"X-RateLimit-Policy", "X-Ratelimit-Policy"},
	fRetryAfter: {"Retry-After", "Retry-After"},
}

// headerValues are the rendered headers of one decision; an empty value is
// an absent header. All values are substrings of one string, so rendering
// costs one allocation whatever the number of rules.
type headerValues [numFields]string

// SetHeaders writes the rate-limit headers of d into h, replacing same-named
// headers already there (say from an upstream):
//
//   - With a deciding rule: X-RateLimit-Limit, -Remaining (-1 while the
//     deciding rule fails open), -Used, -Reset, -Resource, RateLimit-Policy
//     and RateLimit (one item per applicable enforced rule; shadow rules
//     never show), and X-RateLimit-Policy: degraded when d.Degraded, in
//     which case RateLimit is deleted rather than set.
//   - Without one (allowlisted, no rule matched, blocked) all of those are
//     deleted, so an upstream cannot leak rate-limit headers of its own
//     under Tollgate's names.
//   - Retry-After is set on every 429 (d.RetryAfter, else the deciding
//     rule's, whole seconds, at least 1). On other statuses it is left
//     as it is: an upstream's Retry-After on its own 503 or 429 belongs to
//     the upstream.
//
// A nil d is a decision without headers. SetHeaders does not keep h or d.
func SetHeaders(h http.Header, d *guard.Decision) {
	hv := renderHeaders(d)
	var backing [numFields]string
	hv.apply(h, &backing)
}

// HeaderPairs appends the headers SetHeaders would set for d to dst, as
// name/value pairs in a fixed order, names spelled as on the wire
// (X-RateLimit-Limit, …, RateLimit-Policy, RateLimit, X-RateLimit-Policy,
// Retry-After), and returns the extended slice. It lists only headers that
// are present; deleting stale headers is the caller's business (Envoy's
// response_headers_to_add overwrites by name).
func HeaderPairs(d *guard.Decision, dst [][2]string) [][2]string {
	hv := renderHeaders(d)
	for f := range numFields {
		if v := hv[f]; v != "" {
			dst = append(dst, [2]string{headerNames[f].wire, v})
		}
	}
	return dst
}

// apply writes hv into h: present values replace same-named headers, absent
// ones are deleted, except Retry-After, which is only ever set. backing
// provides the one-element value slices, so a reapplication (the
// middleware applies before and after the next handler) allocates nothing
// and restores values a handler overwrote in place.
func (hv *headerValues) apply(h http.Header, backing *[numFields]string) {
	for f := range numFields {
		name := headerNames[f].canon
		if v := hv[f]; v != "" {
			backing[f] = v
			h[name] = backing[f : f+1 : f+1]
		} else if f != fRetryAfter {
			delete(h, name)
		}
	}
}

// sfIntegerMax is the largest RFC 9651 Integer (15 digits).
const sfIntegerMax = 999_999_999_999_999

// renderHeaders computes the header values of d.
func renderHeaders(d *guard.Decision) headerValues {
	var hv headerValues
	if d == nil {
		return hv
	}
	var (
		scratch [256]byte
		b       = scratch[:0]
		spans   [numFields][2]int
	)
	mark := func(f field, start int) { spans[f] = [2]int{start, len(b)} }

	if dr := d.DecidingRule(); dr != nil {
		remaining := max(dr.Remaining, 0)
		used := max(dr.Limit-remaining, 0)
		if dr.FailOpen {
			// Failing open: nothing was counted, nothing is known.
			remaining, used = -1, 0
		}
		start := len(b)
		b = strconv.AppendInt(b, dr.Limit, 10)
		mark(fLimit, start)
		start = len(b)
		b = strconv.AppendInt(b, remaining, 10)
		mark(fRemaining, start)
		start = len(b)
		b = strconv.AppendInt(b, used, 10)
		mark(fUsed, start)
		start = len(b)
		b = strconv.AppendInt(b, max(dr.Reset, 0), 10)
		mark(fReset, start)
		start = len(b)
		b = appendHeaderText(b, dr.ID)
		mark(fResource, start)

		start = len(b)
		b = appendRuleList(b, d.Rules, false)
		mark(fPolicy, start)

		if d.Degraded {
			start = len(b)
			b = append(b, "degraded"...)
			mark(fXPolicy, start)
		} else {
			start = len(b)
			b = appendRuleList(b, d.Rules, true)
			mark(fRateLimit, start)
		}
	}
	if decisionStatus(d) == http.StatusTooManyRequests {
		start := len(b)
		b = strconv.AppendInt(b, retryAfter(d), 10)
		mark(fRetryAfter, start)
	}

	if len(b) == 0 {
		return hv
	}
	s := string(b)
	for f, sp := range spans {
		hv[f] = s[sp[0]:sp[1]]
	}
	return hv
}

// appendRuleList appends the rules that enforce (not shadow rules) as an
// RFC 9651 List of sf-strings, their ids, each with its parameters: the
// quota and its window (RateLimit-Policy), or with remaining what
// remains and, when known, the seconds until more does (RateLimit). A
// flag, not a function value, so that b stays on the caller's stack.
func appendRuleList(b []byte, rules []guard.RuleResult, remaining bool) []byte {
	n := 0
	for i := range rules {
		rr := &rules[i]
		if rr.Shadow {
			continue
		}
		if n > 0 {
			b = append(b, ", "...)
		}
		n++
		b = appendSFString(b, rr.ID)
		if !remaining {
			b = appendSFParam(b, 'q', rr.Limit)
			b = appendSFParam(b, 'w', rr.Window)
			continue
		}
		b = appendSFParam(b, 'r', max(rr.Remaining, 0))
		if rr.Next > 0 {
			b = appendSFParam(b, 't', rr.Next)
		}
	}
	return b
}

// appendSFString appends s as an RFC 9651 sf-string. Rule ids are validated
// to [A-Za-z0-9._-], so this only matters for hand-made decisions: `"` and
// `\` are escaped, and bytes an sf-string cannot hold (controls, non-ASCII)
// become '?' so that the field stays valid and no byte can break out of it.
func appendSFString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c > 0x7e:
			b = append(b, '?')
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// appendSFParam appends the parameter ;key=v with v clamped to the range
// of an RFC 9651 Integer.
func appendSFParam(b []byte, key byte, v int64) []byte {
	b = append(b, ';', key, '=')
	return strconv.AppendInt(b, min(max(v, -sfIntegerMax), sfIntegerMax), 10)
}

// appendHeaderText appends s for use as a plain header value: bytes that
// are not visible ASCII or space become '?'.
func appendHeaderText(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e {
			b = append(b, '?')
		} else {
			b = append(b, c)
		}
	}
	return b
}

// decisionStatus is d's HTTP status: d.Status, or when that is unset 200
// for an admission and 429 otherwise.
func decisionStatus(d *guard.Decision) int {
	switch {
	case d == nil:
		return http.StatusOK
	case d.Status != 0:
		return d.Status
	case d.Allowed:
		return http.StatusOK
	}
	return http.StatusTooManyRequests
}
