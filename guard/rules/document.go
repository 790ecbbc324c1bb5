package rules

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Document is a rules document as written, decoded but not yet
// validated: numbers are checked for type only and durations, rates and
// patterns are kept as text. Build one with [Parse] (which also records
// line numbers for error messages) or in code, and turn it into a [Ruleset]
// with [Compile].
//
// Unset optional fields are zero: empty strings, nil slices and maps, nil
// pointers. Pointers distinguish "absent" from an explicit 0 or false. The
// struct tags name each field as written, so a Document marshalled with
// go.yaml.in/yaml/v3 or encoding/json parses back to an equal one.
type Document struct {
	// Version is the file's `version`: informational in files (default 0);
	// the operator API assigns versions itself.
	Version int64 `yaml:"version,omitempty" json:"version,omitempty"`
	// Keys is the optional key registry (`keys`): raw API key -> tenant
	// and tier. It is consulted before Tiers.
	Keys map[string]KeySpec `yaml:"keys,omitempty" json:"keys,omitempty"`
	// Tiers (`tiers`) gives keys missing from the registry a tier: the
	// first entry whose pattern matches the key wins.
	Tiers []TierSpec `yaml:"tiers,omitempty" json:"tiers,omitempty"`
	// Allowlist (`allowlist`) holds key globs that bypass every limit.
	Allowlist []string `yaml:"allowlist,omitempty" json:"allowlist,omitempty"`
	// Blocklist (`blocklist`) holds key globs always answered with 403;
	// it wins over Allowlist.
	Blocklist []string `yaml:"blocklist,omitempty" json:"blocklist,omitempty"`
	// Routes (`routes`) are endpoint normalisation templates such as
	// "/v1/users/{id}", tried in order.
	Routes []string `yaml:"routes,omitempty" json:"routes,omitempty"`
	// Rules (`rules`), in file order.
	Rules []RuleSpec `yaml:"rules,omitempty" json:"rules,omitempty"`
	// AllowTotalBlock (`allow_total_block`) accepts a ruleset that would
	// refuse every request (a blocklist pattern matching every key, a block
	// rule matching every request): without it such a ruleset is refused,
	// with it [Ruleset.Warnings] names each total block.
	AllowTotalBlock bool `yaml:"allow_total_block,omitempty" json:"allow_total_block,omitempty"`
	// Regions (`regions`) lists the deployment's regions and their static
	// parts of every `regions: global` rule's limit. Absent: the gateway's
	// own region alone, with the whole limit.
	Regions []RegionSpec `yaml:"regions,omitempty" json:"regions,omitempty"`

	hash  string  // hex SHA-256 of the source bytes; "" when built in code
	lines lineMap // top-level field -> line
}

// KeySpec is one key registry entry (`keys: {sk_...: {tenant, tier}}`).
type KeySpec struct {
	Tenant string `yaml:"tenant,omitempty" json:"tenant,omitempty"` // empty: the key is its own tenant
	Tier   string `yaml:"tier,omitempty" json:"tier,omitempty"`

	line int
}

// TierSpec is one `tiers` entry: keys matching Pattern (a glob, `*` any
// run of characters) get Tier.
type TierSpec struct {
	Pattern string `yaml:"pattern,omitempty" json:"pattern,omitempty"`
	Tier    string `yaml:"tier,omitempty" json:"tier,omitempty"`

	line int
}

// RegionSpec is one `regions` entry: a region's name and its weight, the
// part of every global rule's limit the region holds (a number in [0, 1],
// at most six decimals; the weights sum to at most 1). When no entry gives
// a weight, every region gets an equal part, the parts summing to 1.
type RegionSpec struct {
	Name   string `yaml:"name,omitempty" json:"name,omitempty"`
	Weight string `yaml:"weight,omitempty" json:"weight,omitempty"` // exact decimal text, e.g. 0.25

	line int
}

