package rules

import (
	"errors"
	"regexp"
	"strings"
	"testing"
)

// probePaths are normalised endpoints of every shape: the root, short and
// long paths, every printable ASCII character a path may hold.
var probePaths = []string{
	"/", "/a", "/A", "/0", "/_", "/-", "/.", "/~", "/v1", "/v1/users/42", "/v1/users/{id}", "/%20x", "/%E2%82%AC",
	"/a:b@c", "/!$&'()*+,;=", "/x/y/z/" + strings.Repeat("q", 300), "/\\", "/\"<>^`{|}",
}

func TestRegexpMatchesEveryPath(t *testing.T) {
	t.Parallel()
	tests := []struct {
		expr string
		want bool
	}{
		{".*", true},
		{"", true},
		{"^", true},
		{"^/", true},
		{"/", true},
		{"$", true},
		{`\z`, true},
		{"^.*$", true},
		{"^/.*$", true},
		{"^/.*", true},
		{"(?s).*", true},
		{".", true},
		{".+", true},
		{"^.+$", true},
		{`^\S*$`, true},
		{`^[\s\S]*$`, true},
		{"(?i)^/", true},
		{"^(/.*)?$", true},
		{"^/?", true},
		{"^/[a-z]*", true},
		{"x*", true},
		{`\B`, true},
		{"(?m)^", true},
		{"^/v1|.*", true},
		{"^/{1,3}", true},
		{"^(?:/.*){2}$", false}, // needs a second '/' — "/" has none
		{"^/v1", false},
		{"^/.+", false},
		{"^/$", false},
		{"^/[a-z]*$", false},
		{`\b`, false},
		{"v", false},
		{"^/v1/.*$", false},
		{"^$", false},
		{"^/.{2}", false},
		{"[^/]", false}, // "/" has no other character
		{"(", false},    // does not compile
		{"^/[^\n]*$", true},
		{"^/[a-zA-Z0-9/]*$", false},
	}
	for _, tt := range tests {
		t.Run(tt.expr, func(t *testing.T) {
			t.Parallel()
			if got := RegexpMatchesEveryPath(tt.expr); got != tt.want {
				t.Errorf("RegexpMatchesEveryPath(%q) = %v, want %v", tt.expr, got, tt.want)
			}
			if tt.want {
				checkEveryProbe(t, tt.expr)
			}
		})
	}
}

// checkEveryProbe fails unless expr matches every probe path: what
// RegexpMatchesEveryPath claims.
func checkEveryProbe(t *testing.T, expr string) {
	t.Helper()
	re := regexp.MustCompile(expr)
	for _, p := range probePaths {
		if !re.MatchString(p) {
			t.Fatalf("%q is said to match every path but does not match %q", expr, p)
		}
	}
}

// FuzzRegexpMatchesEveryPath: the analysis is sound — whatever it says
// matches every path matches every probe path — and never panics.
func FuzzRegexpMatchesEveryPath(f *testing.F) {
	for _, s := range []string{".*", "^/", "$", "^/.*$", "^/v1", "(a|/)+", "^(/|x)*$", `\b`, "^.{0,3}$", "[^a]", "(?i)/", "^/?.?"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, expr string) {
		if len(expr) > 200 {
			return
		}
		if _, err := regexp.Compile(expr); err != nil {
			if RegexpMatchesEveryPath(expr) {
				t.Fatalf("%q does not compile but is said to match every path", expr)
			}
			return
		}
		if RegexpMatchesEveryPath(expr) {
			checkEveryProbe(t, expr)
		}
	})
}

func TestTotalBlock(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		doc   string
		field string // the refusal's field; "" when accepted without warnings
	}{
		{"blocklist star", `blocklist: ["**"]`, "blocklist[0]"},
		{"blocklist prefix", `blocklist: ["sk_*"]`, ""},
		{"empty match", "rules:\n  - {id: b, match: {}, block: true}", "match"},
		{"dot star", "rules:\n  - {id: b, match: {endpoint: \".*\"}, block: true}", "match.endpoint"},
		{"some paths", "rules:\n  - {id: b, match: {endpoint: \"^/v0/\"}, block: true}", ""},
		{"every key", "rules:\n  - {id: b, match: {api_key: \"*\", endpoint: \"^/\"}, block: true}", "match.endpoint"},
		{"some keys", "rules:\n  - {id: b, match: {api_key: \"sk_old_*\"}, block: true}", ""},
		{"anonymous only", "rules:\n  - {id: b, match: {anonymous: true}, block: true}", ""},
		{"one method", "rules:\n  - {id: b, match: {methods: [DELETE]}, block: true}", ""},
		{"one tier", "rules:\n  - {id: b, match: {tier: free}, block: true}", ""},
		{"shadow", "rules:\n  - {id: b, block: true, shadow: true}", ""},
		{"allowlist lets some through", "allowlist: [\"sk_internal_*\"]\nrules:\n  - {id: b, block: true}", ""},
		{"replaced for some requests", "rules:\n  - {id: b, block: true}\n  - {id: health, match: {endpoint: \"^/health$\"}, replaces: [b], capacity: 5, rate: 5/s}", ""},
		{"limit 0 block on everything", "rules:\n  - {id: b, algorithm: fixed_window, limit: 0, window: 1m, block: true}", "match"},
		{"limit 0 without block", "rules:\n  - {id: b, algorithm: fixed_window, limit: 0, window: 1m}", "limit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rs, err := Load([]byte(tt.doc))
			if tt.field == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if len(rs.Warnings()) != 0 {
					t.Fatalf("warnings %v, want none", rs.Warnings())
				}
				return
			}
			var ve *ValidationError
			if !errors.As(err, &ve) || ve.Field != tt.field || !strings.Contains(ve.Msg, "would refuse every request") {
				t.Fatalf("got %v, want a refusal naming field %q and saying it would refuse every request", err, tt.field)
			}
			if tt.field == "limit" {
				return // limit 0 without block: not a total block, never allowed
			}
			// The same with allow_total_block: accepted, with the same
			// problem as a warning.
			rs, err = Load([]byte("allow_total_block: true\n" + tt.doc))
			if err != nil {
				t.Fatalf("with allow_total_block: %v", err)
			}
			w := rs.Warnings()
			if len(w) != 1 || w[0].Field != ve.Field || w[0].Rule != ve.Rule || w[0].Msg != ve.Msg || w[0].Line != ve.Line+1 {
				t.Fatalf("warnings %+v, want one like %+v (one line lower)", w, *ve)
			}
		})
	}
}

// TestAllowTotalBlockRoundTrip: the field survives encoding a Document and
// parsing it back, in YAML and JSON.
func TestAllowTotalBlockRoundTrip(t *testing.T) {
	t.Parallel()
	for _, src := range []string{"allow_total_block: true\nblocklist: [\"*\"]\n", `{"allow_total_block": true, "blocklist": ["*"]}`} {
		doc, err := Parse([]byte(src))
		if err != nil {
			t.Fatal(err)
		}
		if !doc.AllowTotalBlock {
			t.Fatalf("%s: AllowTotalBlock not decoded", src)
		}
		rs, err := Compile(doc)
		if err != nil || len(rs.Warnings()) != 1 {
			t.Fatalf("%s: %v, warnings %v", src, err, rs.Warnings())
		}
	}
	if _, err := Load([]byte("allow_total_block: yes please\n")); err == nil {
		t.Fatal("a non-boolean allow_total_block was accepted")
	}
}
