package rules

import (
	"cmp"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/big"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/tollgate/tollgate/internal/httptoken"
)

// Load parses and compiles a rules document (YAML or JSON): [Parse], then
// [Compile].
func Load(data []byte) (*Ruleset, error) {
	doc, err := Parse(data)
	if err != nil {
		return nil, err
	}
	return Compile(doc)
}

// Compile validates doc and compiles it into an immutable [Ruleset]. The
// ruleset is refused as a whole when anything is wrong: the error joins one
// [*ValidationError] per problem (at most 50), each naming the rule (its
// id, or rules[i] when it has none) and the field. doc is not retained.
//
// The ruleset's Hash is the hex SHA-256 of the bytes doc was parsed from,
// or, for a Document built in code, of its JSON encoding.
func Compile(doc *Document) (*Ruleset, error) {
	if doc == nil {
		return nil, &ValidationError{Msg: "nil document"}
	}
	c := &compiler{doc: doc, rs: &Ruleset{version: doc.Version, hash: doc.hash}}
	if c.rs.hash == "" {
		c.rs.hash = documentHash(doc)
	}
	if doc.Version < 0 {
		c.errorf("", "version", doc.lines["version"], "must not be negative")
	}
	c.registry()
	c.tiers()
	c.rs.allowlist = c.globList("allowlist", doc.Allowlist)
	c.rs.blocklist = c.globList("blocklist", doc.Blocklist)
	c.routes()
	c.regionList()
	c.rules()
	if len(c.errs) == 0 {
		c.totalBlocks()
	}
	if len(c.errs) > 0 {
		return nil, errors.Join(c.errs...)
	}
	for _, r := range c.rs.rules {
		c.rs.descriptors = c.rs.descriptors || r.match.descriptor != nil
		c.rs.byIP = c.rs.byIP || r.match.ipScope
	}
	return c.rs, nil
}