// RuleSpec is one rule as written. Its algorithm parameters are in the
// embedded ParamSpec, under the same names as in the file.
type RuleSpec struct {
	// ID (`id`) names the rule in headers, metrics and Redis key names:
	// 1 to 64 characters from [A-Za-z0-9._-], starting with a letter or
	// digit.
	ID string `yaml:"id,omitempty" json:"id,omitempty"`
	// Match (`match`) holds the selectors; an empty Match matches every
	// request, keyed or anonymous.
	Match MatchSpec `yaml:"match,omitempty" json:"match,omitzero"`
	// Scope (`scope`): key (default), tenant, ip or global.
	Scope string `yaml:"scope,omitempty" json:"scope,omitempty"`
	// Algorithm (`algorithm`): token_bucket (default), sliding_window_log,
	// sliding_window_counter, fixed_window or gcra.
	Algorithm string `yaml:"algorithm,omitempty" json:"algorithm,omitempty"`
	// ParamSpec holds the algorithm's parameters (limit, window, ...).
	ParamSpec `yaml:",inline"`
	// Cost (`cost`) is the units each matching request costs, ≥ 1; nil
	// when the rule leaves the cost to the request.
	Cost *int64 `yaml:"cost,omitempty" json:"cost,omitempty"`
	// Strict (`strict`): never answered by the local fast path.
	Strict bool `yaml:"strict,omitempty" json:"strict,omitempty"`
	// Shadow (`shadow`): decided, counted and streamed, never enforced.
	Shadow bool `yaml:"shadow,omitempty" json:"shadow,omitempty"`
	// Block (`block`): every matching request gets 403; the algorithm
	// parameters are optional.
	Block bool `yaml:"block,omitempty" json:"block,omitempty"`
	// ByEndpoint (`by_endpoint`): one counter per scope value and
	// normalised endpoint.
	ByEndpoint bool `yaml:"by_endpoint,omitempty" json:"by_endpoint,omitempty"`
	// OnFailure (`on_failure`): open (default) or closed, how the rule is
	// decided while Redis is unavailable.
	OnFailure string `yaml:"on_failure,omitempty" json:"on_failure,omitempty"`
	// Regions (`regions`): regional (default: every region enforces the
	// whole limit, so a client rotating N regions gets N × the limit) or
	// global (one limit for every region together, each region enforcing
	// its share).
	Regions string `yaml:"regions,omitempty" json:"regions,omitempty"`
	// Replaces (`replaces`) lists ids of rules this rule displaces for the
	// requests it matches (not transitive).
	Replaces []string `yaml:"replaces,omitempty" json:"replaces,omitempty"`
	// Overrides (`overrides`) maps a raw API key, or "kid:<key_id>", to
	// parameters replacing the rule's own for that key; parameters not
	// given keep the rule's values. Key-scope rules only.
	Overrides map[string]ParamSpec `yaml:"overrides,omitempty" json:"overrides,omitempty"`

	line  int
	lines lineMap // field path -> line
}

// MatchSpec holds a rule's selectors (`match`). A request matches when every
// selector set does.
type MatchSpec struct {
	// APIKey (`api_key`) is a glob on the raw key (`*` any run of
	// characters); never matches an anonymous request.
	APIKey string `yaml:"api_key,omitempty" json:"api_key,omitempty"`
	// Tier (`tier`) and Tenant (`tenant`) must equal the request's; never
	// match an anonymous request.
	Tier   string `yaml:"tier,omitempty" json:"tier,omitempty"`
	Tenant string `yaml:"tenant,omitempty" json:"tenant,omitempty"`
	// Endpoint (`endpoint`) is a Go regular expression searched in the
	// normalised endpoint (anchor it with ^ and $ as needed).
	Endpoint string `yaml:"endpoint,omitempty" json:"endpoint,omitempty"`
	// Methods (`methods`) lists HTTP methods, compared case-insensitively.
	Methods []string `yaml:"methods,omitempty" json:"methods,omitempty"`
	// Domain (`domain`) restricts the rule to one Envoy RLS domain; rules
	// without it apply to HTTP requests and every domain alike.
	Domain string `yaml:"domain,omitempty" json:"domain,omitempty"`
	// Descriptor (`descriptor`): every pair must be present and equal in
	// the request's Envoy RLS descriptor.
	Descriptor map[string]string `yaml:"descriptor,omitempty" json:"descriptor,omitempty"`
	// Anonymous (`anonymous`): true matches only requests without a key,
	// false only requests with one; nil matches both.
	Anonymous *bool `yaml:"anonymous,omitempty" json:"anonymous,omitempty"`
}

