package rules

import (
	"fmt"
	"regexp/syntax"
	"strings"
)

// Rulesets that refuse every request.
//
// `limit: 0` is refused because it would refuse every request a rule
// matches; the same mistake written another way is refused too, unless the
// ruleset says `allow_total_block: true` (then it is accepted, and
// [Ruleset.Warnings] names each total block). A ruleset refuses every request
// when:
//
//   - a blocklist pattern matches every API key (a pattern of stars only,
//     such as "*"): every request with a key is answered 403; or
//   - an enforced rule with `block: true` surely matches every request, or
//     every request with a key: its match sets no tier, tenant, methods,
//     domain or descriptor, does not say `anonymous: true`, its api_key
//     glob (if any) matches every key, its endpoint regex (if any) surely
//     matches every path (see below), no other rule `replaces` it, and the
//     ruleset's allowlist is empty (allowlisted keys bypass block rules, so
//     "block everything but our own keys" is a legitimate maintenance mode).
//
// "Surely matches every path" is decided on the regex's syntax, never on
// samples, so that only what certainly matches everything is refused: the
// regex must match, searched as the gateway searches it, every normalised
// endpoint — '/' followed by any printable ASCII, the form every path takes
// after normalisation. It does when it can match at the start of every such
// path (".*", "^", "^/", "/", "^/.*$", "(?i)^/" …) or at its end ("$", "\z").
// A regex that matches all paths only through a subtler argument is accepted
// (the analysis is sound, not complete).

// errTotalBlockHint ends every total-block message.
const errTotalBlockHint = "narrow it, or set allow_total_block: true at the top of the ruleset if this is really wanted"

// totalBlocks finds the ruleset's total blocks: problems, or warnings with
// allow_total_block. Called once everything else validated.
func (c *compiler) totalBlocks() {
	report := func(rule, field string, line int, format string, args ...any) {
		msg := fmt.Sprintf(format, args...) + ": " + errTotalBlockHint
		if c.doc.AllowTotalBlock {
			c.rs.warnings = append(c.rs.warnings, ValidationError{Rule: rule, Field: field, Line: line, Msg: msg})
			return
		}
		c.errorf(rule, field, line, "%s", msg)
	}
	for i, p := range c.doc.Blocklist {
		if globMatchesEveryKey(p) {
			field := fmt.Sprintf("blocklist[%d]", i)
			report("", field, c.doc.lines[field], "blocklist pattern %q matches every API key: it would refuse every request with a key (403)", p)
		}
	}
	if len(c.doc.Allowlist) > 0 {
		return
	}
	for _, r := range c.rs.rules {
		if !r.Block || r.Shadow || len(c.rs.displacedBy[r.Index]) > 0 {
			continue
		}
		spec := &c.doc.Rules[r.Index]
		field, what, ok := totalMatch(&r.match, &spec.Match)
		if !ok {
			continue
		}
		line := fieldLine(spec.lines, field, fieldLine(spec.lines, "block", spec.line))
		report(ruleName(r.Index, r.ID), field, line, "block: true with %s would refuse every request with 403", what)
	}
}

// totalMatch reports whether a block rule's match selects every request (or
// every request with a key), the field that makes it so and a description.
func totalMatch(m *matcher, spec *MatchSpec) (field, what string, ok bool) {
	if m.tier != "" || m.tenant != "" || m.methods != nil || m.domain != "" || m.descriptor != nil || m.anon == anonOnly {
		return "", "", false
	}
	if m.apiKey != nil && !globMatchesEveryKey(spec.APIKey) {
		return "", "", false
	}
	if m.endpoint != nil && !RegexpMatchesEveryPath(spec.Endpoint) {
		return "", "", false
	}
	switch {
	case m.endpoint != nil:
		return "match.endpoint", fmt.Sprintf("endpoint %q, which matches every path,", spec.Endpoint), true
	case m.apiKey != nil:
		return "match.api_key", fmt.Sprintf("api_key %q, which matches every key,", spec.APIKey), true
	case m.anon == keyedOnly:
		return "match.anonymous", "only anonymous: false (every request with a key)", true
	}
	return "match", "no selector (an empty match)", true
}

// globMatchesEveryKey reports whether a key glob matches every API key:
// it is made of stars only.
func globMatchesEveryKey(p string) bool { return p != "" && strings.Trim(p, "*") == "" }

// RegexpMatchesEveryPath reports whether the endpoint regular expression
// expr, searched in an endpoint as rule matching does, surely matches every
// normalised path ('/' followed by any printable ASCII; see the package's
// notes on total blocks). It is sound: true only when every such path
// matches; a regex that does not compile is false.
func RegexpMatchesEveryPath(expr string) bool {
	re, err := syntax.Parse(expr, syntax.Perl)
	if err != nil {
		return false
	}
	re = re.Simplify()
	return reach(re, atStart) != 0 || reach(re, atEnd)&atEnd != 0
}

