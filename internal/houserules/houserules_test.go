package houserules

import (
	"fmt"
	"github.com/tollgate/tollgate/internal/testnet"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// bannedPackageNames are names that say nothing about what a package provides.
var bannedPackageNames = map[string]bool{
	"util": true, "utils": true, "common": true, "helpers": true, "helper": true, "misc": true,
}

// sleepAllowlist names test files (slash paths from the module root) that may
// call time.Sleep, each with the reason. Keep it empty: poll with a deadline.
var sleepAllowlist = map[string]string{}

// docAllowlist names package directories (slash paths from the module root)
// that may lack a package comment for now, each with the reason. An entry
// whose package has gained its comment, or no longer exists, fails the test,
// so the list only shrinks.
var docAllowlist = map[string]string{}

// maxFuncLines is the longest a function or method outside tests and
// generated code may be, from its func line to its closing brace: a
// function over a screen is a room without walls.
const maxFuncLines = 150

// longFuncAllowlist names functions longer than maxFuncLines ("dir/file.go:Name",
// slash paths from the module root; methods by their name alone), each with
// the reason. An entry whose function has become short enough, or no longer
// exists, fails the test, so the list only shrinks.
var longFuncAllowlist = map[string]string{}

// importRules say which parts of the module a part may not import in
// non-test code, so that imports only run down the floors: the guard
// library stands alone, and the data plane (gateway) and the control plane
// (aggregator) meet only through schemas and the library. Tests may import
// more (the guard's tests start real servers through compose). Paths are
// module-relative; a rule on "a" covers everything below a/.
var importRules = []struct {
	from string
	deny []string
	why  string
}{
	{"guard", []string{"compose", "loadtest", "aggregator", "gateway"},
		"the guard library must build without the servers, starters and tools; put a tool that uses both under loadtest/cmd"},
	{"schemas", []string{"compose", "loadtest", "aggregator", "gateway", "guard", "configs"},
		"the wire contracts depend on nothing of Tollgate's"},
	{"gateway", []string{"aggregator", "loadtest"},
		"the data plane reaches the control plane only through schemas and the fleet KV; cross-process tests live in compose/pipeline"},
	{"aggregator", []string{"gateway", "loadtest"},
		"the control plane reaches the data plane only through schemas and the fleet KV; cross-process tests live in compose/pipeline"},
	{"compose/internal/lifecycle", []string{"compose/redisserver", "compose/natsserver", "compose/kafkabroker"},
		"the starters' one lifecycle knows none of them: each starter builds its own API on it"},
}

// globalLoggerFuncs are the package-level functions of log/slog and log that
// use or change the process-wide default logger.
var globalLoggerFuncs = map[string]map[string]bool{
	"log/slog": set("Debug", "DebugContext", "Info", "InfoContext", "Warn", "WarnContext",
		"Error", "ErrorContext", "Log", "LogAttrs", "Default", "SetDefault", "With", "SetLogLoggerLevel"),
	"log": set("Print", "Printf", "Println", "Fatal", "Fatalf", "Fatalln", "Panic", "Panicf",
		"Panicln", "Default", "SetOutput", "SetFlags", "SetPrefix", "Output", "Writer"),
}

func set(names ...string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

// Rule names, as they appear in violations.
const (
	ruleName    = "package-name"
	ruleSleep   = "no-sleep-in-tests"
	ruleLogger  = "no-global-logger"
	ruleDoc     = "package-comment"
	ruleParsing = "parse"
	ruleLength  = "function-length"
	ruleImport  = "import-direction"
	ruleDefault = "cmp-or-default"
)

// violation is one broken rule at a position ("dir/file.go:line" or "dir").
type violation struct {
	Rule string
	Pos  string
	Msg  string
}

func (v violation) String() string { return fmt.Sprintf("%s: [%s] %s", v.Pos, v.Rule, v.Msg) }

// applyFileAllowlist fails the test for each violation in a file (the
// part of its Pos before ":") that allowlist, called name, does not name,
// and for each entry no violation needed, saying its file now stale (what
// changed: "holds no citation") or is gone.
func applyFileAllowlist(t *testing.T, violations []violation, name string, allowlist map[string]string, stale string) {
	t.Helper()
	used := map[string]bool{}
	for _, v := range violations {
		file, _, _ := strings.Cut(v.Pos, ":")
		if _, ok := allowlist[file]; ok {
			used[file] = true
			continue
		}
		t.Error(v)
	}
	for file, why := range allowlist {
		if !used[file] {
			t.Errorf("%s names %s (%s), which %s or is gone: remove the entry", name, file, why, stale)
		}
	}
}

// goFile is one parsed file of a package directory.
type goFile struct {
	path string // slash path from the root
	test bool
	gen  bool // "Code generated ... DO NOT EDIT."
	ast  *ast.File
}

// check applies the house rules to every package directory in fsys and
// returns the violations and the number of package directories checked.
func check(fsys fs.FS) ([]violation, int, error) {
	dirs, err := goFilesByDir(fsys)
	if err != nil {
		return nil, 0, err
	}
	module, err := modulePath(fsys)
	if err != nil {
		return nil, 0, err
	}

	var out []violation
	keys := make([]string, 0, len(dirs))
	for dir := range dirs {
		keys = append(keys, dir)
	}
	slices.Sort(keys)
	for _, dir := range keys {
		fset := token.NewFileSet()
		var files []goFile
		for _, p := range dirs[dir] {
			src, err := fs.ReadFile(fsys, p)
			if err != nil {
				return nil, 0, err
			}
			f, err := parser.ParseFile(fset, p, src, parser.ParseComments|parser.SkipObjectResolution)
			if err != nil {
				out = append(out, violation{ruleParsing, p, err.Error()})
				continue
			}
			files = append(files, goFile{path: p, test: strings.HasSuffix(p, "_test.go"), gen: ast.IsGenerated(f), ast: f})
		}
		out = append(out, checkPackage(fset, dir, files)...)
		out = append(out, checkImports(fset, module, dir, files)...)
	}
	return out, len(keys), nil
}

// goFilesByDir returns the .go files of fsys (slash paths) by directory,
// leaving out what the house rules do not check: directories named
// testdata, vendor or node_modules, or starting with "." or "_", and
// nested modules.
func goFilesByDir(fsys fs.FS) (map[string][]string, error) {
	dirs := map[string][]string{} // dir → .go files
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p == "." {
				return nil
			}
			name := d.Name()
			if name == "testdata" || name == "vendor" || name == "node_modules" ||
				strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
				return fs.SkipDir
			}
			if _, err := fs.Stat(fsys, path.Join(p, "go.mod")); err == nil {
				return fs.SkipDir // a nested module has its own rules
			}
			return nil
		}
		if strings.HasSuffix(p, ".go") && d.Type().IsRegular() {
			dir := path.Dir(p)
			dirs[dir] = append(dirs[dir], p)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("walk: %w", err)
	}
	return dirs, nil
}

