package rules

import (
	"regexp"
	"strings"
)

// matcher is a rule's compiled `match`. The zero matcher matches every
// request.
type matcher struct {
	apiKey     *glob          // nil: any key
	tier       string         // "": any
	tenant     string         // "": any
	endpoint   *regexp.Regexp // nil: any
	methods    []string       // upper case; nil: any
	domain     string         // "": HTTP and every domain
	descriptor []descPair     // sorted by key
	anon       anonMode
	keyed      bool // an api_key, tier or tenant selector: never matches anonymous requests

	// The rule's scope, as far as matching cares: a request without a
	// client IP (a check API body or Envoy descriptor without one, a Unix
	// socket peer) matches no rule counted per IP, so that such requests
	// never share one counter. Those are
	// ip-scope rules (ipScope), and for anonymous requests key- and
	// tenant-scope rules (personal), which count them per IP.
	ipScope, personal bool
}

type descPair struct{ key, value string }

type anonMode int8

const (
	anonAny   anonMode = iota
	anonOnly           // anonymous: true
	keyedOnly          // anonymous: false
)

// matches reports whether every selector matches req. Cheap comparisons come
// first, the regular expression last. It does not allocate.
func (m *matcher) matches(req *Request) bool {
	anonymous := req.Key == ""
	switch {
	case m.anon == anonOnly && !anonymous,
		m.anon == keyedOnly && anonymous,
		m.keyed && anonymous,
		m.domain != "" && req.Domain != m.domain,
		m.tier != "" && req.Tier != m.tier,
		m.tenant != "" && req.Tenant != m.tenant,
		!req.IP.IsValid() && (m.ipScope || anonymous && m.personal):
		return false
	}
	if m.methods != nil {
		found := false
		for _, meth := range m.methods {
			if strings.EqualFold(req.Method, meth) {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	for _, p := range m.descriptor {
		if v, ok := req.Descriptor[p.key]; !ok || v != p.value {
			return false
		}
	}
	if m.apiKey != nil && !m.apiKey.match(req.Key) {
		return false
	}
	return m.endpoint == nil || m.endpoint.MatchString(req.Endpoint)
}

// Identify returns the tenant and tier of a raw key: its registry entry
// (registered true), else the tier of the first `tiers` pattern it matches
// with an empty tenant, else the zero KeyInfo. An anonymous request (key "")
// has neither. It does not allocate.
func (rs *Ruleset) Identify(key string) (info KeyInfo, registered bool) {
	if key == "" {
		return KeyInfo{}, false
	}
	if info, ok := rs.registry[key]; ok {
		return info, true
	}
	for i := range rs.tiers {
		if rs.tiers[i].glob.match(key) {
			return KeyInfo{Tier: rs.tiers[i].tier}, false
		}
	}
	return KeyInfo{}, false
}

// Listed looks a raw key up in the blocklist and the allowlist; the
// blocklist wins. An anonymous request (key "") is Unlisted. It does not
// allocate.
func (rs *Ruleset) Listed(key string) ListStatus {
	switch {
	case key == "":
		return Unlisted
	case rs.blocklist.match(key):
		return Blocklisted
	case rs.allowlist.match(key):
		return Allowlisted
	}
	return Unlisted
}

// Normalize returns the endpoint of a normal request path (see CleanPath,
// which the guard applies first): the path without a query string and
// without a trailing slash ("/v1/search/" is "/v1/search"), or the
// first route template that matches it segment by segment ("/v1/users/42"
// -> "/v1/users/{id}"). The result is the template or a substring of path:
// it does not allocate.
func (rs *Ruleset) Normalize(path string) string {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	path = TrimTrailingSlash(path)
	if len(rs.routes) == 0 || path == "" || path[0] != '/' {
		return path
	}
	slashes := strings.Count(path, "/")
	for i := range rs.routes {
		r := &rs.routes[i]
		if r.slashes == slashes && r.match(path) {
			return r.template
		}
	}
	return path
}

// bitsetRules is how many rules Match tracks in a stack bitset while
// resolving `replaces`; displacers beyond it are re-evaluated instead.
const bitsetRules = 1024

// Match appends to dst every rule whose selectors all match req, in file
// order, leaving out each rule that another matching rule lists in its
// `replaces` (only direct listing counts: replaces is not transitive). The
// rules are shared and must not be modified. Match does not allocate when
// dst has room for the result, and never modifies dst[:len(dst)].
func (rs *Ruleset) Match(req *Request, dst []*Rule) []*Rule {
	start := len(dst)
	var matched [bitsetRules / 64]uint64
	for _, r := range rs.rules {
		if r.match.matches(req) {
			dst = append(dst, r)
			if r.Index < bitsetRules {
				matched[r.Index/64] |= 1 << (r.Index % 64)
			}
		}
	}
	if !rs.replacing || len(dst)-start < 2 {
		return dst
	}
	out := start
	for k := start; k < len(dst); k++ {
		r := dst[k]
		displaced := false
		for _, j := range rs.displacedBy[r.Index] {
			if j < bitsetRules {
				displaced = matched[j/64]&(1<<(j%64)) != 0
			} else {
				displaced = rs.rules[j].match.matches(req)
			}
			if displaced {
				break
			}
		}
		if !displaced {
			dst[out] = r
			out++
		}
	}
	clear(dst[out:])
	return dst[:out]
}
