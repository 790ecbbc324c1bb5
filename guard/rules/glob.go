package rules

import (
	"fmt"
	"strings"
)

// glob is a compiled key pattern: '*' matches any run of bytes, including
// none; every other byte is literal. Matching never allocates and runs in
// O(len(pattern) × len(s)) at worst (strings.Index per literal part), with
// no backtracking.
type glob struct {
	pattern string
	exact   bool     // no '*': plain equality
	prefix  string   // literal before the first '*'
	suffix  string   // literal after the last '*'
	middle  []string // non-empty literals between stars, in order
}

func compileGlob(pattern string) (glob, error) {
	if pattern == "" {
		return glob{}, fmt.Errorf("empty pattern")
	}
	g := glob{pattern: pattern}
	parts := strings.Split(pattern, "*")
	if len(parts) == 1 {
		g.exact = true
		return g, nil
	}
	g.prefix, g.suffix = parts[0], parts[len(parts)-1]
	for _, p := range parts[1 : len(parts)-1] {
		if p != "" {
			g.middle = append(g.middle, p)
		}
	}
	return g, nil
}

// match reports whether s matches the whole pattern. The literal parts
// between stars are taken leftmost-first: for patterns whose only
// metacharacter is '*' that choice never loses a match.
func (g *glob) match(s string) bool {
	if g.exact {
		return s == g.pattern
	}
	if len(s) < len(g.prefix)+len(g.suffix) ||
		!strings.HasPrefix(s, g.prefix) || !strings.HasSuffix(s, g.suffix) {
		return false
	}
	s = s[len(g.prefix) : len(s)-len(g.suffix)]
	for _, m := range g.middle {
		i := strings.Index(s, m)
		if i < 0 {
			return false
		}
		s = s[i+len(m):]
	}
	return true
}

// globList is an allowlist or blocklist: exact entries in a set, patterns
// in file order.
type globList struct {
	exact    map[string]struct{}
	patterns []glob
}

func (l *globList) add(g glob) {
	if g.exact {
		if l.exact == nil {
			l.exact = make(map[string]struct{})
		}
		l.exact[g.pattern] = struct{}{}
		return
	}
	l.patterns = append(l.patterns, g)
}

func (l *globList) match(s string) bool {
	if _, ok := l.exact[s]; ok {
		return true
	}
	for i := range l.patterns {
		if l.patterns[i].match(s) {
			return true
		}
	}
	return false
}

// tierPattern is one entry of `tiers`: keys matching the glob get the tier.
type tierPattern struct {
	glob glob
	tier string
}

// route is a compiled endpoint template such as "/v1/users/{id}". Each
// `{name}` segment matches exactly one non-empty path segment; every other
// segment is literal.
type route struct {
	template string
	slashes  int        // number of '/' in the template (= in a matching path)
	segs     []routeSeg // segments after the leading '/'
}

type routeSeg struct {
	lit   string
	param bool
}

func compileRoute(t string) (route, error) {
	if t == "" || t[0] != '/' {
		return route{}, fmt.Errorf("template %q must start with '/'", t)
	}
	if strings.ContainsAny(t, "?#") {
		return route{}, fmt.Errorf("template %q must not contain '?' or '#'", t)
	}
	r := route{template: t, slashes: strings.Count(t, "/")}
	seen := map[string]bool{}
	for _, s := range strings.Split(t[1:], "/") {
		if strings.HasPrefix(s, "{") && strings.HasSuffix(s, "}") && len(s) >= 2 {
			name := s[1 : len(s)-1]
			if !validParamName(name) {
				return route{}, fmt.Errorf("template %q: invalid parameter %q (want {name} with letters, digits and _)", t, s)
			}
			if seen[name] {
				return route{}, fmt.Errorf("template %q: parameter {%s} appears twice", t, name)
			}
			seen[name] = true
			r.segs = append(r.segs, routeSeg{param: true})
			continue
		}
		if strings.ContainsAny(s, "{}") {
			return route{}, fmt.Errorf("template %q: segment %q must be a literal or a whole {name}", t, s)
		}
		r.segs = append(r.segs, routeSeg{lit: s})
	}
	// A template matches normal endpoints only (CleanPath, then no
	// trailing slash): one that is not normal itself would never match.
	probe := make([]string, len(r.segs))
	for i, s := range r.segs {
		probe[i] = s.lit
		if s.param {
			probe[i] = "x"
		}
	}
	p := "/" + strings.Join(probe, "/")
	if clean, ok := CleanPath(p); !ok || TrimTrailingSlash(clean) != p {
		return route{}, fmt.Errorf("template %q never matches: endpoints are normalised (no empty, \".\" or \"..\" segments, no trailing slash, unreserved characters not percent-encoded, other escapes in upper case)", t)
	}
	return r, nil
}

func validParamName(s string) bool {
	return validToken(s, 64, func(c byte) bool { return c == '_' || isAlnum(c) })
}

// match reports whether path (starting with '/', without query string, with
// as many '/' as the template) matches the template segment by segment.
func (r *route) match(path string) bool {
	rest := path[1:]
	for i := range r.segs {
		seg := rest
		if j := strings.IndexByte(rest, '/'); j >= 0 {
			seg, rest = rest[:j], rest[j+1:]
		} else {
			rest = ""
		}
		s := &r.segs[i]
		if s.param {
			if seg == "" {
				return false
			}
		} else if seg != s.lit {
			return false
		}
	}
	return true
}