// pathStates is a set of positions in a path p = "/" + w, for every w of
// printable ASCII at once: a state is in a set only when, for every p, some
// way of matching reaches it.
type pathStates uint8

const (
	atStart    pathStates = 1 << iota // position 0, before the '/'
	afterSlash                        // position 1, w (maybe empty) unknown
	atEnd                             // position len(p): everything consumed
)

// reach returns the states re can end in when started from the states in
// from. What cannot be decided for every path (an assertion or a character
// after the '/') reaches nothing: the answer errs towards "not every path".
func reach(re *syntax.Regexp, from pathStates) pathStates {
	if from == 0 {
		return 0
	}
	switch re.Op {
	case syntax.OpNoMatch:
		return 0
	case syntax.OpEmptyMatch:
		return from
	case syntax.OpLiteral:
		s := from
		for _, r := range re.Rune {
			s = consume(s, r == '/')
		}
		return s
	case syntax.OpCharClass:
		return consume(from, classHas(re.Rune, '/'))
	case syntax.OpAnyChar, syntax.OpAnyCharNotNL:
		return consume(from, true)
	case syntax.OpBeginLine, syntax.OpBeginText:
		// True at position 0; false after the '/' and at the end of a
		// non-empty path (paths hold no raw newline).
		return from & atStart
	case syntax.OpEndLine, syntax.OpEndText:
		return from & atEnd
	case syntax.OpNoWordBoundary:
		// Between nothing and '/': no word character on either side.
		return from & atStart
	case syntax.OpWordBoundary:
		return 0
	case syntax.OpCapture:
		return reach(re.Sub[0], from)
	case syntax.OpConcat:
		s := from
		for _, sub := range re.Sub {
			s = reach(sub, s)
		}
		return s
	case syntax.OpAlternate:
		var s pathStates
		for _, sub := range re.Sub {
			s |= reach(sub, from)
		}
		return s
	case syntax.OpQuest:
		return from | reach(re.Sub[0], from)
	case syntax.OpStar:
		return star(re.Sub[0], from)
	case syntax.OpPlus:
		return star(re.Sub[0], plusOnce(re.Sub[0], from))
	case syntax.OpRepeat:
		// Simplify rewrites counted repetitions; this is for completeness
		// (counts are at most 1000).
		s := from
		for range re.Min {
			s = reach(re.Sub[0], s)
		}
		if re.Max == -1 {
			return star(re.Sub[0], s)
		}
		for range re.Max - re.Min {
			s |= reach(re.Sub[0], s)
		}
		return s
	}
	return 0
}

// consume moves the states over one character that is the leading '/'
// (slash true) or not known to be.
func consume(from pathStates, slash bool) pathStates {
	if slash && from&atStart != 0 {
		return afterSlash
	}
	return 0
}

// star is sub* from the states in from: zero or more rounds, and, when sub
// matches any one character, the whole rest of the path.
func star(sub *syntax.Regexp, from pathStates) pathStates {
	s := from
	if anyChar(sub) && from&(atStart|afterSlash) != 0 {
		s |= afterSlash | atEnd
	}
	for {
		n := s | reach(sub, s)
		if n == s {
			return s
		}
		s = n
	}
}

// plusOnce is the first round of sub+: from the start, a sub that matches
// any character can take the '/' alone or the whole path; otherwise one
// ordinary round.
func plusOnce(sub *syntax.Regexp, from pathStates) pathStates {
	s := reach(sub, from)
	if anyChar(sub) && from&atStart != 0 {
		s |= afterSlash | atEnd
	}
	return s
}

// anyChar reports whether re is one character from a class holding every
// printable ASCII character (., \S, [\s\S], [^\n] …).
func anyChar(re *syntax.Regexp) bool {
	switch re.Op {
	case syntax.OpAnyChar, syntax.OpAnyCharNotNL:
		return true
	case syntax.OpCharClass:
		for c := rune(0x21); c <= 0x7e; c++ {
			if !classHas(re.Rune, c) {
				return false
			}
		}
		return true
	case syntax.OpCapture:
		return anyChar(re.Sub[0])
	}
	return false
}

// classHas reports whether a character class (pairs of inclusive ranges)
// holds r.
func classHas(ranges []rune, r rune) bool {
	for i := 0; i+1 < len(ranges); i += 2 {
		if ranges[i] <= r && r <= ranges[i+1] {
			return true
		}
	}
	return false
}
