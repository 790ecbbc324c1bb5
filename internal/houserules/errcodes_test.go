package houserules

import (
	"fmt"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/tollgate/tollgate/guard/apierror"
	"github.com/tollgate/tollgate/internal/testnet"
)

const ruleErrorCode = "error-code"

// vocabularyDir is the package holding the API error codes and their table.
const vocabularyDir = "guard/apierror"

// errorCodeAllowlist names non-test files (slash paths from the module
// root) that may spell an API error code as a string literal, each with
// the reason. Use the constants of guard/apierror unless the file must not
// depend on the code it judges. An entry whose file breaks the rule no
// more, or is gone, fails the test.
var errorCodeAllowlist = map[string]string{
	"loadtest/internal/chaos/checker/checker.go": "the chaos soak's checker is written apart from the code it judges: it spells the wire as a client sees it, as tests do",
}

// vocabulary is what the error-code rule checks against.
type vocabulary struct {
	// dir is the vocabulary package's directory (slash path in fsys).
	dir string
	// known reports whether a string is a code of the table; answers
	// whether the table pairs a status with a code.
	known   func(code string) bool
	answers func(status int, code string) bool
	// statuses maps net/http's Status constants to their values.
	statuses map[string]int
}

// codeShape is what an API error code looks like.
var codeShape = regexp.MustCompile(`^[A-Z][A-Z0-9]*(_[A-Z0-9]+)+$|^[A-Z]{4,}$`)

// jsonCode finds a code spelled inside a JSON fragment: "code":"PENALTY".
var jsonCode = regexp.MustCompile(`"code"\s*:\s*"([A-Z][A-Z0-9_]*)"`)

// checkErrorCodes reports, in the non-test, non-generated Go files of
// fsys outside the vocabulary package:
//
//   - a string literal that is a code of the table: name the constant;
//   - a string literal shaped like a code given as one — next to an HTTP
//     status among a call's arguments, or as the Code field or "code" key
//     of a composite literal — that is not in the table: add it there;
//   - an HTTP status and a code side by side (a call's arguments, the
//     Status and Code fields of one composite literal) that the table
//     does not pair: answer the table's status, or add the row.
//
// A code is resolved through the constants of the vocabulary package and
// the constants elsewhere that are set to one of them (guard.CodePenalty);
// a status is an integer literal or a net/http constant.
func checkErrorCodes(fsys fs.FS, v vocabulary) ([]violation, error) {
	module, err := modulePath(fsys)
	if err != nil {
		return nil, err
	}
	dirs, err := goFilesByDir(fsys)
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	parsed := map[string][]goFile{}
	for dir, files := range dirs {
		for _, p := range files {
			src, err := fs.ReadFile(fsys, p)
			if err != nil {
				return nil, err
			}
			f, err := parser.ParseFile(fset, p, src, parser.ParseComments|parser.SkipObjectResolution)
			if err != nil {
				continue // the parse rule reports it
			}
			parsed[dir] = append(parsed[dir], goFile{path: p, test: strings.HasSuffix(p, "_test.go"), gen: ast.IsGenerated(f), ast: f})
		}
	}
	codes := codeConstants(parsed, module, v.dir)

	var out []violation
	for _, dir := range slices.Sorted(maps.Keys(parsed)) {
		if dir == v.dir {
			continue
		}
		for _, f := range parsed[dir] {
			if f.test || f.gen {
				continue
			}
			r := resolver{imports: importNames(f.ast), own: codes[path.Join(module, dir)], codes: codes, statuses: v.statuses}
			at := func(n ast.Node) string { return fmt.Sprintf("%s:%d", f.path, fset.Position(n.Pos()).Line) }
			flagged := map[ast.Node]bool{}
			ast.Inspect(f.ast, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.ImportSpec:
					return false
				case *ast.BasicLit:
					if s, ok := stringLit(n); ok && v.known(s) && !flagged[n] {
						out = append(out, violation{ruleErrorCode, at(n), fmt.Sprintf(
							"the API error code %q as a string literal: use the constant of %s", s, v.dir)})
					} else if ok {
						out = append(out, jsonFragment(v, at(n), s)...)
					}
				case *ast.CallExpr:
					for i := 0; i+1 < len(n.Args); i++ {
						if status, ok := r.status(n.Args[i]); ok {
							out = append(out, r.pair(v, at, flagged, status, n.Args[i+1])...)
						}
					}
				case *ast.CompositeLit:
					var status ast.Expr
					var code ast.Expr
					for _, e := range n.Elts {
						kv, ok := e.(*ast.KeyValueExpr)
						if !ok {
							continue
						}
						switch k := kv.Key.(type) {
						case *ast.Ident:
							switch k.Name {
							case "Status":
								status = kv.Value
							case "Code":
								code = kv.Value
							}
						case *ast.BasicLit:
							if s, _ := stringLit(k); s == "code" {
								code = kv.Value
							}
						}
					}
					if code == nil {
						break
					}
					if st, ok := r.status(status); ok {
						out = append(out, r.pair(v, at, flagged, st, code)...)
					} else if lit, ok := code.(*ast.BasicLit); ok {
						if s, ok := stringLit(lit); ok && codeShape.MatchString(s) && !v.known(s) {
							flagged[lit] = true
							out = append(out, violation{ruleErrorCode, at(lit), fmt.Sprintf(
								"%q is not an API error code of %s: add it to the table there", s, v.dir)})
						}
					}
				}
				return true
			})
		}
	}
	return out, nil
}

