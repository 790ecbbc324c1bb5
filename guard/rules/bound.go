package rules

import (
	"fmt"
	"slices"
	"strings"
)

// Bounded work per request: every rule a request matches is a counter in
// its Redis call, a header item and a share of its decision's CPU, so the
// gateway bounds how many rules one request may match
// (max_rules_per_request). Where a ruleset makes every request of a kind
// match more than that, the ruleset is refused at load; what cannot be
// known at load is answered at run time (guard: 500 TOO_MANY_RULES).

// unconditional reports whether the matcher has no selector at all: an
// empty `match`, which matches every request (with a client IP where the
// rule's scope needs one).
func (m *matcher) unconditional() bool {
	return m.apiKey == nil && m.tier == "" && m.tenant == "" && m.endpoint == nil && m.methods == nil &&
		m.domain == "" && m.descriptor == nil && m.anon == anonAny && !m.keyed
}

// requestClass is a kind of request that certain rules match every request
// of: anonymous or keyed, with a tier (keyed only), an Envoy domain ("" for
// HTTP) and a method ("" for one no rule lists). Its requests have a client
// IP.
type requestClass struct {
	anon                 bool
	tier, domain, method string
}

func (c requestClass) String() string {
	var b strings.Builder
	if c.anon {
		b.WriteString("every anonymous request")
	} else {
		b.WriteString("every request with a key")
		if c.tier != "" {
			fmt.Fprintf(&b, " of tier %q", c.tier)
		}
	}
	if c.method != "" {
		fmt.Fprintf(&b, " with method %s", c.method)
	}
	if c.domain != "" {
		fmt.Fprintf(&b, " in Envoy domain %q", c.domain)
	}
	return b.String()
}

// matchesEvery reports whether the matcher matches every request of class
// c: its only selectors are anonymous, tier, domain and methods, each
// satisfied by c. Selectors on the key, tenant, endpoint or descriptor make
// it uncertain (false).
func (m *matcher) matchesEvery(c requestClass) bool {
	switch {
	case m.apiKey != nil, m.tenant != "", m.endpoint != nil, m.descriptor != nil:
		return false
	case c.anon && (m.anon == keyedOnly || m.keyed):
		return false
	case !c.anon && m.anon == anonOnly:
		return false
	case m.tier != "" && m.tier != c.tier:
		return false
	case m.domain != "" && m.domain != c.domain:
		return false
	case m.methods != nil && !slices.Contains(m.methods, c.method):
		return false
	}
	return true
}

// maxClasses bounds the request classes MatchBound considers; beyond it
// methods, then domains, are left out (the bound stays a lower bound).
const maxClasses = 4096

// MatchBound returns a lower bound of the most rules one request of this
// ruleset can match: the most rules that every request of some kind is
// certain to match (an empty `match` matches every request; `tier: free`
// every request with a key of tier free; `domain`, `methods` and
// `anonymous` narrow the kind), leaving out rules another rule may replace.
// It also describes that kind of request and returns those rules in
// ruleset order (nil when n is 0). Requests may match more rules than the
// bound (selectors on endpoints, keys and tenants are not counted), so the
// guard also checks at run time.
func (rs *Ruleset) MatchBound() (n int, kind string, matched []*Rule) {
	var cand []*Rule
	var tiers, domains, methods []string
	for _, r := range rs.rules {
		m := &r.match
		if len(rs.displacedBy[r.Index]) > 0 || m.apiKey != nil || m.tenant != "" || m.endpoint != nil || m.descriptor != nil {
			continue
		}
		cand = append(cand, r)
		if m.tier != "" && !slices.Contains(tiers, m.tier) {
			tiers = append(tiers, m.tier)
		}
		if m.domain != "" && !slices.Contains(domains, m.domain) {
			domains = append(domains, m.domain)
		}
		for _, meth := range m.methods {
			if !slices.Contains(methods, meth) {
				methods = append(methods, meth)
			}
		}
	}
	if len(cand) == 0 {
		return 0, "", nil
	}
	count := func() int { return (2 + len(tiers)) * (1 + len(domains)) * (1 + len(methods)) }
	if count() > maxClasses {
		methods = nil
	}
	if count() > maxClasses {
		domains = nil
	}
	if count() > maxClasses {
		tiers = nil
	}
	var best requestClass
	try := func(c requestClass) {
		k := 0
		for _, r := range cand {
			if r.match.matchesEvery(c) {
				k++
			}
		}
		if k > n {
			n, best = k, c
		}
	}
	for _, domain := range append([]string{""}, domains...) {
		for _, method := range append([]string{""}, methods...) {
			try(requestClass{anon: true, domain: domain, method: method})
			for _, tier := range append([]string{""}, tiers...) {
				try(requestClass{tier: tier, domain: domain, method: method})
			}
		}
	}
	if n == 0 {
		return 0, "", nil
	}
	for _, r := range cand {
		if r.match.matchesEvery(best) {
			matched = append(matched, r)
		}
	}
	return n, best.String(), matched
}

// CheckMatchLimit returns a *ValidationError when some kind of request is
// certain to match more than max rules (see MatchBound), naming the first
// rule beyond max; nil when max ≤ 0 or no such kind is known. The gateway
// refuses such a ruleset (max_rules_per_request) rather than answer every
// such request with 500 TOO_MANY_RULES.
func (rs *Ruleset) CheckMatchLimit(max int) error {
	if max <= 0 {
		return nil
	}
	n, kind, matched := rs.MatchBound()
	if n <= max {
		return nil
	}
	return &ValidationError{
		Rule:  matched[max].ID,
		Field: "match",
		Msg: fmt.Sprintf("%s matches at least %d rules, more than the %d one request may match (max_rules_per_request); merge rules or narrow their match",
			kind, n, max),
	}
}
