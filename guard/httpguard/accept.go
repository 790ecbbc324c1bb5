package httpguard

import (
	"strings"

	"github.com/tollgate/tollgate/internal/httptoken"
)

// Media types of error bodies.
const (
	contentTypeJSON    = "application/json"
	contentTypeProblem = "application/problem+json"
)

// Specificity of the media range that matched a media type (RFC 9110
// §12.5.1: the most specific range that matches decides the weight).
const (
	matchNone = iota
	matchAny  // */*
	matchType // application/*
	matchFull // application/json
)

// wantsProblem reports whether the Accept header lines ask for
// application/problem+json rather than application/json. It does when
//
//   - application/problem+json is named explicitly (not merely matched by
//     a wildcard such as */* or application/*) with a q-value above 0, and
//   - application/json, weighed by its own most specific matching range,
//     has no higher q-value.
//
// A tie goes to problem+json: a client that names it understands it. Ranges
// that do not parse (a bad q-value, a missing subtype) are ignored, as are
// media type parameters other than q. Without an Accept header, or with
// */* only, the answer is plain JSON, the documented default.
func wantsProblem(accept []string) bool {
	var (
		pSpec, jSpec int // specificity of the best match so far
		pQ, jQ       int // its q-value in thousandths
	)
	for _, line := range accept {
		for line != "" {
			var elem string
			elem, line, _ = cutUnquoted(line, ',')
			typ, sub, q, ok := parseMediaRange(elem)
			if !ok {
				continue
			}
			pSpec, pQ = weigh(typ, sub, q, "problem+json", pSpec, pQ)
			jSpec, jQ = weigh(typ, sub, q, "json", jSpec, jQ)
		}
	}
	return pSpec == matchFull && pQ > 0 && pQ >= jQ
}

// weigh matches the range typ/sub against application/subtype and returns
// the specificity and q-value of the best match: a more specific range
// replaces a less specific one; among equally specific ranges the highest q
// counts.
func weigh(typ, sub string, q int, subtype string, spec, best int) (int, int) {
	s := matchNone
	switch {
	case typ == "*" && sub == "*":
		s = matchAny
	case !strings.EqualFold(typ, "application"):
	case sub == "*":
		s = matchType
	case strings.EqualFold(sub, subtype):
		s = matchFull
	}
	switch {
	case s == matchNone || s < spec:
		return spec, best
	case s > spec:
		return s, q
	}
	return spec, max(best, q)
}

// parseMediaRange parses one Accept element, `type/subtype *(OWS ";" OWS
// parameter)`, and returns its q-value in thousandths (1000 when absent).
// ok is false for an empty or malformed element.
func parseMediaRange(elem string) (typ, sub string, q int, ok bool) {
	mt, params, _ := strings.Cut(elem, ";")
	typ, sub, found := strings.Cut(trimOWS(mt), "/")
	if !found || !httptoken.Is(typ) || !httptoken.Is(sub) || (typ == "*" && sub != "*") {
		return "", "", 0, false
	}
	q = 1000
	for params != "" {
		var p string
		p, params, _ = cutUnquoted(params, ';')
		p = trimOWS(p)
		if p == "" {
			continue
		}
		name, value, _ := strings.Cut(p, "=")
		if !strings.EqualFold(trimOWS(name), "q") {
			continue
		}
		// q ends the media type's parameters; what follows are
		// accept-extensions, which nobody uses.
		if q, ok = parseQValue(trimOWS(value)); !ok {
			return "", "", 0, false
		}
		break
	}
	return typ, sub, q, true
}

// parseQValue parses an RFC 9110 qvalue ("0", "0.5", "1.000", at most three
// decimals, at most 1) into thousandths.
func parseQValue(s string) (int, bool) {
	if s == "" || (s[0] != '0' && s[0] != '1') {
		return 0, false
	}
	q := int(s[0]-'0') * 1000
	if len(s) == 1 {
		return q, true
	}
	if s[1] != '.' || len(s) > 5 {
		return 0, false
	}
	scale := 100
	for i := 2; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		q += int(c-'0') * scale
		scale /= 10
	}
	if q > 1000 {
		return 0, false
	}
	return q, true
}

// cutUnquoted splits s around the first sep that is not inside a
// quoted-string (with its backslash escapes).
func cutUnquoted(s string, sep byte) (before, after string, found bool) {
	quoted, escaped := false, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case escaped:
			escaped = false
		case quoted && c == '\\':
			escaped = true
		case c == '"':
			quoted = !quoted
		case !quoted && c == sep:
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// trimOWS trims spaces and horizontal tabs.
func trimOWS(s string) string {
	return strings.Trim(s, " \t")
}
