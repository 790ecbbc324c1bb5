package rules

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

const specExample = `
version: 7
keys:
  sk_prod_acme_1: {tenant: acme, tier: pro}
tiers:
  - {pattern: "sk_free_*", tier: free}
  - {pattern: "sk_prod_*", tier: pro}
  - {pattern: "sk_ent_*",  tier: enterprise}
allowlist: ["sk_internal_*", "sk_monitoring_*"]
blocklist: ["sk_revoked_*"]
routes: ["/v1/users/{id}", "/v1/orders/{id}/items"]
rules:
  - id: free-default
    match: {tier: free}
    algorithm: sliding_window_counter
    limit: 100
    window: 1m
  - id: search
    match: {endpoint: "^/v1/search"}
    algorithm: token_bucket
    capacity: 30
    rate: 30/1m
    by_endpoint: true
  - id: orders
    match: {api_key: "sk_prod_*", endpoint: "^/v1/orders", methods: [POST]}
    algorithm: token_bucket
    capacity: 100
    rate: 100/1m
    cost: 5
    strict: true
    on_failure: closed
    overrides:
      sk_prod_vip_001: {capacity: 1000, rate: 1000/1m}
  - id: new-search-limit
    match: {endpoint: "^/v2/search"}
    algorithm: fixed_window
    limit: 20
    window: 1s
    shadow: true
  - id: tenant-total
    scope: tenant
    match: {tier: pro}
    algorithm: gcra
    limit: 10000
    window: 1m
    burst: 500
  - id: anonymous
    scope: ip
    match: {anonymous: true}
    limit: 60
    window: 1m
    algorithm: sliding_window_log
`

func mustLoad(t testing.TB, src string) *Ruleset {
	t.Helper()
	rs, err := Load([]byte(src))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return rs
}

// summary renders what a ruleset compiled to, for comparing two rulesets.
func summary(rs *Ruleset) string {
	var b strings.Builder
	for _, r := range rs.Rules() {
		p, _ := r.ParamsFor("sk_prod_vip_001", "")
		b.WriteString(strings.Join([]string{r.ID, r.Tag, string(r.Algorithm), string(r.Scope), string(r.OnFailure)}, " "))
		b.WriteString(" " + strings.Join(r.Replaces, ","))
		b.WriteString(" " + jsonString(r.Params) + " " + jsonString(p) + "\n")
	}
	return b.String()
}

func jsonString(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestSpecExample(t *testing.T) {
	t.Parallel()
	rs := mustLoad(t, specExample)
	if rs.Version() != 7 {
		t.Errorf("Version = %d, want 7", rs.Version())
	}
	sum := sha256.Sum256([]byte(specExample))
	if rs.Hash() != hex.EncodeToString(sum[:]) {
		t.Errorf("Hash = %s, want the SHA-256 of the document", rs.Hash())
	}
	if len(rs.Rules()) != 6 {
		t.Fatalf("%d rules, want 6", len(rs.Rules()))
	}
	orders := rs.Rule("orders")
	if orders == nil || orders.Cost != 5 || !orders.Strict || orders.OnFailure != FailClosed || orders.Index != 2 {
		t.Errorf("orders = %+v", orders)
	}
	if r := rs.Rule("anonymous"); r.Scope != ScopeIP || r.Algorithm != SlidingWindowLog {
		t.Errorf("anonymous = %+v", r)
	}
	if r := rs.Rule("search"); !r.ByEndpoint || r.Scope != ScopeKey || r.OnFailure != FailOpen {
		t.Errorf("search = %+v", r)
	}
	if r := rs.Rule("new-search-limit"); !r.Shadow {
		t.Errorf("new-search-limit not shadow")
	}
	if rs.Rule("nope") != nil {
		t.Errorf("Rule(nope) != nil")
	}
}

func TestVersionAndHash(t *testing.T) {
	t.Parallel()
	base := "rules:\n  - {id: a, capacity: 1, rate: 1/s}\n"
	a := mustLoad(t, base)
	b := mustLoad(t, base+"# a comment is a change of content\n")
	c := mustLoad(t, base)
	if a.Version() != 0 {
		t.Errorf("default Version = %d, want 0", a.Version())
	}
	if a.Hash() == b.Hash() || a.Hash() != c.Hash() || len(a.Hash()) != 64 {
		t.Errorf("hashes %s %s %s", a.Hash(), b.Hash(), c.Hash())
	}
}

// TestJSON: JSON is YAML, so the operator API can take JSON bodies, also
// indented with tabs and using JSON-only escapes.
func TestJSON(t *testing.T) {
	t.Parallel()
	doc, err := Parse([]byte(specExample))
	if err != nil {
		t.Fatal(err)
	}
	want := summary(mustCompile(t, doc))
	tests := []struct {
		name string
		body func() []byte
	}{
		{"compact", func() []byte { b, _ := json.Marshal(doc); return b }},
		{"tabs", func() []byte { b, _ := json.MarshalIndent(doc, "", "\t"); return b }},
		{"spaces", func() []byte { b, _ := json.MarshalIndent(doc, "  ", "  "); return b }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rs, err := Load(tt.body())
			if err != nil {
				t.Fatal(err)
			}
			if got := summary(rs); got != want {
				t.Errorf("JSON body compiled to\n%s\nwant\n%s", got, want)
			}
		})
	}
	t.Run("escapes", func(t *testing.T) {
		t.Parallel()
		rs := mustLoad(t, `{"rules":[{"id":"a","match":{"endpoint":"^\/v1\/caf\u00e9\\/\ud83d\ude00\ud800x"},"capacity":1,"refill_rate":0.25}]}`)
		r := rs.Rule("a")
		if !r.match.endpoint.MatchString("/v1/café/😀\uFFFDx") || r.Params.FullNum != 4_000_000 {
			t.Errorf("escaped JSON decoded wrongly: %v %+v", r.match.endpoint, r.Params)
		}
	})
}