// checkPackage applies the rules to the files of one directory.
func checkPackage(fset *token.FileSet, dir string, files []goFile) []violation {
	var out []violation
	if len(files) == 0 {
		return nil
	}
	// Package names: the directory and every package clause.
	if base := path.Base(dir); bannedPackageNames[base] {
		out = append(out, violation{ruleName, dir, fmt.Sprintf("directory %q: name the package for what it provides", base)})
	}
	names := map[string]bool{}
	for _, f := range files {
		names[strings.TrimSuffix(f.ast.Name.Name, "_test")] = true
	}
	for name := range names {
		if bannedPackageNames[name] && name != path.Base(dir) {
			out = append(out, violation{ruleName, dir, fmt.Sprintf("package %q: name the package for what it provides", name)})
		}
	}

	// Package comment: on a non-test file, or on a test file if there is no other.
	var nonTest, documented bool
	isMain := false
	for _, f := range files {
		if !f.test {
			nonTest = true
			if f.ast.Name.Name == "main" {
				isMain = true
			}
		}
	}
	for _, f := range files {
		if f.test == !nonTest && f.ast.Doc != nil && strings.TrimSpace(f.ast.Doc.Text()) != "" {
			documented = true
		}
	}
	if !documented {
		name := strings.TrimSuffix(files[0].ast.Name.Name, "_test")
		for _, f := range files {
			if !f.test {
				name = f.ast.Name.Name
				break
			}
		}
		out = append(out, violation{ruleDoc, dir, fmt.Sprintf(
			"package %s has no package comment: add a doc.go starting \"// Package %s ...\" (or \"// Command ...\" for a main package)", name, name)})
	}

	for _, f := range files {
		if f.gen {
			continue
		}
		if !f.test {
			out = append(out, longFuncs(fset, f)...)
			out = append(out, zeroDefaults(fset, f)...)
		}
		imports := importNames(f.ast)
		ast.Inspect(f.ast, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			id, ok := sel.X.(*ast.Ident)
			if !ok {
				return true
			}
			pkg := imports[id.Name]
			pos := fset.Position(sel.Pos())
			at := fmt.Sprintf("%s:%d", f.path, pos.Line)
			switch {
			case f.test && pkg == "time" && sel.Sel.Name == "Sleep":
				if _, ok := sleepAllowlist[f.path]; !ok {
					out = append(out, violation{ruleSleep, at,
						"time.Sleep in a test: poll with a deadline (internal/testwait.Eventually)"})
				}
			case !f.test && !isMain && globalLoggerFuncs[pkg][sel.Sel.Name]:
				out = append(out, violation{ruleLogger, at, fmt.Sprintf(
					"%s.%s uses the global logger in a library package: take a *slog.Logger (nil: discard)",
					path.Base(pkg), sel.Sel.Name)})
			}
			return true
		})
	}
	return out
}