func documentHash(doc *Document) string {
	b, err := json.Marshal(doc)
	if err != nil { // cannot happen: the Document holds only strings, ints, bools, slices and maps
		b = fmt.Appendf(nil, "%#v", doc)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

type compiler struct {
	doc  *Document
	rs   *Ruleset
	errs []error
}

func (c *compiler) errorf(rule, field string, line int, format string, args ...any) {
	if len(c.errs) < maxErrors {
		c.errs = append(c.errs, &ValidationError{Rule: rule, Field: field, Line: line, Msg: fmt.Sprintf(format, args...)})
	}
}

// checkName validates a tenant, tier, domain or descriptor name: these end
// up in headers, metrics labels and Redis hash tags.
func checkName(s string) error {
	switch {
	case s == "":
		return errors.New("must not be empty")
	case len(s) > 128:
		return errors.New("longer than 128 bytes")
	case !utf8.ValidString(s):
		return errors.New("not valid UTF-8")
	case strings.ContainsFunc(s, isControl):
		return errors.New("contains control characters")
	}
	return nil
}

// CheckName validates a tenant, tier, domain or descriptor name as a
// ruleset's are validated (1 to 128 bytes of UTF-8 without control
// characters), so that other inputs naming a tenant refuse what no ruleset
// could name.
func CheckName(s string) error { return checkName(s) }

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

// checkKey validates a raw API key as written in the registry or overrides:
// a key the gateway would refuse (over 256 bytes, control
// characters) could never match.
func checkKey(k string) error {
	switch {
	case k == "":
		return errors.New("empty key")
	case len(k) > 256:
		return errors.New("key longer than 256 bytes can never be presented")
	case strings.ContainsFunc(k, isControl):
		return errors.New("key with control characters can never be presented")
	}
	return nil
}

func (c *compiler) registry() {
	if len(c.doc.Keys) == 0 {
		return
	}
	c.rs.registry = make(map[string]KeyInfo, len(c.doc.Keys))
	for _, k := range slices.Sorted(maps.Keys(c.doc.Keys)) {
		e := c.doc.Keys[k]
		field := "keys[" + redactKey(k) + "]"
		line := e.line
		if err := checkKey(k); err != nil {
			c.errorf("", field, line, "%v", err)
			continue
		}
		if strings.HasPrefix(k, "kid:") {
			c.errorf("", field, line, "the registry takes raw keys, not kid: ids")
			continue
		}
		if e.Tenant != "" {
			if err := checkName(e.Tenant); err != nil {
				c.errorf("", field+".tenant", line, "%v", err)
			}
		}
		if e.Tier != "" {
			if err := checkName(e.Tier); err != nil {
				c.errorf("", field+".tier", line, "%v", err)
			}
		}
		c.rs.registry[k] = KeyInfo{Tenant: e.Tenant, Tier: e.Tier}
	}
}

func (c *compiler) tiers() {
	for i, t := range c.doc.Tiers {
		field := fmt.Sprintf("tiers[%d]", i)
		g, err := compileGlob(t.Pattern)
		if err != nil {
			c.errorf("", field+".pattern", t.line, "%v", err)
		}
		if err := checkName(t.Tier); err != nil {
			c.errorf("", field+".tier", t.line, "%v", err)
		}
		c.rs.tiers = append(c.rs.tiers, tierPattern{glob: g, tier: t.Tier})
	}
}

func (c *compiler) globList(name string, patterns []string) globList {
	var l globList
	for i, p := range patterns {
		field := fmt.Sprintf("%s[%d]", name, i)
		g, err := compileGlob(p)
		if err != nil {
			c.errorf("", field, c.doc.lines[field], "%v", err)
			continue
		}
		l.add(g)
	}
	return l
}

func (c *compiler) routes() {
	for i, t := range c.doc.Routes {
		field := fmt.Sprintf("routes[%d]", i)
		r, err := compileRoute(t)
		if err != nil {
			c.errorf("", field, c.doc.lines[field], "%v", err)
			continue
		}
		c.rs.routes = append(c.rs.routes, r)
	}
}

// validID reports whether id matches ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$:
// ids appear in headers as structured-field strings and in Redis names.
func validID(id string) bool {
	return id != "" && isAlnum(id[0]) &&
		validToken(id, 64, func(b byte) bool { return isAlnum(b) || b == '.' || b == '_' || b == '-' })
}

// validToken reports whether s has 1 to maxLen bytes, each of them ASCII
// that ok accepts.
func validToken(s string, maxLen int, ok func(byte) bool) bool {
	return s != "" && len(s) <= maxLen &&
		!strings.ContainsFunc(s, func(r rune) bool { return r >= utf8.RuneSelf || !ok(byte(r)) })
}

func isAlnum(b byte) bool {
	return b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9'
}

// fieldLine returns the line of field in a rule (or override), falling
// back to the line of the rule itself.
func fieldLine(lines lineMap, field string, fallback int) int {
	if l := lines[field]; l > 0 {
		return l
	}
	return fallback
}

func (c *compiler) rules() {
	specs := c.doc.Rules
	c.rs.rules = make([]*Rule, 0, len(specs))
	c.rs.byID = make(map[string]*Rule, len(specs))
	firstAt := make(map[string]int, len(specs))
	for i := range specs {
		s := &specs[i]
		name := ruleName(i, s.ID)
		r := c.rule(i, name, s)
		switch {
		case s.ID == "":
			c.errorf(name, "id", s.line, "id is required")
		case !validID(s.ID):
			c.errorf(name, "id", fieldLine(s.lines, "id", s.line),
				"invalid id: want 1 to 64 characters from [A-Za-z0-9._-], starting with a letter or digit")
		default:
			if j, dup := firstAt[s.ID]; dup {
				c.errorf(name, "id", fieldLine(s.lines, "id", s.line),
					"duplicate id (also rules[%d] at line %d)", j, specs[j].line)
			} else {
				firstAt[s.ID] = i
				c.rs.byID[s.ID] = r
			}
		}
		c.rs.rules = append(c.rs.rules, r)
	}
	c.replaces()
	if len(c.errs) == 0 {
		assignTags(c.rs.rules)
	}
}

func (c *compiler) rule(i int, name string, s *RuleSpec) *Rule {
	r := &Rule{
		ID:         s.ID,
		Algorithm:  Algorithm(s.Algorithm),
		Scope:      Scope(s.Scope),
		Strict:     s.Strict,
		Shadow:     s.Shadow,
		Block:      s.Block,
		ByEndpoint: s.ByEndpoint,
		OnFailure:  FailureMode(s.OnFailure),
		Index:      i,
		Params:     Params{Precision: 1, FullDen: 1},
	}
	line := func(f string) int { return fieldLine(s.lines, f, s.line) }

	algOK := true
	switch r.Algorithm {
	case "":
		r.Algorithm = TokenBucket
	case TokenBucket, SlidingWindowLog, SlidingWindowCounter, FixedWindow, GCRA:
	default:
		algOK = false
		c.errorf(name, "algorithm", line("algorithm"),
			"unknown algorithm %q (want token_bucket, sliding_window_log, sliding_window_counter, fixed_window or gcra)", s.Algorithm)
	}
	switch r.Scope {
	case "":
		r.Scope = ScopeKey
	case ScopeKey, ScopeTenant, ScopeIP, ScopeGlobal:
	default:
		c.errorf(name, "scope", line("scope"), "unknown scope %q (want key, tenant, ip or global)", s.Scope)
	}
	switch r.OnFailure {
	case "":
		r.OnFailure = FailOpen
	case FailOpen, FailClosed:
	default:
		c.errorf(name, "on_failure", line("on_failure"), "unknown failure mode %q (want open or closed)", s.OnFailure)
	}

	r.match = c.matcher(name, &s.Match, s.lines, s.line)
	// Counted per client IP: ip-scope rules, and key- and tenant-scope
	// rules for anonymous requests (see matcher.needsIP).
	r.match.ipScope = r.Scope == ScopeIP
	r.match.personal = r.Scope == ScopeKey || r.Scope == ScopeTenant

	var base paramVals
	paramsOK := false
	if algOK {
		var ok bool
		base, ok = c.values(name, r.Algorithm, &s.ParamSpec, "", s.Block, false)
		if ok {
			r.Params, paramsOK = c.finish(name, r.Algorithm, base, s.Block, "", s.lines, s.line)
		}
	}

	if s.Cost != nil {
		r.Cost = *s.Cost
		switch {
		case r.Cost < 1:
			c.errorf(name, "cost", line("cost"), "cost must be at least 1")
		case paramsOK && !s.Block && r.Cost > r.Params.Limit:
			c.errorf(name, "cost", line("cost"),
				"cost %d exceeds the rule's limit %d: no request could ever pass", r.Cost, r.Params.Limit)
		}
	}

	c.regionMode(name, r, s, line)

	if len(s.Overrides) > 0 {
		c.overrides(name, r, s, base, paramsOK && algOK)
	}

	if len(s.Replaces) > 0 {
		r.Replaces = make([]string, 0, len(s.Replaces))
		for _, id := range s.Replaces {
			if !slices.Contains(r.Replaces, id) {
				r.Replaces = append(r.Replaces, id)
			}
		}
	}
	return r
}

func (c *compiler) overrides(name string, r *Rule, s *RuleSpec, base paramVals, baseOK bool) {
	line := fieldLine(s.lines, "overrides", s.line)
	if r.Scope != ScopeKey {
		c.errorf(name, "overrides", line, "per-key overrides are allowed only on scope key rules (this rule has scope %s)", r.Scope)
		return
	}
	if s.Block {
		c.errorf(name, "overrides", line, "a block rule has no parameters to override")
		return
	}
	for _, key := range slices.Sorted(maps.Keys(s.Overrides)) {
		o := s.Overrides[key]
		field := "overrides[" + redactKey(key) + "]"
		oline := cmp.Or(o.line, line)
		kid, isKid := strings.CutPrefix(key, "kid:")
		if isKid && kid == "" {
			c.errorf(name, field, oline, "kid: needs a key_id")
			continue
		}
		if err := checkKey(key); err != nil {
			c.errorf(name, field, oline, "%v", err)
			continue
		}
		if o.empty() {
			c.errorf(name, field, oline, "override sets no parameter")
			continue
		}
		o.line = cmp.Or(o.line, oline)
		ov, ok := c.values(name, r.Algorithm, &o, field, false, true)
		if !ok || !baseOK {
			continue
		}
		p, ok := c.finish(name, r.Algorithm, merge(base, ov), false, field, o.lines, oline)
		if !ok {
			continue
		}
		if r.Cost > 0 && r.Cost > p.Limit {
			c.errorf(name, field, oline, "the rule's cost %d exceeds this override's limit %d: no request could ever pass", r.Cost, p.Limit)
			continue
		}
		if isKid {
			if r.kidOverrides == nil {
				r.kidOverrides = map[string]Params{}
			}
			r.kidOverrides[kid] = p
		} else {
			if r.overrides == nil {
				r.overrides = map[string]Params{}
			}
			r.overrides[key] = p
		}
	}
}

// paramVals are a rule's or an override's parameters, checked one by one
// and converted to microseconds and exact rationals.
type paramVals struct {
	limit, capacity, burst, precision *int64
	window                            int64    // µs; 0 when unset
	rateN, ratePeriod                 int64    // rate: N per period µs; 0 when unset
	refill                            *big.Rat // refill_rate per second; nil when unset
}

func (v *paramVals) hasRate() bool { return v.rateN > 0 || v.refill != nil }

func (v *paramVals) rateField() string {
	if v.refill != nil {
		return "refill_rate"
	}
	return "rate"
}

// merge returns base with the parameters o sets replacing base's; setting
// either rate or refill_rate replaces both.
func merge(base, o paramVals) paramVals {
	out := base
	if o.limit != nil {
		out.limit = o.limit
	}
	if o.capacity != nil {
		out.capacity = o.capacity
	}
	if o.burst != nil {
		out.burst = o.burst
	}
	if o.hasRate() {
		out.rateN, out.ratePeriod, out.refill = o.rateN, o.ratePeriod, o.refill
	}
	return out
}

func paramAllowed(a Algorithm, f string) bool {
	switch f {
	case "capacity", "rate", "refill_rate":
		return a == TokenBucket
	case "limit", "window":
		return a != TokenBucket
	case "precision":
		return a == SlidingWindowCounter
	case "burst":
		return a == GCRA
	}
	return false
}

func paramHint(a Algorithm) string {
	switch a {
	case TokenBucket:
		return "token_bucket takes capacity and rate or refill_rate"
	case SlidingWindowCounter:
		return "sliding_window_counter takes limit, window and precision"
	case GCRA:
		return "gcra takes limit, window and burst"
	}
	return string(a) + " takes limit and window"
}

// values checks each parameter p sets on its own: that it belongs to the
// algorithm, and that its value is in range. prefix is "" for the rule's
// own parameters and "overrides[…]" for an override.
func (c *compiler) values(name string, alg Algorithm, p *ParamSpec, prefix string, block, override bool) (paramVals, bool) {
	var v paramVals
	ok := true
	fail := func(f, format string, args ...any) {
		ok = false
		c.errorf(name, join(prefix, f), fieldLine(p.lines, f, p.line), format, args...)
	}
	check := func(f string, set bool) bool {
		if !set {
			return false
		}
		if !paramAllowed(alg, f) {
			fail(f, "%s does not belong to algorithm %s (%s)", f, alg, paramHint(alg))
			return false
		}
		if override && (f == "window" || f == "precision") {
			fail(f, "%s cannot be overridden per key: it is part of the counter identity (write a separate rule with replaces)", f)
			return false
		}
		return true
	}
	count := func(f string, n *int64) *int64 {
		switch {
		case *n < 0:
			fail(f, "%s must be positive", f)
		case *n == 0 && !block:
			fail(f, "%s 0 would refuse every request: set block: true to block", f)
		case *n > maxLimit:
			fail(f, "%s exceeds %d", f, maxLimit)
		default:
			return n
		}
		return nil
	}
	if check("limit", p.Limit != nil) {
		v.limit = count("limit", p.Limit)
	}
	if check("capacity", p.Capacity != nil) {
		v.capacity = count("capacity", p.Capacity)
	}
	if check("burst", p.Burst != nil) {
		v.burst = count("burst", p.Burst)
	}
	if check("precision", p.Precision != nil) {
		if n := *p.Precision; n < 1 || n > maxPrecis {
			fail("precision", "precision must be between 1 and %d", maxPrecis)
		} else {
			v.precision = p.Precision
		}
	}
	if check("window", p.Window != "") {
		w, err := parseDuration(p.Window)
		if err != nil {
			fail("window", "window: %v", err)
		} else {
			v.window = w
		}
	}
	if check("rate", p.Rate != "") {
		n, per, err := parseRate(p.Rate)
		if err != nil {
			fail("rate", "%v", err)
		} else {
			v.rateN, v.ratePeriod = n, per
		}
	}
	if check("refill_rate", p.RefillRate != "") {
		r, err := parseExactDecimal(p.RefillRate)
		switch {
		case err != nil:
			fail("refill_rate", "refill_rate: %v", err)
		case r.Sign() <= 0:
			fail("refill_rate", "refill_rate must be positive")
		case r.Cmp(new(big.Rat).SetInt64(maxLimit)) > 0:
			fail("refill_rate", "refill_rate exceeds %d per second", maxLimit)
		default:
			v.refill = r
		}
		if p.Rate != "" {
			fail("refill_rate", "set either rate or refill_rate, not both")
		}
	}
	return v, ok
}

// finish checks that the required parameters are present and computes
// Params. A block rule needs no parameters; when it gives incomplete ones
// its Params stay zero.
func (c *compiler) finish(name string, alg Algorithm, v paramVals, block bool, prefix string, lines lineMap, line int) (Params, bool) {
	p := Params{Precision: 1, FullDen: 1}
	var missing []string
	if alg == TokenBucket {
		if v.capacity == nil {
			missing = append(missing, "capacity")
		}
		if !v.hasRate() {
			missing = append(missing, "rate")
		}
	} else {
		if v.limit == nil {
			missing = append(missing, "limit")
		}
		if v.window == 0 {
			missing = append(missing, "window")
		}
	}
	if len(missing) > 0 {
		if block {
			return p, true
		}
		for _, f := range missing {
			what := f
			if f == "rate" {
				what = "rate (N/duration) or refill_rate (units per second)"
			}
			c.errorf(name, join(prefix, f), line, "%s needs %s", alg, what)
		}
		return p, false
	}
	fail := func(f, format string, args ...any) (Params, bool) {
		c.errorf(name, join(prefix, f), fieldLine(lines, f, line), format, args...)
		return p, false
	}
	full := func(f string, r *big.Rat) (Params, bool) {
		if r.Sign() == 0 { // limit 0 of a block rule: nothing ever refills
			return p, true
		}
		num, den, ok := exactFraction(r)
		if !ok {
			return fail(f, "full-refill time %s µs needs numbers above 2^52 in exact integer arithmetic (Redis scripts compute in doubles): use smaller values", r.RatString())
		}
		p.FullNum, p.FullDen = num, den
		return p, true
	}
	switch alg {
	case TokenBucket:
		p.Limit = *v.capacity
		var f *big.Rat
		if v.refill != nil {
			// capacity ÷ (units per second) seconds, in µs
			f = new(big.Rat).Quo(new(big.Rat).SetInt64(p.Limit*usPerSecond), v.refill)
		} else {
			// capacity × period ÷ N
			f = new(big.Rat).SetFrac(new(big.Int).Mul(big.NewInt(p.Limit), big.NewInt(v.ratePeriod)), big.NewInt(v.rateN))
			p.RatePeriod = v.ratePeriod
		}
		return full(v.rateField(), f)
	case GCRA:
		limit := *v.limit
		burst := limit
		if v.burst != nil {
			burst = *v.burst
		}
		p.Limit, p.Window = burst, v.window
		if limit == 0 {
			return p, true
		}
		// rate = limit / window, so an empty bucket of burst refills in burst × window ÷ limit
		f := new(big.Rat).SetFrac(new(big.Int).Mul(big.NewInt(burst), big.NewInt(v.window)), big.NewInt(limit))
		return full("window", f)
	default:
		p.Limit, p.Window = *v.limit, v.window
		if v.precision != nil {
			p.Precision = *v.precision
			if p.Window%p.Precision != 0 {
				return fail("precision", "window of %d µs is not divisible by precision %d", p.Window, p.Precision)
			}
		}
		return p, true
	}
}

// methodToken reports whether s is an HTTP method token (RFC 9110 tchar).
func methodToken(s string) bool {
	return len(s) <= 32 && httptoken.Is(s)
}

func (c *compiler) matcher(name string, m *MatchSpec, lines lineMap, ruleLine int) matcher {
	var mt matcher
	line := func(f string) int { return fieldLine(lines, f, ruleLine) }
	if m.APIKey != "" {
		g, err := compileGlob(m.APIKey)
		if err != nil {
			c.errorf(name, "match.api_key", line("match.api_key"), "%v", err)
		}
		mt.apiKey = &g
	}
	if m.Tier != "" {
		if err := checkName(m.Tier); err != nil {
			c.errorf(name, "match.tier", line("match.tier"), "%v", err)
		}
		mt.tier = m.Tier
	}
	if m.Tenant != "" {
		if err := checkName(m.Tenant); err != nil {
			c.errorf(name, "match.tenant", line("match.tenant"), "%v", err)
		}
		mt.tenant = m.Tenant
	}
	if m.Endpoint != "" {
		re, err := regexp.Compile(m.Endpoint)
		if err != nil {
			c.errorf(name, "match.endpoint", line("match.endpoint"), "bad regular expression: %v", err)
		}
		mt.endpoint = re
	}
	for i, meth := range m.Methods {
		if !methodToken(meth) {
			f := fmt.Sprintf("match.methods[%d]", i)
			c.errorf(name, "match.methods", line(f), "invalid HTTP method %q", meth)
			continue
		}
		if u := strings.ToUpper(meth); !slices.Contains(mt.methods, u) {
			mt.methods = append(mt.methods, u)
		}
	}
	if m.Methods != nil && len(m.Methods) == 0 {
		c.errorf(name, "match.methods", line("match.methods"), "must list at least one method")
	}
	if m.Domain != "" {
		if err := checkName(m.Domain); err != nil {
			c.errorf(name, "match.domain", line("match.domain"), "%v", err)
		}
		mt.domain = m.Domain
	}
	for _, k := range slices.Sorted(maps.Keys(m.Descriptor)) {
		if err := checkName(k); err != nil {
			c.errorf(name, "match.descriptor", line("match.descriptor"), "descriptor key %q: %v", k, err)
			continue
		}
		mt.descriptor = append(mt.descriptor, descPair{key: k, value: m.Descriptor[k]})
	}
	if m.Anonymous != nil {
		if *m.Anonymous {
			mt.anon = anonOnly
			if m.APIKey != "" || m.Tier != "" || m.Tenant != "" {
				c.errorf(name, "match.anonymous", line("match.anonymous"),
					"anonymous: true contradicts api_key, tier and tenant selectors, which never match a request without a key")
			}
		} else {
			mt.anon = keyedOnly
		}
	}
	mt.keyed = m.APIKey != "" || m.Tier != "" || m.Tenant != ""
	return mt
}

// replaces resolves every rule's `replaces`, refuses unknown ids, self
// references, cycles and shadow rules displacing enforced ones, and fills
// displacedBy.
func (c *compiler) replaces() {
	rs := c.rs
	specs := c.doc.Rules
	rs.displacedBy = make([][]int, len(rs.rules))
	edges := make([][]int, len(rs.rules))
	for _, r := range rs.rules {
		line := fieldLine(specs[r.Index].lines, "replaces", specs[r.Index].line)
		name := ruleName(r.Index, r.ID)
		for _, id := range r.Replaces {
			t := rs.byID[id]
			switch {
			case id == r.ID:
				c.errorf(name, "replaces", line, "a rule cannot replace itself")
			case t == nil:
				c.errorf(name, "replaces", line, "unknown rule %q", id)
			case r.Shadow && !t.Shadow:
				c.errorf(name, "replaces", line, "shadow rule cannot replace enforced rule %q", id)
			default:
				edges[r.Index] = append(edges[r.Index], t.Index)
				rs.displacedBy[t.Index] = append(rs.displacedBy[t.Index], r.Index)
				rs.replacing = true
			}
		}
	}
	for _, cyc := range findCycles(edges) {
		ids := make([]string, len(cyc))
		for i, ix := range cyc {
			ids[i] = ruleName(ix, rs.rules[ix].ID)
		}
		first := cyc[0]
		c.errorf(ids[0], "replaces", fieldLine(specs[first].lines, "replaces", specs[first].line),
			"replaces cycle: %s -> %s", strings.Join(ids, " -> "), ids[0])
	}
}

// findCycles returns one cycle per back edge of a depth-first search over
// edges, in file order, each rotated to start at its lowest index.
func findCycles(edges [][]int) [][]int {
	const (
		white = iota
		grey
		black
	)
	color := make([]int8, len(edges))
	var stack []int
	var cycles [][]int
	var visit func(u int)
	visit = func(u int) {
		color[u] = grey
		stack = append(stack, u)
		for _, w := range edges[u] {
			switch color[w] {
			case white:
				visit(w)
			case grey:
				i := slices.Index(stack, w)
				cyc := slices.Clone(stack[i:])
				lo := slices.Index(cyc, slices.Min(cyc))
				cycles = append(cycles, append(cyc[lo:], cyc[:lo]...))
			}
		}
		stack = stack[:len(stack)-1]
		color[u] = black
	}
	for u := range edges {
		if color[u] == white {
			visit(u)
		}
	}
	return cycles
}

// tagIdentity is the rule part of a counter's identity, the text
// a rule's Tag is derived from:
//
//	id|algorithm|window_µs|precision|scope|by_endpoint
//
// with window 0 for token_bucket, precision 1 unless sliding_window_counter,
// and by_endpoint "true" or "false".
func tagIdentity(r *Rule) string {
	window := r.Params.Window
	if r.Algorithm == TokenBucket {
		window = 0
	}
	precision := int64(1)
	if r.Algorithm == SlidingWindowCounter {
		precision = r.Params.Precision
	}
	return fmt.Sprintf("%s|%s|%d|%d|%s|%t", r.ID, r.Algorithm, window, precision, r.Scope, r.ByEndpoint)
}

// assignTags gives every rule its Tag: the unpadded base64url SHA-256 of its
// identity (tagIdentity), cut to 3 characters. When several rules of the
// ruleset share their 3 characters, every one of them gets 8 instead (and,
// should 8 still collide, the whole 43). A tag depends only on the rule's
// identity and on which other identities are present, never on order; a
// collision is rare (about n²/2^19 for n rules) and only then does adding a
// rule change another rule's tag, starting fresh counters for it.
func assignTags(rules []*Rule) {
	full := make([]string, len(rules))
	for i, r := range rules {
		sum := sha256.Sum256([]byte(tagIdentity(r)))
		full[i] = base64.RawURLEncoding.EncodeToString(sum[:])
	}
	pending := make([]int, len(rules))
	for i := range pending {
		pending[i] = i
	}
	for _, n := range []int{3, 8, 43} {
		count := map[string]int{}
		for _, i := range pending {
			count[full[i][:n]]++
		}
		var next []int
		for _, i := range pending {
			if count[full[i][:n]] == 1 || n == 43 {
				rules[i].Tag = full[i][:n]
			} else {
				next = append(next, i)
			}
		}
		if pending = next; len(pending) == 0 {
			return
		}
	}
}