func mustCompile(t testing.TB, doc *Document) *Ruleset {
	t.Helper()
	rs, err := Compile(doc)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// TestRoundTrip: a Document marshalled back to YAML or JSON compiles to the
// same ruleset.
func TestRoundTrip(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../../configs/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	want := summary(mustCompile(t, doc))
	for name, marshal := range map[string]func(any) ([]byte, error){"yaml": yaml.Marshal, "json": json.Marshal} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b, err := marshal(doc)
			if err != nil {
				t.Fatal(err)
			}
			rs, err := Load(b)
			if err != nil {
				t.Fatalf("%v\n%s", err, b)
			}
			if got := summary(rs); got != want {
				t.Errorf("round trip compiled to\n%s\nwant\n%s", got, want)
			}
		})
	}
}

func TestCompileInCode(t *testing.T) {
	t.Parallel()
	capacity := int64(10)
	doc := &Document{
		Keys:  map[string]KeySpec{"sk_a": {Tenant: "acme", Tier: "pro"}},
		Rules: []RuleSpec{{ID: "a", ParamSpec: ParamSpec{Capacity: &capacity, Rate: "10/1m"}}},
	}
	a, b := mustCompile(t, doc), mustCompile(t, doc)
	if a.Hash() == "" || a.Hash() != b.Hash() {
		t.Errorf("hash of a Document built in code: %q %q", a.Hash(), b.Hash())
	}
	if _, err := Compile(nil); err == nil {
		t.Error("Compile(nil) succeeded")
	}
	doc.Rules[0].Match.Methods = []string{}
	_, err := Compile(doc)
	var ve *ValidationError
	if !errors.As(err, &ve) || ve.Field != "match.methods" {
		t.Errorf("empty methods in code: %v", err)
	}
}

func TestErrorLines(t *testing.T) {
	t.Parallel()
	src := `rules:
  - id: a
    capacity: 10
    rate: 10/1m

  - id: b
    algorithm: fixed_window
    limit: 0
    window: 1m
    match:
      endpoint: "("
  - id: c
    capacity: 1
    rate: 1/s
    frobnicate: true
`
	_, err := Load([]byte(src))
	if err == nil {
		t.Fatal("Load accepted the ruleset")
	}
	// Parse problems come first; the unknown field stops compilation.
	got := validationErrors(err)
	if len(got) != 1 || got[0].Rule != "c" || got[0].Field != "frobnicate" || got[0].Line != 15 {
		t.Errorf("got %v", err)
	}
	src = strings.Replace(src, "    frobnicate: true\n", "", 1)
	_, err = Load([]byte(src))
	got = validationErrors(err)
	want := []ValidationError{
		{Rule: "b", Field: "match.endpoint", Line: 11},
		{Rule: "b", Field: "limit", Line: 8},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d problems, want %d: %v", len(got), len(want), err)
	}
	for i, w := range want {
		if got[i].Rule != w.Rule || got[i].Field != w.Field || got[i].Line != w.Line {
			t.Errorf("problem %d = %+v, want %+v", i, *got[i], w)
		}
	}
}

// TestErrorsHideKeys: errors about registry entries and overrides show a
// short prefix, never the whole key.
func TestErrorsHideKeys(t *testing.T) {
	t.Parallel()
	const secret = "sk_live_0123456789abcdef"
	tests := map[string]string{
		"registry":          "keys:\n  " + secret + ": {tier: pro, colour: red}\n",
		"override field":    "rules:\n  - {id: a, capacity: 1, rate: 1/s, overrides: {" + secret + ": {limit: 3}}}\n",
		"override value":    "rules:\n  - {id: a, capacity: 1, rate: 1/s, overrides: {" + secret + ": {capacity: 0}}}\n",
		"override dup":      "rules:\n  - id: a\n    capacity: 1\n    rate: 1/s\n    overrides:\n      " + secret + ": {capacity: 2}\n      " + secret + ": {capacity: 3}\n",
		"registry tenant":   "keys:\n  " + secret + ": {tenant: \"\\t\"}\n",
		"override cost":     "rules:\n  - {id: a, capacity: 9, rate: 1/s, cost: 5, overrides: {" + secret + ": {capacity: 2}}}\n",
		"override scope":    "rules:\n  - {id: a, scope: ip, capacity: 9, rate: 1/s, overrides: {" + secret + ": {capacity: 2}}}\n",
		"registry dup":      "keys:\n  " + secret + ": {}\n  " + secret + ": {}\n",
		"override 2^52":     "rules:\n  - {id: a, capacity: 9, rate: 1/s, overrides: {" + secret + ": {capacity: 1000000000000, rate: 1/300d}}}\n",
		"override too long": "rules:\n  - {id: a, capacity: 9, rate: 1/s, overrides: {" + secret + strings.Repeat("x", 300) + ": {capacity: 2}}}\n",
	}
	for name, src := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := Load([]byte(src))
			if err == nil {
				t.Fatal("Load accepted the ruleset")
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("error shows the key: %v", err)
			}
			if name != "override scope" && !strings.Contains(err.Error(), "sk_live_01…") {
				t.Errorf("error does not name the key by its prefix: %v", err)
			}
		})
	}
}

