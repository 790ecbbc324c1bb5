package rules

import (
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

const exampleConfig = "../../configs/rules.yaml"

// fieldNames returns the YAML names of a Document type's fields, from its
// struct tags (inline structs included): the decoder accepts exactly these,
// as TestFieldNamesDecoded checks.
func fieldNames(typ reflect.Type) []string {
	var names []string
	for f := range typ.Fields() {
		tag := f.Tag.Get("yaml")
		if tag == "" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if opts == "inline" {
			names = append(names, fieldNames(f.Type)...)
			continue
		}
		names = append(names, name)
	}
	return names
}

// mappingKeys returns the keys of a YAML mapping node.
func mappingKeys(n *yaml.Node) []string {
	var keys []string
	for i := 0; i+1 < len(n.Content); i += 2 {
		keys = append(keys, n.Content[i].Value)
	}
	return keys
}

func mappingValue(n *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// TestExampleConfig: configs/rules.yaml compiles and uses every field of
// the format, every algorithm, scope and failure mode, so it can never rot.
func TestExampleConfig(t *testing.T) {
	t.Parallel()
	rs, data := loadExample(t)
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		t.Fatal(err)
	}
	top := root.Content[0]
	used := map[string]map[string]bool{"top": {}, "rule": {}, "match": {}, "keys": {}, "tiers": {}, "overrides": {}}
	mark := func(kind string, n *yaml.Node) {
		for _, k := range mappingKeys(n) {
			used[kind][k] = true
		}
	}
	mark("top", top)
	keys := mappingValue(top, "keys")
	for i := 1; i < len(keys.Content); i += 2 {
		mark("keys", keys.Content[i])
	}
	for _, entry := range mappingValue(top, "tiers").Content {
		mark("tiers", entry)
	}
	for _, rule := range mappingValue(top, "rules").Content {
		mark("rule", rule)
		if m := mappingValue(rule, "match"); m != nil {
			mark("match", m)
		}
	}
	want := map[string][]string{
		"top":   fieldNames(reflect.TypeFor[Document]()),
		"rule":  fieldNames(reflect.TypeFor[RuleSpec]()),
		"match": fieldNames(reflect.TypeFor[MatchSpec]()),
		"keys":  fieldNames(reflect.TypeFor[KeySpec]()),
		"tiers": fieldNames(reflect.TypeFor[TierSpec]()),
	}
	for kind, names := range want {
		if len(names) < 2 {
			t.Fatalf("%s: found only fields %v", kind, names)
		}
		for _, name := range names {
			if !used[kind][name] {
				t.Errorf("%s never uses the %s field %q", exampleConfig, kind, name)
			}
		}
	}

	seen := map[string]bool{}
	for _, r := range rs.Rules() {
		seen[string(r.Algorithm)] = true
		seen[string(r.Scope)] = true
		seen[string(r.OnFailure)] = true
		if len(r.match.methods)+len(r.match.descriptor) > 0 && r.match.anon != anonAny {
			t.Errorf("rule %s mixes selectors oddly", r.ID)
		}
	}
	for _, v := range []string{"token_bucket", "sliding_window_log", "sliding_window_counter", "fixed_window", "gcra",
		"key", "tenant", "ip", "global", "open", "closed"} {
		if !seen[v] {
			t.Errorf("%s never uses %q", exampleConfig, v)
		}
	}

	// A catch-all and an anonymous per-IP rule.
	if !slices.ContainsFunc(rs.Rules(), func(r *Rule) bool { return r.match.unconditional() && !r.Shadow && !r.Block }) {
		t.Error("no enforced catch-all rule (empty match)")
	}
	if !slices.ContainsFunc(rs.Rules(), func(r *Rule) bool { return r.match.anon == anonOnly && r.Scope == ScopeIP }) {
		t.Error("no anonymous per-IP rule")
	}
}

// loadExample loads the example rules file; it returns the ruleset and
// the file's bytes.
func loadExample(t *testing.T) (*Ruleset, []byte) {
	t.Helper()
	data, err := os.ReadFile(exampleConfig)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := Load(data)
	if err != nil {
		t.Fatalf("%s: %v", exampleConfig, err)
	}
	return rs, data
}

// TestExampleConfigDemoKeys: the README's demo keys behave as documented.
func TestExampleConfigDemoKeys(t *testing.T) {
	t.Parallel()
	rs, _ := loadExample(t)
	info, registered := rs.Identify("sk_free_demo")
	if !registered || info.Tier != "free" {
		t.Errorf("sk_free_demo: %+v %v", info, registered)
	}
	req := &Request{Key: "sk_free_demo", Tier: info.Tier, Tenant: info.Tenant, Endpoint: rs.Normalize("/v1/users/42"), Method: "GET"}
	var smallest int64 = -1
	for _, r := range rs.Match(req, nil) {
		if r.Shadow {
			continue
		}
		if smallest < 0 || r.Params.Limit < smallest {
			smallest = r.Params.Limit
		}
	}
	if smallest != 5 {
		t.Errorf("sk_free_demo's smallest limit is %d, want 5 (6 quick requests end in 429)", smallest)
	}
	if info, registered := rs.Identify("sk_prod_acme_1"); !registered || info != (KeyInfo{Tenant: "acme", Tier: "pro"}) {
		t.Errorf("sk_prod_acme_1: %+v %v", info, registered)
	}
}

// TestFieldNamesDecoded: every name in the struct tags is a field the
// decoder accepts, so TestExampleConfig's list and the decoder agree.
func TestFieldNamesDecoded(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		names []string
		doc   func(name string) string
	}{
		"top":   {fieldNames(reflect.TypeFor[Document]()), func(n string) string { return n + ": ~\n" }},
		"rule":  {fieldNames(reflect.TypeFor[RuleSpec]()), func(n string) string { return "rules:\n  - {" + n + ": ~}\n" }},
		"match": {fieldNames(reflect.TypeFor[MatchSpec]()), func(n string) string { return "rules:\n  - {match: {" + n + ": ~}}\n" }},
		"keys":  {fieldNames(reflect.TypeFor[KeySpec]()), func(n string) string { return "keys: {k: {" + n + ": ~}}\n" }},
		"tiers": {fieldNames(reflect.TypeFor[TierSpec]()), func(n string) string { return "tiers: [{" + n + ": ~}]\n" }},
		"overrides": {fieldNames(reflect.TypeFor[ParamSpec]()), func(n string) string {
			return "rules:\n  - {overrides: {k: {" + n + ": ~}}}\n"
		}},
	}
	for kind, tt := range tests {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			for _, name := range tt.names {
				if _, err := Parse([]byte(tt.doc(name))); err != nil {
					t.Errorf("field %q refused: %v", name, err)
				}
			}
			if _, err := Parse([]byte(tt.doc("no_such_field"))); err == nil {
				t.Error("unknown field accepted")
			}
		})
	}
}
