package rules

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode/utf16"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// FuzzLoad: the decoder and compiler never panic, refuse with
// *ValidationErrors only, and what they accept is internally consistent.
func FuzzLoad(f *testing.F) {
	for _, s := range []string{specExample, matchRules, replaceRules, "", "{}", "[]", "rules: ~", "rules: [~]",
		`{"rules":[{"id":"a","capacity":1,"refill_rate":"0.5","match":{"endpoint":"^\/x\ud83d\ude00"}}]}`,
		"rules:\n  - &a {id: a, capacity: 1, rate: 1/s}\n  - *a\n",
		"rules:\n  - {id: a, capacity: 1, rate: 1/s, <<: {x: 1}}\n",
		"keys: {k: {tier: t}}\nrules:\n  - {id: a, algorithm: gcra, limit: 3, window: 1d1h1m1s1ms, burst: 7, overrides: {k: {limit: 9}}}\n",
		"regions: [{name: eu, weight: 0.5}, {name: us, weight: 0.25}]\nrules:\n  - {id: a, algorithm: fixed_window, limit: 7, window: 1s, regions: global}\n",
		"regions: [{name: a}, {name: b}, {name: c}]\nrules:\n  - {id: a, capacity: 2, rate: 2/s, regions: global}\n  - {id: b, capacity: 2, rate: 2/s, regions: regional}\n",
		`{"regions":[{"name":"x","weight":"1"}],"rules":[{"id":"a","limit":1,"window":"1s","algorithm":"sliding_window_log","regions":"global"}]}`,
	} {
		f.Add([]byte(s))
	}
	for _, dir := range []string{"testdata/invalid/*.yaml", "../../configs/*.yaml"} {
		files, _ := filepath.Glob(dir)
		for _, file := range files {
			if data, err := os.ReadFile(file); err == nil {
				f.Add(data)
			}
		}
	}
	requests := []Request{
		{},
		{Key: "sk_free_demo", Tier: "free", Tenant: "t", Endpoint: "/v1/search", Method: "GET"},
		{Key: "sk_prod_vip_001", Tier: "pro", Endpoint: "/v1/orders", Method: "POST", Domain: "edge",
			Descriptor: map[string]string{"destination": "payments"}},
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		rs, err := Load(data)
		if err != nil {
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("error without a *ValidationError: %v", err)
			}
			if !strings.HasPrefix(err.Error(), "rules: ") {
				t.Fatalf("error without the rules: prefix: %v", err)
			}
			return
		}
		tags := map[string]bool{}
		for i, r := range rs.Rules() {
			if r.Index != i || rs.Rule(r.ID) != r || !validID(r.ID) {
				t.Fatalf("rule %d inconsistent: %+v", i, r)
			}
			if r.Tag == "" || tags[r.Tag] {
				t.Fatalf("tag %q empty or repeated", r.Tag)
			}
			tags[r.Tag] = true
			for _, p := range append([]Params{r.Params}, overrideParams(r)...) {
				if p.FullDen < 1 || p.Precision < 1 || p.FullNum > maxExact || p.FullDen > maxExact || p.Limit > maxLimit {
					t.Fatalf("rule %s: bad params %+v", r.ID, p)
				}
				if !r.Block && (p.Limit < 1 || (r.Algorithm.Bucket() && p.FullNum < 1) || (!r.Algorithm.Bucket() && p.Window < 1)) {
					t.Fatalf("rule %s: bad params %+v", r.ID, p)
				}
				if p.PolicyWindow(r.Algorithm) < 1 {
					t.Fatalf("rule %s: PolicyWindow < 1", r.ID)
				}
			}
		}
		// The regions: weights sum to at most 1, and every rule's shares
		// sum to its limit split by them, none above its exact part.
		var sum int64
		for _, reg := range rs.Regions() {
			if CheckRegionName(reg.Name) != nil || reg.Weight < 0 {
				t.Fatalf("region %+v accepted", reg)
			}
			sum += reg.Weight
		}
		if sum > WeightScale || (len(rs.Regions()) > 0 && rs.HasRegion("")) {
			t.Fatalf("regions %+v accepted", rs.Regions())
		}
		for _, r := range rs.Rules() {
			if r.Regions != RegionsRegional && r.Regions != RegionsGlobal {
				t.Fatalf("rule %s: regions %q", r.ID, r.Regions)
			}
			var total int64
			for _, reg := range rs.Regions() {
				s := rs.RegionShare(reg.Name, r.Params.Limit)
				if s < 0 || s > r.Params.Limit {
					t.Fatalf("rule %s: share %d of %d in %s", r.ID, s, r.Params.Limit, reg.Name)
				}
				total += s
			}
			if len(rs.Regions()) > 0 && (total > r.Params.Limit || sum == WeightScale && total != r.Params.Limit) {
				t.Fatalf("rule %s: shares sum to %d of %d (weights %d)", r.ID, total, r.Params.Limit, sum)
			}
		}
		var dst []*Rule
		for i := range requests {
			req := requests[i]
			req.Endpoint = rs.Normalize(req.Endpoint)
			dst = rs.Match(&req, dst[:0])
			rs.Identify(req.Key)
			rs.Listed(req.Key)
		}
	})
}