// resolver reads codes and statuses in one file.
type resolver struct {
	imports  map[string]string            // name → import path
	own      map[string]string            // the file's package's code constants
	codes    map[string]map[string]string // import path → constant → code
	statuses map[string]int
}

// code returns the code e names: a constant of the vocabulary, or one set
// to such a constant.
func (r resolver) code(e ast.Expr) (string, bool) {
	switch e := e.(type) {
	case *ast.Ident:
		c, ok := r.own[e.Name]
		return c, ok
	case *ast.SelectorExpr:
		if x, ok := e.X.(*ast.Ident); ok {
			c, ok := r.codes[r.imports[x.Name]][e.Sel.Name]
			return c, ok
		}
	}
	return "", false
}

// status returns the HTTP status e is: an integer literal from 100 to 599
// or a net/http constant.
func (r resolver) status(e ast.Expr) (int, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind == token.INT {
			n, err := strconv.Atoi(e.Value)
			return n, err == nil && n >= 100 && n <= 599
		}
	case *ast.SelectorExpr:
		if x, ok := e.X.(*ast.Ident); ok && r.imports[x.Name] == "net/http" {
			n, ok := r.statuses[e.Sel.Name]
			return n, ok
		}
	}
	return 0, false
}

// pair checks a code expression answered with status.
func (r resolver) pair(v vocabulary, at func(ast.Node) string, flagged map[ast.Node]bool, status int, e ast.Expr) []violation {
	if c, ok := r.code(e); ok {
		if !v.answers(status, c) {
			return []violation{{ruleErrorCode, at(e), fmt.Sprintf(
				"%s answered with status %d, which the table of %s does not give it: answer its status, or add the row", c, status, v.dir)}}
		}
		return nil
	}
	lit, ok := e.(*ast.BasicLit)
	if !ok {
		return nil
	}
	s, ok := stringLit(lit)
	if !ok || !codeShape.MatchString(s) || v.known(s) {
		return nil
	}
	flagged[lit] = true
	return []violation{{ruleErrorCode, at(lit), fmt.Sprintf(
		"%q answered with status %d is not an API error code of %s: add it to the table there", s, status, v.dir)}}
}

