package rules

import (
	"strings"
	"testing"
)

// TestCleanPathSpellings: the spellings of one resource collapse to one
// endpoint.
func TestCleanPathSpellings(t *testing.T) {
	t.Parallel()
	rs := mustLoad(t, "routes: ['/v1/users/{id}']\n")
	groups := []struct {
		endpoint string
		paths    []string
	}{
		{"/v1/search", []string{
			"/v1/search", "//v1/search", "/v1/search/", "/v1/./search", "/v1/x/../search", "/v1/%73earch",
			"/v1//search", "///v1///search//", "/v1/search?q=1", "/v1/%73%65%61%72%63%68", "/%76%31/search",
			"/v1/search/.", "/v1/a/b/../../search", "/v1/x//../../search", "/v1/%2e/search", "/v1/x/%2E%2E/search",
			"/./v1/search", "/v1/search/./", "/v1/search/x/..",
		}},
		{"/v1/users/{id}", []string{"/v1/users/42", "/v1/users/42/", "//v1/users//42", "/v1/users/%34%32", "/v1/./users/42"}},
		{"/", []string{"/", "//", "/.", "/./", "/a/..", "/a/../", "///", "/?x=1", "//.."}},
		{"/a%20b", []string{"/a%20b", "/a b", "/a%20b/"}},
		{"/caf%C3%A9", []string{"/caf%C3%A9", "/caf%c3%a9", "/café", "/caf%C3%a9/"}},
		{"/a!$&'()*+,;=:@[]-._~", []string{"/a!$&'()*+,;=:@[]-._~", "/a%21$&'()*+,;=:@[]%2D%2E%5F%7E"[:0] + "/a!$&'()*+,;=:@[]%2D%2E%5F%7E"}},
		{"/%21", []string{"/%21"}}, // an escaped reserved character is not the character
		{"/a/%25", []string{"/a/%25", "/a/%25/"}},
		{"/a/%252e", []string{"/a/%252e", "/a/%252e/"}}, // decoded once, never twice
		{"/a/%252E", []string{"/a/%252E"}},
		{"/...", []string{"/...", "/a/../...", "/%2E%2E%2E"}},
		{"/.well-known/x", []string{"/.well-known/x", "/%2Ewell-known/x"}},
		{"", []string{"", "?q=1"}},
	}
	for _, g := range groups {
		for _, p := range g.paths {
			t.Run(p, func(t *testing.T) {
				t.Parallel()
				clean, ok := CleanPath(p)
				if !ok {
					t.Fatalf("CleanPath(%q) refused", p)
				}
				if got := rs.Normalize(clean); got != g.endpoint {
					t.Errorf("endpoint of %q = %q (clean %q), want %q", p, got, clean, g.endpoint)
				}
			})
		}
	}
}