func TestNullAndEmpty(t *testing.T) {
	t.Parallel()
	rs := mustLoad(t, `
version: ~
keys:
  sk_a:
tiers: []
rules:
  - id: a
    match:
    capacity: 3
    rate: 3/s
    limit: ~
`)
	r := rs.Rule("a")
	if !r.match.unconditional() || !r.match.matches(&Request{IP: clientIP}) || !r.match.matches(&Request{Key: "k"}) {
		t.Error("null match does not match everything")
	}
	if info, ok := rs.Identify("sk_a"); !ok || info != (KeyInfo{}) {
		t.Errorf("Identify(sk_a) = %v %v", info, ok)
	}
}

func TestManyProblemsBounded(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	b.WriteString("rules:\n")
	for range 200 {
		b.WriteString("  - {id: a, capacity: 0, rate: 0/s}\n")
	}
	_, err := Load([]byte(b.String()))
	if n := len(validationErrors(err)); n == 0 || n > maxErrors {
		t.Errorf("%d problems reported", n)
	}
}

// TestNullNeverWidens: a null where a value is required is refused, never
// dropped (dropping a list entry or a selector would widen a rule).
func TestNullNeverWidens(t *testing.T) {
	t.Parallel()
	tests := map[string]string{
		"unknown top field":   "colour: ~\n",
		"unknown rule field":  "rules:\n  - {id: a, capacity: 1, rate: 1/s, limt: ~}\n",
		"unknown match field": "rules:\n  - {id: a, capacity: 1, rate: 1/s, match: {tierr: ~}}\n",
		"descriptor value":    "rules:\n  - {id: a, capacity: 1, rate: 1/s, match: {descriptor: {k: ~}}}\n",
		"methods entry":       "rules:\n  - {id: a, capacity: 1, rate: 1/s, match: {methods: [GET, ~]}}\n",
		"blocklist entry":     "blocklist: [~]\n",
		"replaces entry":      "rules:\n  - {id: a, capacity: 1, rate: 1/s, replaces: [~]}\n",
		"tiers entry":         "tiers: [~]\n",
		"override":            "rules:\n  - {id: a, capacity: 1, rate: 1/s, overrides: {k: ~}}\n",
	}
	for name, src := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if _, err := Load([]byte(src)); err == nil {
				t.Error("Load accepted the ruleset")
			}
		})
	}
}

// TestSectionFieldsRefuseUnknown: the keys, tiers and regions sections
// name an unknown field by its path and decode the known ones.
func TestSectionFieldsRefuseUnknown(t *testing.T) {
	t.Parallel()
	rule := "rules:\n  - {id: a, capacity: 1, rate: 1/s}\n"
	for _, tc := range []struct {
		name, src, field string
	}{
		{"keys", "keys:\n  sk_live_abcdef: {tenant: acme, colour: red}\n", "keys[sk_live…].colour"},
		{"tiers", "tiers: [{pattern: 'sk_*', tier: gold, colour: red}]\n", "tiers[0].colour"},
		{"regions", "regions: [{name: eu, weight: 0.5, colour: red}, {name: us, weight: 0.5}]\n", "regions[0].colour"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Load([]byte(tc.src + rule))
			ves := validationErrors(err)
			if len(ves) != 1 || ves[0].Field != tc.field || ves[0].Msg != "unknown field" || ves[0].Line == 0 {
				t.Fatalf("Load: %v, want one unknown field %s", err, tc.field)
			}
			if _, err := Load([]byte(strings.ReplaceAll(tc.src, ", colour: red", "") + rule)); err != nil {
				t.Errorf("without the unknown field: %v", err)
			}
		})
	}
}

// TestScalarTextRefusals: a string field and a number field refuse a
// boolean, each saying what it wants.
func TestScalarTextRefusals(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, src, want string
	}{
		{"string", "rules:\n  - {id: true, capacity: 1, rate: 1/s}\n", "must be a string, not"},
		{"number", "regions: [{name: eu, weight: true}]\nrules:\n  - {id: a, capacity: 1, rate: 1/s}\n", "must be a number, not"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Load([]byte(tc.src))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Load: %v, want %q", err, tc.want)
			}
		})
	}
}
