package houserules

import (
	"bytes"
	"errors"
	"fmt"
	"github.com/tollgate/tollgate/internal/testnet"
	"io/fs"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"
)

const ruleCitation = "no-outside-citations"

// citationPatterns are references to documents that are not in the
// repository: the product contract and the dependency notes the project is
// built from, and the numbers of its work items. A user reading a doc, a
// comment or a --help text cannot follow any of them.
var citationPatterns = []struct {
	re  *regexp.Regexp
	why string
}{
	{regexp.MustCompile(`\bSPEC\b`), "cites the SPEC, which is not in the repository"},
	{regexp.MustCompile(`\bDEPENDENCIES\b`), "cites DEPENDENCIES, which is not in the repository"},
	{regexp.MustCompile(`\b[Ii]ssues? #?[0-9]+\b`), "cites an issue number, which means nothing to a user"},
}

// citationAllowlist names files (slash paths from the module root) that may
// hold what citationPatterns refuse, each with the reason. An entry whose
// file no longer holds a match, or is gone, fails the test.
var citationAllowlist = map[string]string{
	"internal/houserules/citations_test.go": "spells the patterns it refuses, and a made-up module that breaks them",
}

// checkCitations reports every line of the text files named (slash paths in
// fsys) that cites a document outside the repository. Binary files (a NUL
// byte in their first 8 KiB) are skipped.
func checkCitations(fsys fs.FS, files []string) ([]violation, error) {
	var out []violation
	for _, p := range files {
		data, err := fs.ReadFile(fsys, p)
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted in the work tree, not yet in the index
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", p, err)
		}
		if bytes.IndexByte(data[:min(len(data), 8<<10)], 0) >= 0 {
			continue
		}
		for i, line := range strings.Split(string(data), "\n") {
			for _, c := range citationPatterns {
				for _, m := range c.re.FindAllString(line, -1) {
					out = append(out, violation{ruleCitation, fmt.Sprintf("%s:%d", p, i+1),
						fmt.Sprintf("%q %s: say the fact, or link the doc in docs/ that holds it", m, c.why)})
				}
			}
		}
	}
	return out, nil
}

// trackedFiles lists the files git tracks under root, as slash paths. Without
// git (a source tarball, say) it lists every regular file, skipping the
// directories a build or an editor writes: bin, and those starting with "."
// or "_".
func trackedFiles(root string) ([]string, string, error) {
	cmd := exec.Command("git", "ls-files", "-z")
	cmd.Dir = root
	if out, err := cmd.Output(); err == nil {
		var files []string
		for _, f := range strings.Split(string(out), "\x00") {
			if f != "" {
				files = append(files, f)
			}
		}
		return files, "git ls-files", nil
	}
	var files []string
	err := fs.WalkDir(os.DirFS(root), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); p != "." && (name == "bin" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return fs.SkipDir
			}
			return nil
		}
		if d.Type().IsRegular() {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("walk %s: %w", root, err)
	}
	return files, "a walk of the work tree (git ls-files failed)", nil
}

// TestNoOutsideCitations: no tracked file — docs, READMEs, comments, --help
// texts, configs, scripts, test messages — cites the SPEC, DEPENDENCIES or
// an issue number. Say what the reader needs, or link the repository doc
// that holds it (docs/reference/ holds the contract).
func TestNoOutsideCitations(t *testing.T) {
	t.Parallel()
	root := testnet.ModuleRoot(t)
	files, how, err := trackedFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	violations, err := checkCitations(os.DirFS(root), files)
	if err != nil {
		t.Fatal(err)
	}
	applyFileAllowlist(t, violations, "citationAllowlist", citationAllowlist, "holds no citation")
	t.Logf("checked %d files from %s", len(files), how)
}

// TestCitationCheckerFindsViolations runs checkCitations on a made-up module
// so that a pattern that silently stops matching, or starts matching names
// that are not citations, is noticed.
func TestCitationCheckerFindsViolations(t *testing.T) {
	t.Parallel()
	file := func(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }
	fsys := fstest.MapFS{
		"README.md": file("# M\n\nThe headers are those of SPEC §3.\nSee ../shared/SPEC.md for more.\n"),
		"a/a.go": file(`// Package a is cited.
package a

// Config is the configuration (SPEC §4).
type Config struct{}

// New follows the contract (see SPEC).
func New() {}

// The client needs its deadlines (DEPENDENCIES trap 4).
var x = 1

// Landed with issue 10; Issue #12 follows.
var y = 2
`),
		"a/help.go":      file("package a\n\nconst usage = \"the retry storm (SPEC: §10.2)\"\n"),
		"configs/c.yaml": file("# rules (DEPENDENCIES.md)\nkey: v\n"),

		// Names that hold the letters without being citations.
		"clean/clean.go": file(`// Package clean cites nothing.
package clean

// GRANULARITY_UNSPECIFIED and KIND_UNSPECIFIED are enum zero values; the
// gRPC spec, a specification and the tissue 3 are not citations either, and
// neither is github.com/golang/go/issues/123 or TOLLGATE_SPECIAL.
const KIND_UNSPECIFIED = 0
`),
		// Binary files are skipped, whatever they hold.
		"img/x.png": file("\x89PNG\x00 SPEC §3 issue 10"),
	}
	files := []string{"README.md", "a/a.go", "a/help.go", "configs/c.yaml", "clean/clean.go", "img/x.png", "gone.md"}
	got, err := checkCitations(fsys, files)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		ruleCitation + " README.md:3",
		ruleCitation + " README.md:4",
		ruleCitation + " a/a.go:4",
		ruleCitation + " a/a.go:7",
		ruleCitation + " a/a.go:10",
		ruleCitation + " a/a.go:13",
		ruleCitation + " a/a.go:13",
		ruleCitation + " a/help.go:3",
		ruleCitation + " configs/c.yaml:1",
	}
	compareViolations(t, got, true, want)
}
