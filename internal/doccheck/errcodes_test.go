package doccheck

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/guard/apierror"
	"github.com/tollgate/tollgate/internal/testnet"
)

var update = flag.Bool("update", false, "rewrite the generated parts of the docs (the error tables of docs/reference/http.md)")

// errorTablesPage holds the error tables, from the module root.
const errorTablesPage = "docs/reference/http.md"

// The markers around each generated error table. The opening one names
// the surface (apierror.Surface.String).
const (
	errorTableOpen  = "<!-- error codes of the %s surface: generated from guard/apierror by go test ./internal/doccheck -run TestErrorTables -update; DO NOT EDIT -->"
	errorTableClose = "<!-- end of the generated error codes -->"
)

// renderErrorTable is the Markdown table of one surface's rows.
func renderErrorTable(s apierror.Surface) []string {
	out := []string{"| status | code | when |", "|---|---|---|"}
	for _, r := range apierror.Rows() {
		if r.Surface == s {
			out = append(out, fmt.Sprintf("| %d | `%s` | %s |", r.Status, r.Code, strings.ReplaceAll(r.When, "|", `\|`)))
		}
	}
	return out
}

// rewriteErrorTables returns lines with every surface's generated table
// replaced by what the vocabulary says, or an error naming a surface
// whose markers are missing or broken.
func rewriteErrorTables(lines []string) ([]string, error) {
	out := slices.Clone(lines)
	for _, s := range apierror.Surfaces() {
		open := fmt.Sprintf(errorTableOpen, s)
		i := slices.Index(out, open)
		if i < 0 {
			return nil, fmt.Errorf("no %q", open)
		}
		n := slices.Index(out[i+1:], errorTableClose)
		if n < 0 {
			return nil, fmt.Errorf("%q without %q after it", open, errorTableClose)
		}
		out = slices.Replace(out, i+1, i+1+n, renderErrorTable(s)...)
	}
	return out, nil
}

// TestErrorTables: the error tables of docs/reference/http.md are the
// rows of guard/apierror's table, surface by surface; -update rewrites
// them.
func TestErrorTables(t *testing.T) {
	file := filepath.Join(testnet.ModuleRoot(t), filepath.FromSlash(errorTablesPage))
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	have := strings.Split(string(data), "\n")
	want, err := rewriteErrorTables(have)
	if err != nil {
		t.Fatalf("%s: %v", errorTablesPage, err)
	}
	testnet.Golden(t, file, []byte(strings.Join(want, "\n")), *update,
		"go test ./internal/doccheck -run TestErrorTables -update")
}

// TestRewriteErrorTables: the rewrite replaces exactly what lies between
// the markers and refuses a page whose markers are missing.
func TestRewriteErrorTables(t *testing.T) {
	t.Parallel()
	var page []string
	for _, s := range apierror.Surfaces() {
		page = append(page, "## "+s.String(), fmt.Sprintf(errorTableOpen, s), "| stale |", errorTableClose, "prose after")
	}
	got, err := rewriteErrorTables(page)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(got, "| stale |") || len(got) <= len(page) {
		t.Fatalf("not rewritten:\n%s", strings.Join(got, "\n"))
	}
	if !slices.Contains(got, "| 429 | `RATE_LIMIT_EXCEEDED` | "+apierror.Rows()[0].When+" |") {
		t.Errorf("no row of RATE_LIMIT_EXCEEDED:\n%s", strings.Join(got, "\n"))
	}
	for _, broken := range [][]string{page[:len(page)-2], page[2:]} {
		if _, err := rewriteErrorTables(broken); err == nil {
			t.Errorf("no error for a page without all its markers:\n%s", strings.Join(broken, "\n"))
		}
	}
}
