package doccheck

import (
	"fmt"
	"github.com/tollgate/tollgate/internal/testnet"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// parseDir parses the non-test Go files of dir (a slash path under fsys).
func parseDir(fsys fs.FS, dir string) ([]*ast.File, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := fs.ReadFile(fsys, path.Join(dir, name))
		if err != nil {
			return nil, err
		}
		f, err := parser.ParseFile(fset, path.Join(dir, name), src, parser.SkipObjectResolution)
		if err != nil {
			return nil, fmt.Errorf("parse %s/%s: %w", dir, name, err)
		}
		files = append(files, f)
	}
	return files, nil
}

// stringLit returns the value of e when it is a string literal.
func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

// route is one endpoint a server serves.
type route struct {
	Method string // GET, POST, …; "" for any method
	Path   string // a ServeMux pattern's path: {name} wildcards, a trailing / for a subtree
	Where  string // the package it is registered in
}

func (r route) String() string {
	if r.Method == "" {
		return "any method " + r.Path
	}
	return r.Method + " " + r.Path
}

// serverTrees hold the servers' packages: every ServeMux pattern given as
// a literal to Handle or HandleFunc in them is a route.
var serverTrees = []string{"gateway", "aggregator"}

// pathPackages serve their paths without a ServeMux (the check API is
// served by fasthttp and a switch on the path); their literal paths are
// the routes, any method (the handlers answer 405 themselves).
var pathPackages = []string{"gateway/internal/checkapi"}

// ignoredRoutes are registered patterns that are not endpoints, with why.
var ignoredRoutes = map[string]string{
	"/admin/": "the 404 NOT_FOUND of unknown operator API routes",
}

// checkAPIPath matches the check API's paths.
var checkAPIPath = regexp.MustCompile(`^/v1/[a-z]+(/[a-z]+)*$`)

// serverRoutes reads the routes of the gateway and the aggregator from
// their source.
func serverRoutes(fsys fs.FS) ([]route, error) {
	var out []route
	var dirs []string
	for _, tree := range serverTrees {
		err := fs.WalkDir(fsys, tree, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") {
					return fs.SkipDir
				}
				dirs = append(dirs, p)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	for _, dir := range dirs {
		files, err := parseDir(fsys, dir)
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok || len(call.Args) < 2 {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok || (sel.Sel.Name != "HandleFunc" && sel.Sel.Name != "Handle") {
					return true
				}
				pattern, ok := stringLit(call.Args[0])
				if !ok {
					return true
				}
				if _, skip := ignoredRoutes[pattern]; skip {
					return true
				}
				r := route{Path: pattern, Where: dir}
				if m, p, found := strings.Cut(pattern, " "); found {
					r.Method, r.Path = m, strings.TrimSpace(p)
				}
				out = append(out, r)
				return true
			})
		}
	}
	for _, dir := range pathPackages {
		files, err := parseDir(fsys, dir)
		if err != nil {
			return nil, err
		}
		seen := map[string]bool{}
		for _, f := range files {
			ast.Inspect(f, func(n ast.Node) bool {
				if lit, ok := n.(*ast.BasicLit); ok {
					if s, ok := stringLit(lit); ok && checkAPIPath.MatchString(s) && !seen[s] {
						seen[s] = true
						out = append(out, route{Path: s, Where: dir})
					}
				}
				return true
			})
		}
	}
	return out, nil
}

// flagDef is one flag of a command.
type flagDef struct {
	Name  string
	Usage string
}

// command is one command (a main package, or a subcommand with its own
// flag set) and its flags.
type command struct {
	Name  string // the flag set's name: "gateway", "loadtest storm", …
	Dir   string // its main package
	Flags []flagDef
}

// flagFuncs maps the flag package's (and FlagSet's) definers to the index
// of their name argument.
var flagFuncs = map[string]int{
	"Bool": 0, "BoolVar": 1, "BoolFunc": 0, "Duration": 0, "DurationVar": 1, "Float64": 0, "Float64Var": 1,
	"Func": 0, "Int": 0, "IntVar": 1, "Int64": 0, "Int64Var": 1, "String": 0, "StringVar": 1,
	"TextVar": 1, "Uint": 0, "UintVar": 1, "Uint64": 0, "Uint64Var": 1, "Var": 1,
}

// repoFiles calls fn with the path and the content of each file of fsys
// that keep accepts, passing over test data, vendored, built or installed
// files (bin, node_modules), and hidden and _ directories, as the go tool
// does.
func repoFiles(fsys fs.FS, keep func(p string) bool, fn func(p string, b []byte) error) error {
	return fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if p != "." && (name == "testdata" || name == "vendor" || name == "bin" || name == "node_modules" ||
				strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return fs.SkipDir
			}
			return nil
		}
		if !keep(p) {
			return nil
		}
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		return fn(p, b)
	})
}

// goSource says whether p is a non-test Go file.
func goSource(p string) bool {
	return strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go")
}

