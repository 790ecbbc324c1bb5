package configs

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

func TestMainStatus(t *testing.T) {
	tests := []struct {
		name       string
		environ    []string
		wantStatus int
		wantRun    bool
		wantStderr string
	}{
		{"known variables run", []string{"PATH=/bin", "TOLLGATE_KEY_SECRET=x"}, 7, true, ""},
		{"an unknown variable stops the start", []string{"TOLLGATE_UPSTREM=http://x"}, 2, false,
			"gw: configs: unknown variable TOLLGATE_UPSTREM (did you mean TOLLGATE_UPSTREAM?)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			ran := false
			run := func(args []string, lookup LookupFunc, out, errw io.Writer) int {
				ran = true
				if len(args) != 1 || args[0] == "" || out != &stdout || errw != &stderr {
					t.Errorf("run got args %q and other writers", args)
				}
				if v, ok := lookup("X"); !ok || v != "x" {
					t.Errorf("run got another lookup")
				}
				return 7
			}
			lookup := func(name string) (string, bool) { return strings.ToLower(name), true }
			got := mainStatus("gw", tt.environ, []string{"--help"}, lookup, &stdout, &stderr, run)
			if got != tt.wantStatus || ran != tt.wantRun {
				t.Fatalf("status %d, ran %v; want %d, %v", got, ran, tt.wantStatus, tt.wantRun)
			}
			if !strings.HasPrefix(stderr.String(), tt.wantStderr) || (tt.wantStderr == "") != (stderr.Len() == 0) {
				t.Fatalf("stderr %q, want it to start with %q", stderr.String(), tt.wantStderr)
			}
		})
	}
}