// ParamSpec holds algorithm parameters as written, in a rule or in one of
// its per-key overrides. Which ones a rule may set depends on its algorithm:
//
//	token_bucket            capacity, and rate or refill_rate
//	sliding_window_log      limit, window
//	fixed_window            limit, window
//	sliding_window_counter  limit, window, precision (default 1)
//	gcra                    limit, window, burst (default limit)
type ParamSpec struct {
	Limit      *int64 `yaml:"limit,omitempty" json:"limit,omitempty"`             // `limit`
	Window     string `yaml:"window,omitempty" json:"window,omitempty"`           // `window`: a duration such as 1m, 500ms, 1d, 1h30m
	Precision  *int64 `yaml:"precision,omitempty" json:"precision,omitempty"`     // `precision`: sub-windows of a sliding_window_counter
	Capacity   *int64 `yaml:"capacity,omitempty" json:"capacity,omitempty"`       // `capacity`: a token bucket's size (its burst)
	Rate       string `yaml:"rate,omitempty" json:"rate,omitempty"`               // `rate`: "N/duration", N units per duration
	RefillRate string `yaml:"refill_rate,omitempty" json:"refill_rate,omitempty"` // `refill_rate`: units per second, exact decimal text (e.g. 0.5)
	Burst      *int64 `yaml:"burst,omitempty" json:"burst,omitempty"`             // `burst`: a gcra rule's burst

	line  int
	lines lineMap // field -> line
}

func (p *ParamSpec) empty() bool {
	return p.Limit == nil && p.Window == "" && p.Precision == nil && p.Capacity == nil &&
		p.Rate == "" && p.RefillRate == "" && p.Burst == nil
}

// lineMap records the source line of fields, for error messages.
type lineMap map[string]int

func (m lineMap) set(k string, line int) {
	if m != nil {
		m[k] = line
	}
}

// maxErrors bounds the problems reported for one document.
const maxErrors = 50

// Parse decodes a rules document from YAML or JSON. It refuses syntax
// errors, unknown, duplicate and wrongly typed fields, YAML aliases and
// multi-document streams, each with a [*ValidationError] naming the rule,
// field and line; several problems are joined with errors.Join. The
// returned Document is not validated: see [Compile].
func Parse(data []byte) (*Document, error) {
	dec := yaml.NewDecoder(bytes.NewReader(jsonAsYAML(data)))
	var root yaml.Node
	if err := decodeYAML(dec, &root); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &ValidationError{Msg: "empty document"}
		}
		return nil, syntaxError(err)
	}
	var extra yaml.Node
	if err := decodeYAML(dec, &extra); !errors.Is(err, io.EOF) {
		line := extra.Line
		if err != nil {
			return nil, syntaxError(err)
		}
		return nil, &ValidationError{Line: line, Msg: "more than one YAML document"}
	}
	n := &root
	if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		n = n.Content[0]
	}
	if isNull(n) {
		return nil, &ValidationError{Line: n.Line, Msg: "empty document"}
	}
	d := &decoder{}
	doc := d.document(n)
	if err := d.err(); err != nil {
		return nil, err
	}
	sum := sha256.Sum256(data)
	doc.hash = hex.EncodeToString(sum[:])
	return doc, nil
}

// decodeYAML runs the YAML decoder, turning a panic inside it (a bug in the
// parser on hostile input) into an error: bad input gets an error, never a
// crash of the process reloading rules.
func decodeYAML(dec *yaml.Decoder, n *yaml.Node) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("yaml: parser failure: %v", r)
		}
	}()
	return dec.Decode(n)
}

var yamlLine = regexp.MustCompile(`line (\d+)`)

