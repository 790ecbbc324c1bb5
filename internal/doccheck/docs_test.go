package doccheck

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/internal/testnet"
	_ "github.com/tollgate/tollgate/schemas/tollgatev1" // registers the messages
)

// docFile is one Markdown file of the documentation.
type docFile struct {
	Path  string   // slash path from the module root
	Lines []string // its lines
}

// docFiles reads the documentation: README.md, everything under docs/, and
// every README.md of the repository.
func docFiles(fsys fs.FS) ([]docFile, error) {
	var out []docFile
	doc := func(p string) bool {
		return strings.HasSuffix(p, ".md") && (path.Base(p) == "README.md" || strings.HasPrefix(p, "docs/"))
	}
	err := repoFiles(fsys, doc, func(p string, b []byte) error {
		out = append(out, docFile{Path: p, Lines: strings.Split(string(b), "\n")})
		return nil
	})
	return out, err
}

func readDocs(t *testing.T) (fs.FS, []docFile) {
	t.Helper()
	fsys := os.DirFS(testnet.ModuleRoot(t))
	docs, err := docFiles(fsys)
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) < 10 {
		t.Fatalf("found only %d documentation files", len(docs))
	}
	return fsys, docs
}

func findDoc(t *testing.T, docs []docFile, p string) docFile {
	t.Helper()
	for _, d := range docs {
		if d.Path == p {
			return d
		}
	}
	t.Fatalf("%s not found", p)
	return docFile{}
}

// variableRef matches a TOLLGATE_* name in the docs; a trailing _* (or _)
// makes it a family: TOLLGATE_PENALTY_*.
var variableRef = regexp.MustCompile(`TOLLGATE_[A-Z0-9_]*[A-Z0-9](_\*|_)?`)

// TestDocumentedVariablesExist: every TOLLGATE_* variable the docs name is
// one a binary reads (the registry) or a tool reads (configs.Tools); a
// family (TOLLGATE_PENALTY_*) names at least one.
func TestDocumentedVariablesExist(t *testing.T) {
	t.Parallel()
	_, docs := readDocs(t)
	known := configs.Registry()
	for _, tool := range configs.Tools() {
		known = append(known, tool.Name)
	}
	for _, d := range docs {
		for i, line := range d.Lines {
			for _, m := range variableRef.FindAllString(line, -1) {
				if prefix, family := strings.CutSuffix(m, "*"); family || strings.HasSuffix(m, "_") {
					if !slices.ContainsFunc(known, func(k string) bool { return strings.HasPrefix(k, prefix) }) {
						t.Errorf("%s:%d: %s names no variable", d.Path, i+1, m)
					}
					continue
				}
				if !configs.Accepted(m, known) {
					t.Errorf("%s:%d: %s is not a variable any binary or tool reads (configs.Registry, configs.Tools)", d.Path, i+1, m)
				}
			}
		}
	}
}

// endpointRef matches a Tollgate endpoint in the docs, with its method when
// one precedes it. Other paths (an upstream's /v1/users/42) are examples,
// and so is a match inside a file path (aggregator/internal/adminapi):
// see endpointRefs.
var endpointRef = regexp.MustCompile(`(?:\b(GET|PUT|POST|DELETE|PATCH|HEAD) )?(/(?:v1/(?:check|report|authz|usage)|admin|metrics|healthz|readyz|debug/pprof)[A-Za-z0-9_{}./:-]*)`)

// endpointRefs returns endpointRef's matches in line, but for those whose
// path follows a letter or an underscore: a file path such as
// aggregator/internal/adminapi, not a URL (whose path follows a host or a
// port).
func endpointRefs(line string) [][]string {
	var out [][]string
	for _, ix := range endpointRef.FindAllStringSubmatchIndex(line, -1) {
		if at := ix[4]; at > 0 {
			if c := line[at-1]; c == '_' || (c|0x20 >= 'a' && c|0x20 <= 'z') {
				continue
			}
		}
		m := make([]string, len(ix)/2)
		for i := range m {
			if ix[2*i] >= 0 {
				m[i] = line[ix[2*i]:ix[2*i+1]]
			}
		}
		out = append(out, m)
	}
	return out
}

// matchRoute reports whether the documented path p is served by r.
func matchRoute(r route, p string) bool {
	if r.Path == p {
		return true
	}
	rs, ps := strings.Split(r.Path, "/"), strings.Split(p, "/")
	if len(rs) != len(ps) {
		return false
	}
	for i := range rs {
		if strings.HasPrefix(rs[i], "{") && strings.HasSuffix(rs[i], "}") && ps[i] != "" {
			continue
		}
		if rs[i] != ps[i] {
			return false
		}
	}
	return true
}