// under reports whether the slash path p is dir or below it.
func under(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }

// checkImports applies importRules to the non-test files of one directory.
func checkImports(fset *token.FileSet, module, dir string, files []goFile) []violation {
	var out []violation
	for _, r := range importRules {
		if !under(dir, r.from) {
			continue
		}
		for _, f := range files {
			if f.test {
				continue
			}
			for _, imp := range f.ast.Imports {
				p, err := strconv.Unquote(imp.Path.Value)
				if err != nil {
					continue
				}
				rel, ok := strings.CutPrefix(p, module+"/")
				if !ok {
					continue
				}
				for _, d := range r.deny {
					if under(rel, d) {
						out = append(out, violation{ruleImport, fmt.Sprintf("%s:%d", f.path, fset.Position(imp.Pos()).Line),
							fmt.Sprintf("%s imports %s: %s", r.from, rel, r.why)})
					}
				}
			}
		}
	}
	return out
}

// longFuncs reports the functions of f longer than maxFuncLines, at
// "file:Name".
func longFuncs(fset *token.FileSet, f goFile) []violation {
	var out []violation
	for _, d := range f.ast.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Body == nil {
			continue
		}
		n := fset.Position(fd.End()).Line - fset.Position(fd.Type.Pos()).Line + 1
		if n > maxFuncLines {
			out = append(out, violation{ruleLength, f.path + ":" + fd.Name.Name, fmt.Sprintf(
				"%s is %d lines, more than %d: split it into steps that each do one thing", fd.Name.Name, n, maxFuncLines)})
		}
	}
	return out
}