func syntaxError(err error) error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line := 0
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		line, _ = strconv.Atoi(m[1])
	}
	return &ValidationError{Line: line, Msg: "invalid YAML: " + msg}
}

// decoder walks a yaml.Node tree into a Document, collecting problems.
type decoder struct {
	errs []error
}

func (d *decoder) errorf(rule, field string, line int, format string, args ...any) {
	if len(d.errs) < maxErrors {
		d.errs = append(d.errs, &ValidationError{Rule: rule, Field: field, Line: line, Msg: fmt.Sprintf(format, args...)})
	}
}

func (d *decoder) err() error { return errors.Join(d.errs...) }

// isNull reports an absent value (`~`, `null` or nothing), treated as unset.
func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// kind checks a node's kind, refusing aliases with a clear message. A null
// node is an unset field: kind reports false without a problem.
func (d *decoder) kind(n *yaml.Node, want yaml.Kind, rule, field, what string) bool {
	if isNull(n) {
		return false
	}
	if n.Kind == yaml.AliasNode {
		d.errorf(rule, field, n.Line, "YAML aliases are not supported")
		return false
	}
	if n.Kind != want {
		d.errorf(rule, field, n.Line, "must be %s", what)
		return false
	}
	return true
}

// mapping calls fn for every key/value pair of a mapping node, refusing
// non-string and duplicate keys.
func (d *decoder) mapping(n *yaml.Node, rule, field string, fn func(key string, k, v *yaml.Node)) {
	if !d.kind(n, yaml.MappingNode, rule, field, "a mapping") {
		return
	}
	var seen map[string]int
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			d.errorf(rule, field, k.Line, "mapping keys must be strings")
			continue
		}
		if seen == nil {
			seen = make(map[string]int, len(n.Content)/2)
		}
		if prev, dup := seen[k.Value]; dup {
			d.errorf(rule, join(field, redactField(field, k.Value)), k.Line, "duplicate field (first at line %d)", prev)
			continue
		}
		seen[k.Value] = k.Line
		fn(k.Value, k, v)
	}
}

// redactField names a mapping entry in an error: raw keys of the registry
// and of overrides are shortened so errors never print a credential.
func redactField(field, key string) string {
	if field == "keys" || strings.HasSuffix(field, "overrides") {
		return "[" + redactKey(key) + "]"
	}
	return key
}

// redactKey returns a key as shown in errors: "kid:" ids in full (they are
// not secret), raw keys as a short prefix and an ellipsis.
func redactKey(k string) string {
	if strings.HasPrefix(k, "kid:") {
		return k
	}
	n := min(10, len(k)/2)
	for n > 0 && n < len(k) && k[n]&0xC0 == 0x80 {
		n-- // do not cut a UTF-8 sequence
	}
	return k[:n] + "…"
}

func join(parent, child string) string {
	switch {
	case parent == "":
		return child
	case strings.HasPrefix(child, "["):
		return parent + child
	}
	return parent + "." + child
}

func (d *decoder) unknown(rule, field string, k *yaml.Node) {
	d.errorf(rule, field, k.Line, "unknown field")
}

// str reads a string scalar. Integers and floats are taken as their text
// (ids such as 404, tenant 12); booleans are refused.
func (d *decoder) str(n *yaml.Node, rule, field string) (string, bool) {
	return d.text(n, rule, field, "a string")
}

// text reads the text of a string or number scalar; anything else is
// refused, saying the field must be want.
func (d *decoder) text(n *yaml.Node, rule, field, want string) (string, bool) {
	if !d.kind(n, yaml.ScalarNode, rule, field, want) {
		return "", false
	}
	switch n.ShortTag() {
	case "!!str", "!!int", "!!float":
		return n.Value, true
	}
	d.errorf(rule, field, n.Line, "must be %s, not %s", want, describe(n))
	return "", false
}

// nonEmpty reads a string that, when present, must not be empty.
func (d *decoder) nonEmpty(n *yaml.Node, rule, field string) (string, bool) {
	s, ok := d.str(n, rule, field)
	if ok && s == "" {
		d.errorf(rule, field, n.Line, "must not be empty")
		return "", false
	}
	return s, ok
}