// TestDocumentedEndpointsServed: every Tollgate endpoint the docs name (a
// path under /v1/check, /v1/report, /v1/authz, /v1/usage, /admin, /metrics,
// /healthz, /readyz, /debug/pprof) is served, with that method when one is
// given. A path ending in / is a namespace and must prefix a route.
func TestDocumentedEndpointsServed(t *testing.T) {
	t.Parallel()
	fsys, docs := readDocs(t)
	routes, err := serverRoutes(fsys)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		for i, line := range d.Lines {
			for _, m := range endpointRefs(line) {
				method, p := m[1], strings.TrimRight(m[2], ".:,")
				p, _, _ = strings.Cut(p, "?")
				ok := slices.ContainsFunc(routes, func(r route) bool {
					if ns := strings.TrimSuffix(p, "/") + "/"; strings.HasPrefix(r.Path, ns) && (strings.HasSuffix(p, "/") || !matchRoute(r, p)) {
						return true // a namespace: /admin/v1/ or /admin/v1
					}
					return matchRoute(r, p) && (method == "" || r.Method == "" || r.Method == method)
				})
				if !ok {
					t.Errorf("%s:%d: %s is not served by the gateway or the aggregator", d.Path, i+1, strings.TrimSpace(m[0]))
				}
			}
		}
	}
}

// TestEndpointsDocumented: every route the gateway and the aggregator
// serve is in docs/reference/endpoints.md, as `METHOD /path` (or, for a
// route that takes any method, `/path`).
func TestEndpointsDocumented(t *testing.T) {
	t.Parallel()
	fsys, docs := readDocs(t)
	routes, err := serverRoutes(fsys)
	if err != nil {
		t.Fatal(err)
	}
	page := strings.Join(findDoc(t, docs, "docs/reference/endpoints.md").Lines, "\n")
	for _, r := range routes {
		want := "`" + r.Method + " " + r.Path + "`"
		found := strings.Contains(page, want)
		if r.Method == "" {
			want = "`" + r.Path + "` or `METHOD " + r.Path + "`"
			found = regexp.MustCompile("`([A-Z]+ )?" + regexp.QuoteMeta(r.Path) + "`").MatchString(page)
		}
		if !found {
			t.Errorf("%s (%s) is not in docs/reference/endpoints.md as %s", r, r.Where, want)
		}
	}
}

// commandSections reads docs/reference/commands.md: per command (its
// section's first code span, without bin/), the flags its table lists.
func commandSections(d docFile) map[string][]string {
	out := map[string][]string{}
	cur := ""
	for _, line := range d.Lines {
		if rest, ok := strings.CutPrefix(line, "## "); ok {
			cur = ""
			if _, after, ok := strings.Cut(rest, "`"); ok {
				name, _, _ := strings.Cut(after, "`")
				cur = strings.TrimPrefix(name, "bin/")
				out[cur] = nil
			}
			continue
		}
		if cur == "" || !strings.HasPrefix(line, "| `-") {
			continue
		}
		cell, _, _ := strings.Cut(strings.TrimPrefix(line, "| `"), "`")
		name, _, _ := strings.Cut(strings.TrimLeft(cell, "-"), " ")
		out[cur] = append(out[cur], name)
	}
	return out
}

// TestCommandsDocumented: docs/reference/commands.md has a section per
// command listing exactly the flags its flag set defines.
func TestCommandsDocumented(t *testing.T) {
	t.Parallel()
	fsys, docs := readDocs(t)
	cmds, err := commands(fsys)
	if err != nil {
		t.Fatal(err)
	}
	sections := commandSections(findDoc(t, docs, "docs/reference/commands.md"))
	for _, c := range cmds {
		listed, ok := sections[c.Name]
		if !ok {
			t.Errorf("command %q (%s) has no section in docs/reference/commands.md", c.Name, c.Dir)
			continue
		}
		var defined []string
		for _, f := range c.Flags {
			defined = append(defined, f.Name)
			if !slices.Contains(listed, f.Name) {
				t.Errorf("command %q: flag -%s is not in docs/reference/commands.md", c.Name, f.Name)
			}
		}
		for _, name := range listed {
			if !slices.Contains(defined, name) {
				t.Errorf("command %q: docs/reference/commands.md lists -%s, which it does not define", c.Name, name)
			}
		}
	}
	for name := range sections {
		if !slices.ContainsFunc(cmds, func(c command) bool { return c.Name == name }) {
			t.Errorf("docs/reference/commands.md has a section for %q, which is no command", name)
		}
	}
}

