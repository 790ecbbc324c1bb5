package rules

// Rule is one compiled, immutable rule. Rules are shared by every goroutine
// holding the Ruleset; never modify one.
type Rule struct {
	ID         string
	Algorithm  Algorithm
	Scope      Scope
	Params     Params // the rule's own parameters
	Cost       int64  // the rule's fixed cost; 0 when the rule sets none
	Strict     bool
	Shadow     bool
	Block      bool
	ByEndpoint bool
	OnFailure  FailureMode
	// Regions is regional (every region enforces the whole limit) or
	// global (each region enforces its share: Ruleset.RegionShare).
	Regions  RegionMode
	Replaces []string

	// Tag is a short string (base64url characters) derived from the counter
	// identity's rule part (id, algorithm, window, precision, scope), unique
	// within the ruleset, used in Redis key names. It does not change when
	// rules are inserted or reordered, nor when limits or rates change.
	Tag string

	// Index is the rule's position in the ruleset (file order).
	Index int

	match        matcher
	overrides    map[string]Params // raw API key -> params
	kidOverrides map[string]Params // key_id (written "kid:<key_id>") -> params
}

// SelectsKeysOnly reports whether the rule's match selects by key
// identity alone (api_key, tier or tenant, perhaps anonymous: false) and
// nothing about the request (endpoint, methods, domain, descriptor): a
// block rule of that kind blocks keys (403 KEY_BLOCKED), any other block
// rule blocks requests (403 ENDPOINT_BLOCKED).
func (r *Rule) SelectsKeysOnly() bool {
	m := &r.match
	return m.keyed && m.endpoint == nil && m.methods == nil && m.domain == "" && m.descriptor == nil
}

// ParamsFor returns the parameters of the rule for a key: the rule's own,
// or a per-key override from the rules file (looked up by raw key, then by
// "kid:"+keyID). The second result reports whether an override applied.
func (r *Rule) ParamsFor(key, keyID string) (Params, bool) {
	if len(r.overrides) > 0 && key != "" {
		if p, ok := r.overrides[key]; ok {
			return p, true
		}
	}
	if len(r.kidOverrides) > 0 && keyID != "" {
		if p, ok := r.kidOverrides[keyID]; ok {
			return p, true
		}
	}
	return r.Params, false
}

// Ruleset is a compiled, validated, immutable set of rules. It is safe for
// concurrent use. Swap whole rulesets atomically (atomic.Pointer) to reload.
type Ruleset struct {
	version int64
	hash    string
	rules   []*Rule
	byID    map[string]*Rule

	registry  map[string]KeyInfo
	tiers     []tierPattern
	allowlist globList
	blocklist globList
	routes    []route
	regions   []Region

	// displacedBy maps a rule index to the indexes of rules that list it
	// in `replaces`.
	displacedBy [][]int
	// replacing reports whether any rule lists another in `replaces`.
	replacing bool
	// descriptors: some rule matches descriptor entries; byIP: some rule
	// counts by client IP (scope ip).
	descriptors, byIP bool
	// warnings name what allow_total_block let through.
	warnings []ValidationError
}

// Warnings returns what the ruleset was accepted with only because it says
// allow_total_block: true — each blocklist pattern or block rule that
// refuses every request — naming the rule and field as a refusal would.
// Callers show them (the operator API answers them). The slice must not be
// modified.
func (rs *Ruleset) Warnings() []ValidationError { return rs.warnings }

// MatchesDescriptors reports whether some rule selects by Envoy descriptor
// entries (`match: {descriptor: …}`): only then does a request's
// Descriptor change which rules it matches.
func (rs *Ruleset) MatchesDescriptors() bool { return rs.descriptors }

// CountsByIP reports whether some rule has scope ip: only then (and for
// anonymous requests, which count every rule per IP) do a keyed request's
// matches and counters depend on its client IP.
func (rs *Ruleset) CountsByIP() bool { return rs.byIP }

// KeyInfo is a key registry entry.
type KeyInfo struct {
	Tenant string
	Tier   string
}

// RegisteredKeys calls yield with every raw key of the key registry (the
// `keys` section), in no particular order, until it returns false.
func (rs *Ruleset) RegisteredKeys(yield func(key string) bool) {
	for k := range rs.registry {
		if !yield(k) {
			return
		}
	}
}

// Version is the file's `version` field (informational in files; assigned by
// the operator API in fleet mode).
func (rs *Ruleset) Version() int64 { return rs.version }

// Hash is a hex content hash of the source document; any change of content is
// a new ruleset.
func (rs *Ruleset) Hash() string { return rs.hash }

// Rules returns the rules in file order. The slice must not be modified.
func (rs *Ruleset) Rules() []*Rule { return rs.rules }

// Rule returns the rule with the given id, or nil.
func (rs *Ruleset) Rule(id string) *Rule { return rs.byID[id] }