// zeroDefaults reports the blocks of f that give a variable or field a
// default when it is zero, `if x == 0 { x = d }` (or "" for a string),
// where d is a constant or a plain name or field: `x = cmp.Or(x, d)` says
// it in one line. A d with a call stays a block, since cmp.Or evaluates
// every argument.
func zeroDefaults(fset *token.FileSet, f goFile) []violation {
	var out []violation
	ast.Inspect(f.ast, func(n ast.Node) bool {
		is, ok := n.(*ast.IfStmt)
		if !ok || is.Init != nil || is.Else != nil || len(is.Body.List) != 1 {
			return true
		}
		cond, ok := is.Cond.(*ast.BinaryExpr)
		if !ok || cond.Op != token.EQL {
			return true
		}
		if zero, ok := cond.Y.(*ast.BasicLit); !ok || (zero.Value != "0" && zero.Value != `""`) {
			return true
		}
		as, ok := is.Body.List[0].(*ast.AssignStmt)
		if !ok || as.Tok != token.ASSIGN || len(as.Lhs) != 1 || len(as.Rhs) != 1 ||
			types.ExprString(as.Lhs[0]) != types.ExprString(cond.X) || !plainValue(as.Rhs[0]) {
			return true
		}
		x := types.ExprString(cond.X)
		out = append(out, violation{ruleDefault, fmt.Sprintf("%s:%d", f.path, fset.Position(is.Pos()).Line), fmt.Sprintf(
			"if %s == %s { %s = %s }: write %s = cmp.Or(%s, %s)", x, types.ExprString(cond.Y), x, types.ExprString(as.Rhs[0]),
			x, x, types.ExprString(as.Rhs[0]))})
		return true
	})
	return out
}

// plainValue reports whether e is a literal, a name or a field, or
// arithmetic of them: what costs nothing to evaluate when unused.
func plainValue(e ast.Expr) bool {
	switch e := e.(type) {
	case *ast.BasicLit, *ast.Ident:
		return true
	case *ast.SelectorExpr:
		return plainValue(e.X)
	case *ast.BinaryExpr:
		return plainValue(e.X) && plainValue(e.Y)
	case *ast.ParenExpr:
		return plainValue(e.X)
	}
	return false
}

// importNames maps the names a file uses for its imports to their paths.
func importNames(f *ast.File) map[string]string {
	m := map[string]string{}
	for _, imp := range f.Imports {
		p, err := strconv.Unquote(imp.Path.Value)
		if err != nil {
			continue
		}
		name := path.Base(p)
		if imp.Name != nil {
			name = imp.Name.Name
		}
		if name == "_" || name == "." {
			continue
		}
		m[name] = p
	}
	return m
}

// TestHouseRules checks the whole module; see the package comment.
func TestHouseRules(t *testing.T) {
	t.Parallel()
	root := testnet.ModuleRoot(t)
	violations, pkgs, err := check(os.DirFS(root))
	if err != nil {
		t.Fatal(err)
	}
	undocumented, long := map[string]bool{}, map[string]bool{}
	for _, v := range violations {
		switch v.Rule {
		case ruleDoc:
			undocumented[v.Pos] = true
			if _, ok := docAllowlist[v.Pos]; ok {
				continue
			}
		case ruleLength:
			long[v.Pos] = true
			if _, ok := longFuncAllowlist[v.Pos]; ok {
				continue
			}
		}
		t.Error(v)
	}
	for fn, why := range longFuncAllowlist {
		if !long[fn] {
			t.Errorf("longFuncAllowlist names %s (%s), which is now at most %d lines or is gone: remove the entry", fn, why, maxFuncLines)
		}
	}
	for dir, why := range docAllowlist {
		if !undocumented[dir] {
			t.Errorf("docAllowlist names %s (%s), which now has a package comment or is gone: remove the entry", dir, why)
		}
	}
	t.Logf("checked %d package directories under %s", pkgs, root)
	for file := range sleepAllowlist {
		if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(file))); err != nil {
			t.Errorf("sleepAllowlist names %s, which does not exist: remove the entry", file)
		}
	}
}