// invocation finds a command in a line of the docs; the flags after it
// belong to that command.
type invocation struct {
	re      *regexp.Regexp
	command string
}

// invocations are tried in order; the first that matches at a position
// wins (longer names first).
var invocations = []invocation{
	{regexp.MustCompile(`bin/aggregator\s+audit\b`), "aggregator audit"},
	{regexp.MustCompile(`\bbin/aggregator\b`), "aggregator"},
	{regexp.MustCompile(`\bbin/gateway\b`), "gateway"},
	{regexp.MustCompile(`\bbin/tollgate-stack\b`), "tollgate-stack"},
	{regexp.MustCompile(`(?:^|[\s(` + "`" + `$])(?:bin/)?loadtest\s+storm\b`), "loadtest storm"},
	{regexp.MustCompile(`(?:(?:^|[\s(` + "`" + `$])(?:bin/)?loadtest\s+sweep\b|SWEEPFLAGS=)`), "loadtest sweep"},
	{regexp.MustCompile(`(?:^|[\s(` + "`" + `$])(?:bin/)?loadtest\s+-`), "loadtest"},
	{regexp.MustCompile(`(?:\bbin/scenario\b|loadtest/cmd/scenario\b)`), "scenario"},
	{regexp.MustCompile(`(?:\bbin/sidebyside\b|loadtest/cmd/sidebyside\b|scripts/sidebyside\.sh|SIDEBYSIDEFLAGS=)`), "sidebyside"},
	{regexp.MustCompile(`(?:\bbin/evalbench\b|loadtest/cmd/evalbench\b|EVALBENCHFLAGS=)`), "evalbench"},
	{regexp.MustCompile(`docs/examples/usage-consumer\b`), "usage-consumer"},
	{regexp.MustCompile(`SCENARIOFLAGS=`), "scenario"},
}

// flagToken matches a flag among a command line's words.
var flagToken = regexp.MustCompile(`^--?([a-z][a-z0-9-]*)(=.*)?$`)

// commandFlags returns, for one logical line (continuations joined), the
// flags used after each command it invokes.
func commandFlags(line string) map[string][]string {
	out := map[string][]string{}
	var taken [][2]int // spans already matched by a longer invocation
	for _, inv := range invocations {
		for _, loc := range inv.re.FindAllStringIndex(line, -1) {
			if slices.ContainsFunc(taken, func(s [2]int) bool { return loc[0] < s[1] && s[0] < loc[1] }) {
				continue
			}
			taken = append(taken, [2]int{loc[0], loc[1]})
			cmd := inv.command
			if cmd == "scenario" && strings.Contains(line, "SCENARIO=storm") && strings.HasPrefix(line[loc[0]:], "SCENARIOFLAGS") {
				cmd = "loadtest storm"
			}
			if cmd == "loadtest" && strings.HasSuffix(strings.TrimSpace(line[:loc[0]+1]), "make") {
				continue
			}
			rest := line[loc[1]:]
			if cmd == "loadtest" {
				rest = line[loc[1]-1:] // the pattern ate the flag's dash
			}
			if strings.HasSuffix(line[loc[0]:loc[1]], "FLAGS=") {
				rest = strings.TrimLeft(rest, `'"`) // a make variable's quoted flags
			}
			// The command line ends at the end of a code span or a quoted
			// flags variable, or at a shell separator.
			if i := strings.IndexAny(rest, "`'\""); i >= 0 {
				rest = rest[:i]
			}
			for _, w := range strings.Fields(rest) {
				if w == "|" || w == "||" || w == "&&" || w == ";" || strings.HasPrefix(w, "#") || w == ">" || w == "2>&1" {
					break
				}
				w = strings.TrimLeft(w, "[(")
				w = strings.TrimRight(w, "])")
				if m := flagToken.FindStringSubmatch(w); m != nil {
					out[cmd] = append(out[cmd], m[1])
				}
			}
		}
	}
	return out
}

