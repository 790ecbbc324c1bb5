package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSweepUsageErrors: bad flags are refused with exit 2 and a message
// that names them, before any server starts.
func TestSweepUsageErrors(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		args []string
		want []string
	}{
		{"bad count", []string{"-keys", "1k,ten"}, []string{`count "ten"`}},
		{"zero keys", []string{"-keys", "0"}, []string{`count "0"`}},
		{"too many keys", []string{"-keys", "200m"}, []string{`count "200m"`}},
		{"descending", []string{"-keys", "1m,1k"}, []string{"must ascend"}},
		{"bad part", []string{"-what", "gateway,nats"}, []string{`-what "nats"`}},
		{"bad dist", []string{"-dist", "pareto"}, []string{`-dist "pareto"`}},
		{"two at once", []string{"-dist", "pareto", "-keys", "x"}, []string{`-dist "pareto"`, `count "x"`}},
		{"zero point", []string{"-point", "0s"}, []string{"-point 0s"}},
		{"bad bound", []string{"-pebble-up-to", "lots"}, []string{"-pebble-up-to", `count "lots"`}},
		{"bad earlier", []string{"-aggregator-earlier", "old=1,x"}, []string{`value "x"`}},
		{"earlier too short", []string{"-aggregator-earlier", "old=1,2"}, []string{"2 values for 4 key counts"}},
		{"out not a directory", []string{"-out", file}, []string{"not an existing directory"}},
		{"out missing", []string{"-out", filepath.Join(file, "x")}, []string{"not an existing directory"}},
		{"unknown flag", []string{"-frobnicate"}, []string{"flag provided but not defined"}},
		{"stray argument", []string{"now"}, []string{"unexpected arguments"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			code, stdout, stderr := runCmd(t, t.Context(), append([]string{"sweep"}, tt.args...)...)
			if code != exitUsage || stdout != "" {
				t.Errorf("exit %d, stdout %q; want %d and nothing", code, stdout, exitUsage)
			}
			for _, w := range tt.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr %q lacks %q", stderr, w)
				}
			}
		})
	}
	code, _, stderr := runCmd(t, t.Context(), "sweep", "-h")
	if code != exitOK || !strings.Contains(stderr, "Usage: loadtest sweep") || !strings.Contains(stderr, "-all-algorithms-up-to") {
		t.Errorf("-h: exit %d, %q", code, stderr)
	}
}

// TestSweepCommand runs a small sweep of the aggregator and Pebble (no
// Redis: those parts run in TestTinySweep of the sweep package) and
// checks the tables and the charts written.
func TestSweepCommand(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	code, stdout, stderr := runCmd(t, t.Context(), "sweep", "-what", "aggregator,pebble", "-keys", "20,40", "-events", "2000",
		"-reports", "1", "-pebble-up-to", "20", "-out", dir, "-commit", "c0ffee", "-quiet")
	if code != exitOK {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	for _, want := range []string{"commit c0ffee", "| 40 | 40 |", "pebble: 40 keys not run"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout)
		}
	}
	for _, f := range []string{"sweep-aggregator.svg", "sweep-pebble-bytes.svg", "sweep-report.svg"} {
		if b, err := os.ReadFile(filepath.Join(dir, f)); err != nil || !strings.HasPrefix(string(b), "<svg") {
			t.Errorf("%s: %v", f, err)
		}
	}
}