// mainPackages lists the directories of fsys holding a main package.
func mainPackages(fsys fs.FS) ([]string, error) {
	var dirs []string
	err := repoFiles(fsys, goSource, func(p string, src []byte) error {
		f, err := parser.ParseFile(token.NewFileSet(), p, src, parser.PackageClauseOnly)
		if err == nil && f.Name.Name == "main" && !slices.Contains(dirs, path.Dir(p)) {
			dirs = append(dirs, path.Dir(p))
		}
		return nil
	})
	slices.Sort(dirs)
	return dirs, err
}

// commands reads every command's flags from its source: the flag package's
// global set (named after the package's directory) and every
// flag.NewFlagSet with a literal name.
func commands(fsys fs.FS) ([]command, error) {
	dirs, err := mainPackages(fsys)
	if err != nil {
		return nil, err
	}
	var out []command
	for _, dir := range dirs {
		files, err := parseDir(fsys, dir)
		if err != nil {
			return nil, err
		}
		byName := map[string]*command{}
		get := func(name string) *command {
			if c, ok := byName[name]; ok {
				return c
			}
			c := &command{Name: name, Dir: dir}
			byName[name] = c
			return c
		}
		for _, f := range files {
			for _, decl := range f.Decls {
				fn, ok := decl.(*ast.FuncDecl)
				if !ok || fn.Body == nil {
					continue
				}
				sets := map[string]string{} // variable → flag set name, in this function
				ast.Inspect(fn.Body, func(n ast.Node) bool {
					switch n := n.(type) {
					case *ast.AssignStmt:
						if len(n.Lhs) == 1 && len(n.Rhs) == 1 {
							if id, ok := n.Lhs[0].(*ast.Ident); ok {
								if call, ok := n.Rhs[0].(*ast.CallExpr); ok && isSelector(call.Fun, "flag", "NewFlagSet") && len(call.Args) > 0 {
									if name, ok := stringLit(call.Args[0]); ok {
										sets[id.Name] = name
									}
								}
							}
						}
					case *ast.CallExpr:
						sel, ok := n.Fun.(*ast.SelectorExpr)
						if !ok {
							return true
						}
						idx, ok := flagFuncs[sel.Sel.Name]
						if !ok || len(n.Args) <= idx {
							return true
						}
						recv, ok := sel.X.(*ast.Ident)
						if !ok {
							return true
						}
						var set string
						switch {
						case recv.Name == "flag":
							set = path.Base(dir)
						case sets[recv.Name] != "":
							set = sets[recv.Name]
						default:
							return true
						}
						name, ok := stringLit(n.Args[idx])
						if !ok {
							return true
						}
						usage := ""
						if len(n.Args) > idx+1 {
							usage = concatLit(n.Args[len(n.Args)-1])
						}
						c := get(set)
						c.Flags = append(c.Flags, flagDef{Name: name, Usage: usage})
					}
					return true
				})
				for _, name := range sets {
					get(name) // a flag set without flags is a command too
				}
			}
		}
		if len(byName) == 0 {
			get(path.Base(dir)) // a command without flags
		}
		for _, name := range slices.Sorted(mapKeys(byName)) {
			out = append(out, *byName[name])
		}
	}
	return out, nil
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func isSelector(e ast.Expr, pkg, name string) bool {
	sel, ok := e.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != name {
		return false
	}
	id, ok := sel.X.(*ast.Ident)
	return ok && id.Name == pkg
}

// concatLit returns the text of a string literal or a + of string
// literals, with other operands as "…".
func concatLit(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.BasicLit:
		s, _ := stringLit(e)
		return s
	case *ast.BinaryExpr:
		if e.Op == token.ADD {
			return concatLit(e.X) + concatLit(e.Y)
		}
	}
	return "…"
}

// TestSourceScanFindsRoutesAndFlags guards the scanners against silently
// finding nothing (a renamed mux variable, a flag set built another way).
func TestSourceScanFindsRoutesAndFlags(t *testing.T) {
	t.Parallel()
	fsys := os.DirFS(testnet.ModuleRoot(t))
	routes, err := serverRoutes(fsys)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range routes {
		got = append(got, r.String())
	}
	for _, want := range []string{"GET /readyz", "PUT /admin/v1/rules", "GET /v1/usage/tenants/{tenant}", "any method /v1/check/batch", "any method /v1/authz"} {
		if !slices.Contains(got, want) {
			t.Errorf("routes %v lack %s", got, want)
		}
	}
	cmds, err := commands(fsys)
	if err != nil {
		t.Fatal(err)
	}
	flags := map[string][]string{}
	for _, c := range cmds {
		for _, f := range c.Flags {
			flags[c.Name] = append(flags[c.Name], f.Name)
		}
	}
	for cmd, want := range map[string]string{"gateway": "example-config", "aggregator audit": "snapshot", "loadtest": "target", "loadtest storm": "polite-key", "scenario": "scenario", "evalbench": "goroutines"} {
		if !slices.Contains(flags[cmd], want) {
			t.Errorf("command %q: flags %v lack %s", cmd, flags[cmd], want)
		}
	}
	if _, ok := flags["tollgate-stack"]; ok {
		t.Errorf("tollgate-stack defines flags %v: document them", flags["tollgate-stack"])
	}
}