func overrideParams(r *Rule) []Params {
	var out []Params
	for _, p := range r.overrides {
		out = append(out, p)
	}
	for _, p := range r.kidOverrides {
		out = append(out, p)
	}
	return out
}

// globReference builds the regular expression a glob means: '*' is .*,
// everything else literal.
func globReference(pattern string) *regexp.Regexp {
	parts := strings.Split(pattern, "*")
	for i, p := range parts {
		parts[i] = regexp.QuoteMeta(p)
	}
	return regexp.MustCompile(`^(?s:` + strings.Join(parts, ".*") + `)$`)
}

func FuzzGlob(f *testing.F) {
	for _, s := range [][2]string{
		{"sk_free_*", "sk_free_demo"}, {"*", ""}, {"ab*ba", "aba"}, {"a*b*c", "aXbYc"}, {"*a*a*", "a"},
		{"**x**", "x"}, {"a.b*", "aXb"}, {"sk_[*]", "sk_[x]"}, {"é*ü", "éaü"}, {"*ab*ab*", "abab"},
		{"x*x*x", "xx"}, {"*(?i)", "A(?i)"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pattern, s string) {
		if pattern == "" || !utf8.ValidString(pattern) || !utf8.ValidString(s) {
			return
		}
		g, err := compileGlob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := g.match(s), globReference(pattern).MatchString(s); got != want {
			t.Fatalf("glob %q on %q = %v, reference %v", pattern, s, got, want)
		}
		var l globList
		l.add(g)
		if got, want := l.match(s), g.match(s); got != want {
			t.Fatalf("globList %q on %q = %v, glob %v", pattern, s, got, want)
		}
	})
}

// routeReference matches a validated template against a path by splitting
// both on '/'.
func routeReference(template, path string) bool {
	ts, ps := strings.Split(template, "/"), strings.Split(path, "/")
	if len(ts) != len(ps) {
		return false
	}
	for i, seg := range ts {
		if strings.HasPrefix(seg, "{") && strings.HasSuffix(seg, "}") {
			if ps[i] == "" {
				return false
			}
		} else if seg != ps[i] {
			return false
		}
	}
	return true
}

func FuzzNormalize(f *testing.F) {
	for _, s := range [][2]string{
		{"/v1/users/{id}", "/v1/users/42"}, {"/v1/users/{id}", "/v1/users/"}, {"/", "/?x"},
		{"/a/{b}/c", "/a/x/c?q=/a/b/c"}, {"/a//{b}", "/a//x"}, {"/{a}/{b}", "//"}, {"/x", ""},
		{"/v1/orders/{id}/items", "/v1/orders/7/items"}, {"/a/", "/a/"},
	} {
		f.Add(s[0], s[1])
	}
	fixed := []string{"/v1/users/{id}", "/v1/orders/{id}/items", "/"}
	f.Fuzz(func(t *testing.T, template, path string) {
		routes := append([]string{template}, fixed...)
		rs, err := Compile(&Document{Routes: routes})
		if err != nil {
			routes = fixed
			if rs, err = Compile(&Document{Routes: routes}); err != nil {
				t.Fatal(err)
			}
		}
		got := rs.Normalize(path)
		raw, _, _ := strings.Cut(path, "?")
		raw = TrimTrailingSlash(raw)
		want := raw
		for _, r := range routes {
			if strings.HasPrefix(raw, "/") && routeReference(r, raw) {
				want = r
				break
			}
		}
		if got != want {
			t.Fatalf("Normalize(%q) with routes %q = %q, want %q", path, routes, got, want)
		}
	})
}

// quoteJSON encodes s as a JSON string. ascii: the way Python's and PHP's
// encoders do by default, non-ASCII as \u escapes (surrogate pairs beyond
// the BMP) and '/' as `\/`; otherwise only what JSON requires is escaped,
// every other character left raw.
func quoteJSON(s string, ascii bool) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteString(`\` + string(r))
		case ascii && r == '/':
			b.WriteString(`\/`)
		case r < 0x20 || ascii && r >= 0x7f:
			for _, u := range utf16.Encode([]rune{r}) {
				fmt.Fprintf(&b, `\u%04x`, u)
			}
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// FuzzJSONAsYAML: a JSON string decodes through the YAML parser to what
// encoding/json decodes it to, however the encoder escaped it.
func FuzzJSONAsYAML(f *testing.F) {
	for _, s := range []string{"", "a/b", "😀", "caf\u00e9", "\x7f\u0085\u2028\u2029\ufffe\uffff", "\x00\t\n", `\/"`, "\xff", "#: - ? &*!|>'%@`"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		goJSON, _ := json.Marshal(s)
		for _, enc := range []string{string(goJSON), quoteJSON(s, true), quoteJSON(s, false)} {
			doc := []byte("{\"k\":\n\t" + enc + "}")
			var want map[string]string
			if err := json.Unmarshal(doc, &want); err != nil {
				continue // the raw quoting of invalid UTF-8 input
			}
			var got map[string]string
			if err := yaml.Unmarshal(jsonAsYAML(doc), &got); err != nil {
				t.Fatalf("%s: %v", doc, err)
			}
			if got["k"] != want["k"] {
				t.Fatalf("%s: YAML decoded %q, encoding/json %q", doc, got["k"], want["k"])
			}
		}
	})
}