func (d *decoder) integer(n *yaml.Node, rule, field string) (*int64, bool) {
	if !d.kind(n, yaml.ScalarNode, rule, field, "an integer") {
		return nil, false
	}
	if n.ShortTag() != "!!int" {
		d.errorf(rule, field, n.Line, "must be an integer, not %s", describe(n))
		return nil, false
	}
	v, err := parseInt(n.Value)
	if err != nil {
		d.errorf(rule, field, n.Line, "invalid integer %q: %v", n.Value, err)
		return nil, false
	}
	return &v, true
}

// number reads a decimal number's text (refill_rate), keeping it exact. A
// quoted number is accepted too, as a Document marshalled back to YAML or
// JSON writes it.
func (d *decoder) number(n *yaml.Node, rule, field string) (string, bool) {
	return d.text(n, rule, field, "a number")
}

func (d *decoder) boolean(n *yaml.Node, rule, field string) (bool, bool) {
	if !d.kind(n, yaml.ScalarNode, rule, field, "true or false") {
		return false, false
	}
	if n.ShortTag() != "!!bool" {
		d.errorf(rule, field, n.Line, "must be true or false, not %s", describe(n))
		return false, false
	}
	switch strings.ToLower(n.Value) {
	case "true":
		return true, true
	case "false":
		return false, true
	}
	d.errorf(rule, field, n.Line, "must be true or false")
	return false, false
}

// strings reads a sequence of non-empty strings; lines[i] gets each item's line.
func (d *decoder) strings(n *yaml.Node, rule, field string, lines lineMap) ([]string, bool) {
	if !d.kind(n, yaml.SequenceNode, rule, field, "a list") {
		return nil, false
	}
	out := make([]string, 0, len(n.Content))
	ok := true
	for i, item := range n.Content {
		f := fmt.Sprintf("%s[%d]", field, i)
		if isNull(item) {
			d.errorf(rule, f, item.Line, "must not be empty")
			ok = false
			continue
		}
		s, good := d.nonEmpty(item, rule, f)
		if !good {
			ok = false
			continue
		}
		lines.set(f, item.Line)
		out = append(out, s)
	}
	return out, ok
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	switch n.ShortTag() {
	case "!!str":
		return fmt.Sprintf("the string %q", n.Value)
	case "!!int", "!!float":
		return fmt.Sprintf("the number %s", n.Value)
	case "!!bool":
		return "a boolean"
	case "!!null":
		return "null"
	}
	return "a " + strings.TrimPrefix(n.ShortTag(), "!!")
}

func (d *decoder) document(n *yaml.Node) *Document {
	doc := &Document{lines: lineMap{}}
	if isNull(n) {
		return doc
	}
	d.mapping(n, "", "", func(key string, k, v *yaml.Node) {
		doc.lines.set(key, k.Line)
		switch key {
		case "version":
			if p, ok := d.integer(v, "", key); ok {
				doc.Version = *p
			}
		case "keys":
			doc.Keys = d.keys(v)
		case "tiers":
			doc.Tiers = d.tiers(v)
		case "allowlist":
			doc.Allowlist, _ = d.strings(v, "", key, doc.lines)
		case "blocklist":
			doc.Blocklist, _ = d.strings(v, "", key, doc.lines)
		case "routes":
			doc.Routes, _ = d.strings(v, "", key, doc.lines)
		case "allow_total_block":
			doc.AllowTotalBlock, _ = d.boolean(v, "", key)
		case "regions":
			doc.Regions = d.regions(v)
		case "rules":
			if d.kind(v, yaml.SequenceNode, "", key, "a list of rules") {
				doc.Rules = make([]RuleSpec, 0, len(v.Content))
				for i, rn := range v.Content {
					doc.Rules = append(doc.Rules, d.rule(i, rn))
				}
			}
		default:
			d.unknown("", key, k)
		}
	})
	return doc
}