// jsonFragment checks the codes a string literal spells in a JSON
// fragment (a body written or matched by hand): each must be built from
// the vocabulary's constant.
func jsonFragment(v vocabulary, pos, s string) []violation {
	var out []violation
	for _, m := range jsonCode.FindAllStringSubmatch(s, -1) {
		c := m[1]
		switch {
		case v.known(c):
			out = append(out, violation{ruleErrorCode, pos, fmt.Sprintf(
				"the API error code %q inside a JSON string literal: build it from the constant of %s", c, v.dir)})
		case codeShape.MatchString(c):
			out = append(out, violation{ruleErrorCode, pos, fmt.Sprintf(
				"%q inside a JSON string literal is not an API error code of %s: add it to the table there", c, v.dir)})
		}
	}
	return out
}

func stringLit(l *ast.BasicLit) (string, bool) {
	if l.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(l.Value)
	return s, err == nil
}

// codeConstants returns, by import path, the string constants that are
// codes: every one of the vocabulary package, and any other package's set
// to one of those (guard's CodePenalty = apierror.Penalty).
func codeConstants(parsed map[string][]goFile, module, vocab string) map[string]map[string]string {
	vocabPath := path.Join(module, vocab)
	out := map[string]map[string]string{vocabPath: {}}
	eachConst := func(files []goFile, fn func(f goFile, name string, value ast.Expr)) {
		for _, f := range files {
			if !f.test {
				testnet.ConstValues(f.ast, func(name string, value ast.Expr) { fn(f, name, value) })
			}
		}
	}
	eachConst(parsed[vocab], func(_ goFile, name string, value ast.Expr) {
		if lit, ok := value.(*ast.BasicLit); ok {
			if s, ok := stringLit(lit); ok {
				out[vocabPath][name] = s
			}
		}
	})
	for dir, files := range parsed {
		if dir == vocab {
			continue
		}
		eachConst(files, func(f goFile, name string, value ast.Expr) {
			sel, ok := value.(*ast.SelectorExpr)
			if !ok {
				return
			}
			x, ok := sel.X.(*ast.Ident)
			if !ok || importNames(f.ast)[x.Name] != vocabPath {
				return
			}
			if c, ok := out[vocabPath][sel.Sel.Name]; ok {
				p := path.Join(module, dir)
				if out[p] == nil {
					out[p] = map[string]string{}
				}
				out[p][name] = c
			}
		})
	}
	return out
}