// logicalLines joins lines ending in a backslash with the next.
func logicalLines(lines []string) []struct {
	n    int
	text string
} {
	var out []struct {
		n    int
		text string
	}
	for i := 0; i < len(lines); i++ {
		start, text := i, lines[i]
		for strings.HasSuffix(strings.TrimRight(text, " "), `\`) && i+1 < len(lines) {
			i++
			text = strings.TrimSuffix(strings.TrimRight(text, " "), `\`) + " " + lines[i]
		}
		out = append(out, struct {
			n    int
			text string
		}{start + 1, text})
	}
	return out
}

// TestDocumentedFlagsExist: every flag a command line in the docs gives a
// Tollgate command is one that command defines.
func TestDocumentedFlagsExist(t *testing.T) {
	t.Parallel()
	fsys, docs := readDocs(t)
	cmds, err := commands(fsys)
	if err != nil {
		t.Fatal(err)
	}
	defined := map[string][]string{}
	for _, c := range cmds {
		defined[c.Name] = []string{"h", "help"}
		for _, f := range c.Flags {
			defined[c.Name] = append(defined[c.Name], f.Name)
		}
	}
	checked := 0
	for _, d := range docs {
		for _, l := range logicalLines(d.Lines) {
			for cmd, flags := range commandFlags(l.text) {
				for _, f := range flags {
					checked++
					if !slices.Contains(defined[cmd], f) {
						t.Errorf("%s:%d: %s has no flag -%s", d.Path, l.n, cmd, f)
					}
				}
			}
		}
	}
	if checked < 20 {
		t.Errorf("only %d flags found on command lines: the scanner is broken", checked)
	}
}

// TestCommandLineScanner runs commandFlags on lines like the docs'.
func TestCommandLineScanner(t *testing.T) {
	t.Parallel()
	tests := []struct {
		line string
		want map[string][]string
	}{
		{"bin/gateway --config gw.yaml", map[string][]string{"gateway": {"config"}}},
		{"`bin/aggregator audit --snapshot DIR [--key KEY]` reads", map[string][]string{"aggregator audit": {"snapshot", "key"}}},
		{"loadtest -target proxy -keys 1 | tee out # -nope", map[string][]string{"loadtest": {"target", "keys"}}},
		{"bin/loadtest storm -pid \"$(pgrep -n x)\" -redis \"$R\"", map[string][]string{"loadtest storm": {"pid"}}},
		{"make loadtest SCENARIO=zipf SCENARIOFLAGS='-duration 20s'", map[string][]string{"scenario": {"duration"}}},
		{"make loadtest SCENARIO=storm SCENARIOFLAGS='-hold 10s'", map[string][]string{"loadtest storm": {"hold"}}},
		{"scripts/sidebyside.sh -rounds 5 -duration 10s", map[string][]string{"sidebyside": {"rounds", "duration"}}},
		{"make sweep SWEEPFLAGS='-what redis -keys 1k'", map[string][]string{"loadtest sweep": {"what", "keys"}}},
		{"bin/loadtest sweep -point 2s", map[string][]string{"loadtest sweep": {"point"}}},
		{"loadtest competes with the gateway it measures", map[string][]string{}},
		{"see loadtest/README.md -x", map[string][]string{}},
	}
	for _, tt := range tests {
		got := commandFlags(tt.line)
		if fmt.Sprint(got) != fmt.Sprint(tt.want) {
			t.Errorf("%q: got %v, want %v", tt.line, got, tt.want)
		}
	}
}

// TestEventsPageListsEveryField: docs/reference/events.md has a section per
// message of the tollgate.v1 package, with a row for every field (number
// and name).
func TestEventsPageListsEveryField(t *testing.T) {
	t.Parallel()
	_, docs := readDocs(t)
	page := findDoc(t, docs, "docs/reference/events.md")
	sections := map[string]string{}
	cur := ""
	for _, line := range page.Lines {
		if rest, ok := strings.CutPrefix(line, "### "); ok {
			cur, _, _ = strings.Cut(rest, " ")
			continue
		}
		if cur != "" {
			sections[cur] += line + "\n"
		}
	}
	messages := 0
	protoregistry.GlobalFiles.RangeFilesByPackage("tollgate.v1", func(fd protoreflect.FileDescriptor) bool {
		for i := range fd.Messages().Len() {
			m := fd.Messages().Get(i)
			messages++
			body, ok := sections[string(m.Name())]
			if !ok {
				t.Errorf("message %s has no section (### %s) in docs/reference/events.md", m.Name(), m.Name())
				continue
			}
			for j := range m.Fields().Len() {
				f := m.Fields().Get(j)
				row := fmt.Sprintf("| %d | `%s` |", f.Number(), f.Name())
				if !strings.Contains(body, row) {
					t.Errorf("%s.%s: no row %q in docs/reference/events.md", m.Name(), f.Name(), row)
				}
			}
		}
		return true
	})
	if messages < 5 {
		t.Errorf("found %d messages in package tollgate.v1", messages)
	}
}

// markdownLink matches [text](target) outside code spans.
var markdownLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// slug is GitHub's anchor of a heading: lower case, punctuation dropped
// (letters, digits, spaces, hyphens and underscores kept), spaces as
// hyphens.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns the anchors of a Markdown file's headings, numbered as
// GitHub numbers repeats.
func anchors(lines []string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	for _, line := range lines {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced || !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.TrimSpace(strings.TrimLeft(line, "#"))
		s := slug(text)
		if n := seen[s]; n > 0 {
			out[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

// TestDocLinksResolve: every relative link in the docs leads to a file or
// directory of the repository, and every anchor to a heading.
func TestDocLinksResolve(t *testing.T) {
	t.Parallel()
	fsys, docs := readDocs(t)
	cache := map[string]map[string]bool{}
	anchorsOf := func(p string) (map[string]bool, error) {
		if a, ok := cache[p]; ok {
			return a, nil
		}
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return nil, err
		}
		a := anchors(strings.Split(string(b), "\n"))
		cache[p] = a
		return a, nil
	}
	for _, d := range docs {
		fenced := false
		for i, line := range d.Lines {
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				fenced = !fenced
			}
			if fenced {
				continue
			}
			for _, m := range markdownLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, anchor, _ := strings.Cut(target, "#")
				p := d.Path
				if file != "" {
					p = path.Clean(path.Join(path.Dir(d.Path), file))
					if _, err := fs.Stat(fsys, p); err != nil {
						t.Errorf("%s:%d: link %s: %s does not exist", d.Path, i+1, target, p)
						continue
					}
				}
				if anchor == "" || !strings.HasSuffix(p, ".md") {
					continue
				}
				a, err := anchorsOf(p)
				if err != nil {
					t.Errorf("%s:%d: %v", d.Path, i+1, err)
					continue
				}
				if !a[anchor] {
					t.Errorf("%s:%d: link %s: %s has no heading #%s", d.Path, i+1, target, p, anchor)
				}
			}
		}
	}
}

// nameRef matches a tollgate_* name in the docs: a metric, a KV bucket, a
// consumer group. A trailing _* (or _) makes it a family.
var nameRef = regexp.MustCompile(`tollgate_[a-z0-9_]*[a-z0-9](_\*|_)?`)

// sourceNames returns the string literals of the repository's non-test Go
// code that start with tollgate_ or tollgate-.
func sourceNames(fsys fs.FS) (map[string]bool, error) {
	names := map[string]bool{}
	lit := regexp.MustCompile(`"(tollgate[_-][a-z0-9_.-]*)"`)
	err := repoFiles(fsys, goSource, func(_ string, src []byte) error {
		for _, m := range lit.FindAllStringSubmatch(string(src), -1) {
			names[m[1]] = true
		}
		return nil
	})
	return names, err
}

// TestDocumentedNamesExist: every tollgate_* name the docs give (metrics,
// KV buckets) is one the code uses; a family (tollgate_events_*) names at
// least one.
func TestDocumentedNamesExist(t *testing.T) {
	t.Parallel()
	fsys, docs := readDocs(t)
	names, err := sourceNames(fsys)
	if err != nil {
		t.Fatal(err)
	}
	if !names["tollgate_checks_total"] || !names["tollgate_rules"] {
		t.Fatalf("the source scan found %d names, not tollgate_checks_total and tollgate_rules", len(names))
	}
	for _, d := range docs {
		for i, line := range d.Lines {
			for _, m := range nameRef.FindAllString(line, -1) {
				if prefix, family := strings.CutSuffix(m, "*"); family || strings.HasSuffix(m, "_") {
					if !slices.ContainsFunc(slices.Collect(mapKeys(names)), func(n string) bool { return strings.HasPrefix(n, prefix) }) {
						t.Errorf("%s:%d: %s names nothing the code uses", d.Path, i+1, m)
					}
					continue
				}
				if !names[m] {
					t.Errorf("%s:%d: %s is not a name the code uses (a metric, a bucket)", d.Path, i+1, m)
				}
			}
		}
	}
}

// TestEndpointRefs: URLs and bare paths are endpoints; a file path that
// contains one is not.
func TestEndpointRefs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		line string
		want []string
	}{
		{"curl http://127.0.0.1:8081/admin/v1/rules", []string{"/admin/v1/rules"}},
		{"`GET /readyz` answers", []string{"GET /readyz"}},
		{"see aggregator/internal/adminapi and /metrics", []string{"/metrics"}},
		{"guard/internal_metrics/x", nil},
		{"(/healthz)", []string{"/healthz"}},
	} {
		var got []string
		for _, m := range endpointRefs(tc.line) {
			got = append(got, m[0])
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("endpointRefs(%q) = %q, want %q", tc.line, got, tc.want)
		}
	}
}