func (d *decoder) keys(n *yaml.Node) map[string]KeySpec {
	out := map[string]KeySpec{}
	d.mapping(n, "", "keys", func(key string, k, v *yaml.Node) {
		field := "keys[" + redactKey(key) + "]"
		ks := KeySpec{line: k.Line}
		if !isNull(v) {
			d.fields(v, field, map[string]func(v *yaml.Node, path string){
				"tenant": func(v *yaml.Node, path string) { ks.Tenant, _ = d.nonEmpty(v, "", path) },
				"tier":   func(v *yaml.Node, path string) { ks.Tier, _ = d.nonEmpty(v, "", path) },
			})
		}
		out[key] = ks
	})
	return out
}

func (d *decoder) tiers(n *yaml.Node) []TierSpec {
	return decodeList(d, n, "tiers", "a list of {pattern, tier}", func(field string, item *yaml.Node) TierSpec {
		ts := TierSpec{line: item.Line}
		d.fields(item, field, map[string]func(v *yaml.Node, path string){
			"pattern": func(v *yaml.Node, path string) { ts.Pattern, _ = d.nonEmpty(v, "", path) },
			"tier":    func(v *yaml.Node, path string) { ts.Tier, _ = d.nonEmpty(v, "", path) },
		})
		return ts
	})
}

func (d *decoder) regions(n *yaml.Node) []RegionSpec {
	return decodeList(d, n, "regions", "a list of {name, weight}", func(field string, item *yaml.Node) RegionSpec {
		rs := RegionSpec{line: item.Line}
		d.fields(item, field, map[string]func(v *yaml.Node, path string){
			"name":   func(v *yaml.Node, path string) { rs.Name, _ = d.nonEmpty(v, "", path) },
			"weight": func(v *yaml.Node, path string) { rs.Weight, _ = d.number(v, "", path) },
		})
		return rs
	})
}

// fields decodes a mapping of a top-level section (its field path is
// field) whose keys are known: each key's decode gets its node and field
// path (field.key); any other key is refused as unknown.
func (d *decoder) fields(n *yaml.Node, field string, decode map[string]func(v *yaml.Node, path string)) {
	d.mapping(n, "", field, func(f string, k, v *yaml.Node) {
		if dec, ok := decode[f]; ok {
			dec(v, field+"."+f)
			return
		}
		d.unknown("", field+"."+f, k)
	})
}

// decodeList decodes a top-level list named name, each item by decode
// with its field path (name[i]); a node that is not a list is refused,
// saying it should be want.
func decodeList[T any](d *decoder, n *yaml.Node, name, want string, decode func(field string, item *yaml.Node) T) []T {
	if !d.kind(n, yaml.SequenceNode, "", name, want) {
		return nil
	}
	out := make([]T, 0, len(n.Content))
	for i, item := range n.Content {
		out = append(out, decode(fmt.Sprintf("%s[%d]", name, i), item))
	}
	return out
}

// ruleName is how errors name a rule: its id, or rules[i] without one.
func ruleName(i int, id string) string {
	if id == "" {
		return fmt.Sprintf("rules[%d]", i)
	}
	return id
}

func (d *decoder) rule(i int, n *yaml.Node) RuleSpec {
	r := RuleSpec{line: n.Line, lines: lineMap{}}
	if !d.kind(n, yaml.MappingNode, ruleName(i, ""), "", "a mapping") {
		return r
	}
	// Find the id first so every error about this rule can name it.
	for j := 0; j+1 < len(n.Content); j += 2 {
		if k, v := n.Content[j], n.Content[j+1]; k.Value == "id" && v.Kind == yaml.ScalarNode && !isNull(v) {
			r.ID = v.Value
			break
		}
	}
	name := ruleName(i, r.ID)
	d.mapping(n, name, "", func(key string, k, v *yaml.Node) {
		r.lines.set(key, k.Line)
		switch key {
		case "id":
			r.ID, _ = d.str(v, name, key)
		case "match":
			r.Match = d.match(v, name, r.lines)
		case "scope":
			r.Scope, _ = d.nonEmpty(v, name, key)
		case "algorithm":
			r.Algorithm, _ = d.nonEmpty(v, name, key)
		case "cost":
			r.Cost, _ = d.integer(v, name, key)
		case "strict":
			r.Strict, _ = d.boolean(v, name, key)
		case "shadow":
			r.Shadow, _ = d.boolean(v, name, key)
		case "block":
			r.Block, _ = d.boolean(v, name, key)
		case "by_endpoint":
			r.ByEndpoint, _ = d.boolean(v, name, key)
		case "on_failure":
			r.OnFailure, _ = d.nonEmpty(v, name, key)
		case "regions":
			r.Regions, _ = d.nonEmpty(v, name, key)
		case "replaces":
			r.Replaces, _ = d.strings(v, name, key, r.lines)
		case "overrides":
			r.Overrides = d.overrides(v, name, r.lines)
		default:
			if !d.param(&r.ParamSpec, key, v, name, key) {
				d.unknown(name, key, k)
			}
		}
	})
	r.ParamSpec.lines = r.lines
	r.ParamSpec.line = r.line
	return r
}