// modulePath reads the module path from fsys's go.mod.
func modulePath(fsys fs.FS) (string, error) {
	data, err := fs.ReadFile(fsys, "go.mod")
	if err != nil {
		return "", err
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`), nil
		}
	}
	return "", fmt.Errorf("go.mod: no module line")
}

// httpStatuses reads net/http's Status constants from the Go tree the
// tests run with.
func httpStatuses(t *testing.T) map[string]int {
	t.Helper()
	file := filepath.Join(build.Default.GOROOT, "src", "net", "http", "status.go")
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatalf("reading net/http's statuses: %v", err)
	}
	out := map[string]int{}
	testnet.ConstValues(f, func(name string, value ast.Expr) {
		if lit, ok := value.(*ast.BasicLit); ok && lit.Kind == token.INT && strings.HasPrefix(name, "Status") {
			if n, err := strconv.Atoi(lit.Value); err == nil {
				out[name] = n
			}
		}
	})
	if out["StatusTooManyRequests"] != 429 || out["StatusNotFound"] != 404 {
		t.Fatalf("read %d statuses from %s, not net/http's", len(out), file)
	}
	return out
}

// TestErrorCodes applies the error-code rule to the module, with the
// table of guard/apierror.
func TestErrorCodes(t *testing.T) {
	t.Parallel()
	root := testnet.ModuleRoot(t)
	violations, err := checkErrorCodes(os.DirFS(root), vocabulary{
		dir: vocabularyDir, known: apierror.Known, answers: apierror.Answers, statuses: httpStatuses(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	applyFileAllowlist(t, violations, "errorCodeAllowlist", errorCodeAllowlist, "breaks the rule no more")
}

// TestErrorCodeRuleFindsViolations runs the rule on a made-up module, so
// that a check that silently stops matching is noticed.
func TestErrorCodeRuleFindsViolations(t *testing.T) {
	t.Parallel()
	file := func(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }
	fsys := fstest.MapFS{
		"go.mod": file("module example.com/m\n"),
		"vocab/codes.go": file(`// Package vocab is the table.
package vocab

const (
	Limited  = "LIMITED"
	NotFound = "NOT_FOUND"
)
`),
		// Aliases of the vocabulary resolve, in and out of their package.
		"lib/lib.go": file(`// Package lib uses the codes.
package lib

import (
	"net/http"

	"example.com/m/vocab"
)

const CodeLimited = vocab.Limited

type Decision struct {
	Status int
	Code   string
}

func write(http.ResponseWriter, int, string, string) {}

func Fine(w http.ResponseWriter, code string) {
	write(w, http.StatusNotFound, vocab.NotFound, "m")
	write(w, 429, CodeLimited, "m")
	write(w, http.StatusBadRequest, code, "m") // not resolved: not checked
	_ = Decision{Status: 429, Code: vocab.Limited}
	_ = "Not a CODE, nor NOTFOUND"
}

func Bad(w http.ResponseWriter) {
	write(w, http.StatusNotFound, "NOT_FOUND", "literal of a known code")
	write(w, http.StatusTeapot, "BREWING", "a code not in the table")
	write(w, 503, vocab.NotFound, "a status the table does not give")
	_ = Decision{Status: 404, Code: CodeLimited}
	_ = Decision{Code: "NEW_CODE"}
	_ = map[string]any{"code": "OTHER_CODE"}
	_ = "LIMITED"
	_ = []byte(` + "`" + `{"error":{"code":"LIMITED"}}` + "`" + `)
	_ = ` + "`" + `"code": "FRESH_CODE"` + "`" + `
}

func FineFragment() []byte { return []byte(` + "`" + `"code":"` + "`" + ` + vocab.Limited + ` + "`" + `"` + "`" + `) }
`),
		"other/other.go": file(`// Package other uses lib's alias.
package other

import (
	"net/http"

	l "example.com/m/lib"
)

func F() { _ = l.Decision{Status: http.StatusForbidden, Code: l.CodeLimited} }
`),
		// Tests spell the wire as it is; generated code is not ours.
		"lib/lib_test.go": file("package lib\n\nvar _ = \"LIMITED\"\n"),
		"gen/gen.pb.go":   file("// Code generated by protoc-gen-go. DO NOT EDIT.\n\n// Package gen.\npackage gen\n\nvar _ = \"LIMITED\"\n"),
	}
	table := map[string][]int{"LIMITED": {429}, "NOT_FOUND": {404}}
	got, err := checkErrorCodes(fsys, vocabulary{
		dir:     "vocab",
		known:   func(c string) bool { _, ok := table[c]; return ok },
		answers: func(s int, c string) bool { return slices.Contains(table[c], s) },
		statuses: map[string]int{
			"StatusNotFound": 404, "StatusBadRequest": 400, "StatusTeapot": 418, "StatusForbidden": 403,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"lib/lib.go:28", // "NOT_FOUND"
		"lib/lib.go:29", // "BREWING"
		"lib/lib.go:30", // 503 NOT_FOUND
		"lib/lib.go:31", // 404 LIMITED through the alias
		"lib/lib.go:32", // Code: "NEW_CODE"
		"lib/lib.go:33", // "code": "OTHER_CODE"
		"lib/lib.go:34", // "LIMITED"
		"lib/lib.go:35", // a known code in a JSON fragment
		"lib/lib.go:36", // an unknown one
		"other/other.go:10",
	}
	compareViolations(t, got, false, want)
}