// TestCleanPathForwarded: the path a proxy forwards is the normal one, with
// its trailing slash.
func TestCleanPathForwarded(t *testing.T) {
	t.Parallel()
	tests := map[string]string{
		"//v1/search":        "/v1/search",
		"/v1/search/":        "/v1/search/",
		"/v1//search//":      "/v1/search/",
		"/v1/./search":       "/v1/search",
		"/v1/x/../search/.":  "/v1/search/",
		"/v1/%73earch?q=%41": "/v1/search",
		"/v1/search":         "/v1/search",
	}
	for in, want := range tests {
		if got, ok := CleanPath(in); !ok || got != want {
			t.Errorf("CleanPath(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
}

// TestCleanPathRefused: paths answered 400 INVALID_PATH.
func TestCleanPathRefused(t *testing.T) {
	t.Parallel()
	for _, p := range []string{
		"/..", "/../x", "/a/../..", "/a/../../b", "/%2e%2e", "/%2E%2E/x", "/./..", "/a/./../..",
		"/a%2Fb", "/a%2fb", "/a%5Cb", "/a%5cb", "/a%00b", "/%2F", "/x/%2f..",
		"/a\\b", "/a\x00b", "/a\nb", "/a\x7fb", "/a\tb",
		"/a%", "/a%4", "/a%zz", "/a%G0",
		"v1/search", "*", "search",
	} {
		if got, ok := CleanPath(p); ok {
			t.Errorf("CleanPath(%q) = %q, accepted", p, got)
		}
	}
}

// TestCleanPathNoAllocation: a normal path costs no allocation.
func TestCleanPathNoAllocation(t *testing.T) {
	for _, p := range []string{"/v1/search", "/v1/users/42?x=1", "/a%20b/", "/caf%C3%A9", "/", "/.well-known/x", "/..."} {
		if clean, ok := CleanPath(p); !ok || !strings.HasPrefix(p, clean) {
			t.Fatalf("CleanPath(%q) = %q, %v: not normal", p, clean, ok)
		}
		if n := testing.AllocsPerRun(100, func() { CleanPath(p) }); n != 0 {
			t.Errorf("CleanPath(%q) allocates %v times", p, n)
		}
	}
}

func FuzzCleanPath(f *testing.F) {
	for _, s := range []string{
		"/v1/search", "//v1/search", "/v1/search/", "/v1/./search", "/v1/x/../search", "/v1/%73earch",
		"/..", "/a%2Fb", "/a b", "/café", "/%2e%2e/", "/a/%252e%252e/", "/.//..//a", "/a?b", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		clean, ok := CleanPath(p)
		if !ok {
			return
		}
		again, ok2 := CleanPath(clean)
		if !ok2 || again != clean {
			t.Fatalf("not idempotent: CleanPath(%q) = %q, then %q (%v)", p, clean, again, ok2)
		}
		if clean == "" {
			if q, _, _ := strings.Cut(p, "?"); q != "" {
				t.Fatalf("CleanPath(%q) = \"\"", p)
			}
			return
		}
		if clean[0] != '/' {
			t.Fatalf("CleanPath(%q) = %q: not absolute", p, clean)
		}
		for _, bad := range []string{"//", "/./", "/../", "?", "\\"} {
			if strings.Contains(clean, bad) {
				t.Fatalf("CleanPath(%q) = %q holds %q", p, clean, bad)
			}
		}
		if strings.HasSuffix(clean, "/.") || strings.HasSuffix(clean, "/..") {
			t.Fatalf("CleanPath(%q) = %q ends in a dot segment", p, clean)
		}
		upper := strings.ToUpper(clean)
		for _, bad := range []string{"%2F", "%5C", "%00"} {
			if strings.Contains(upper, bad) {
				t.Fatalf("CleanPath(%q) = %q holds %s", p, clean, bad)
			}
		}
		for i := 0; i < len(clean); i++ {
			c := clean[i]
			if c != '/' && c != '%' && !pathRaw[c] {
				t.Fatalf("CleanPath(%q) = %q holds raw byte %#x", p, clean, c)
			}
		}
		if e := TrimTrailingSlash(clean); e != "/" && strings.HasSuffix(e, "/") {
			t.Fatalf("endpoint of %q ends in /", p)
		}
	})
}

// TestRouteTemplateMustBeNormal: a template that no normal endpoint could
// match is refused.
func TestRouteTemplateMustBeNormal(t *testing.T) {
	t.Parallel()
	for _, tmpl := range []string{"/a/", "/a//b", "/a/./b", "/a/../b", "/%61", "/a%2fb", "/a b"} {
		if _, err := Load([]byte("routes: ['" + tmpl + "']\n")); err == nil {
			t.Errorf("template %q accepted", tmpl)
		}
	}
	for _, tmpl := range []string{"/", "/a/{id}", "/a%20b/{x}", "/.well-known/{x}"} {
		if _, err := Load([]byte("routes: ['" + tmpl + "']\n")); err != nil {
			t.Errorf("template %q refused: %v", tmpl, err)
		}
	}
}