// param decodes one algorithm parameter into p; it reports false when key
// is not a parameter name.
func (d *decoder) param(p *ParamSpec, key string, v *yaml.Node, rule, field string) bool {
	switch key {
	case "limit":
		p.Limit, _ = d.integer(v, rule, field)
	case "window":
		p.Window, _ = d.nonEmpty(v, rule, field)
	case "precision":
		p.Precision, _ = d.integer(v, rule, field)
	case "capacity":
		p.Capacity, _ = d.integer(v, rule, field)
	case "rate":
		p.Rate, _ = d.nonEmpty(v, rule, field)
	case "refill_rate":
		p.RefillRate, _ = d.number(v, rule, field)
	case "burst":
		p.Burst, _ = d.integer(v, rule, field)
	default:
		return false
	}
	return true
}

func (d *decoder) match(n *yaml.Node, rule string, lines lineMap) MatchSpec {
	var m MatchSpec
	d.mapping(n, rule, "match", func(key string, k, v *yaml.Node) {
		field := "match." + key
		lines.set(field, k.Line)
		switch key {
		case "api_key":
			m.APIKey, _ = d.nonEmpty(v, rule, field)
		case "tier":
			m.Tier, _ = d.nonEmpty(v, rule, field)
		case "tenant":
			m.Tenant, _ = d.nonEmpty(v, rule, field)
		case "endpoint":
			m.Endpoint, _ = d.nonEmpty(v, rule, field)
		case "methods":
			if ms, ok := d.strings(v, rule, field, lines); ok {
				if len(ms) == 0 {
					d.errorf(rule, field, v.Line, "must list at least one method")
				}
				m.Methods = ms
			}
		case "domain":
			m.Domain, _ = d.nonEmpty(v, rule, field)
		case "descriptor":
			m.Descriptor = map[string]string{}
			d.mapping(v, rule, field, func(dk string, _, dv *yaml.Node) {
				if isNull(dv) {
					d.errorf(rule, field, dv.Line, "descriptor %q needs a value", dk)
					return
				}
				if s, ok := d.str(dv, rule, field); ok {
					m.Descriptor[dk] = s
				}
			})
		case "anonymous":
			if b, ok := d.boolean(v, rule, field); ok {
				m.Anonymous = &b
			}
		default:
			d.unknown(rule, field, k)
		}
	})
	return m
}

func (d *decoder) overrides(n *yaml.Node, rule string, lines lineMap) map[string]ParamSpec {
	out := map[string]ParamSpec{}
	d.mapping(n, rule, "overrides", func(key string, k, v *yaml.Node) {
		field := "overrides[" + redactKey(key) + "]"
		p := ParamSpec{line: k.Line, lines: lineMap{}}
		if !isNull(v) {
			d.mapping(v, rule, field, func(f string, fk, fv *yaml.Node) {
				p.lines.set(f, fk.Line)
				if !d.param(&p, f, fv, rule, field+"."+f) {
					d.unknown(rule, field+"."+f, fk)
				}
			})
		}
		out[key] = p
	})
	return out
}
