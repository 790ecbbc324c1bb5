package configs

import (
	"bytes"
	"context"
	"errors"
	"flag"
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
			want := t.Context()
			run := func(ctx context.Context, args []string, lookup LookupFunc, out, errw io.Writer) int {
				ran = true
				if ctx != want {
					t.Errorf("run got another context")
				}
				if len(args) != 1 || args[0] == "" || out != &stdout || errw != &stderr {
					t.Errorf("run got args %q and other writers", args)
				}
				if v, ok := lookup("X"); !ok || v != "x" {
					t.Errorf("run got another lookup")
				}
				return 7
			}
			lookup := func(name string) (string, bool) { return strings.ToLower(name), true }
			got := mainStatus(want, "gw", tt.environ, []string{"--help"}, lookup, &stdout, &stderr, run)
			if got != tt.wantStatus || ran != tt.wantRun {
				t.Fatalf("status %d, ran %v; want %d, %v", got, ran, tt.wantStatus, tt.wantRun)
			}
			if !strings.HasPrefix(stderr.String(), tt.wantStderr) || (tt.wantStderr == "") != (stderr.Len() == 0) {
				t.Fatalf("stderr %q, want it to start with %q", stderr.String(), tt.wantStderr)
			}
		})
	}
}

func TestParseArgs(t *testing.T) {
	tests := []struct {
		args       []string
		wantOK     bool
		wantStatus int
		wantStderr string
	}{
		{[]string{"--config", "x.yaml"}, true, 0, ""},
		{[]string{"--help"}, false, 5, ""},
		{[]string{"--nope"}, false, 2, "gw: flag provided but not defined: -nope\nRun bin/gw --help for usage.\n"},
		{[]string{"--config", "x.yaml", "extra"}, false, 2, "gw: unexpected argument \"extra\"\nRun bin/gw --help for usage.\n"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			fs := flag.NewFlagSet("gw", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			config := fs.String("config", "", "")
			var stderr bytes.Buffer
			status, ok := ParseArgs(fs, tt.args, &stderr, "gw", "bin/gw", func() int { return 5 })
			if ok != tt.wantOK || status != tt.wantStatus || stderr.String() != tt.wantStderr {
				t.Fatalf("ParseArgs = %d, %v, stderr %q; want %d, %v, %q", status, ok, stderr.String(), tt.wantStatus, tt.wantOK, tt.wantStderr)
			}
			if ok && *config != "x.yaml" {
				t.Fatalf("--config = %q", *config)
			}
		})
	}
}

func TestWriteUsage(t *testing.T) {
	vars := []Var{{Name: "TOLLGATE_X", Doc: "The x."}}
	tests := []struct {
		name       string
		vars       func() ([]Var, error)
		wantStatus int
		wantStdout string
		wantStderr string
	}{
		{"listed", func() ([]Var, error) { return vars, nil }, 0, "Usage: gw\n  TOLLGATE_X", ""},
		{"unlisted", func() ([]Var, error) { return nil, errors.New("boom") }, 1, "", "gw: boom\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			status := WriteUsage(&stdout, &stderr, "gw", "Usage: gw\n", tt.vars)
			if status != tt.wantStatus || !strings.HasPrefix(stdout.String(), tt.wantStdout) || stderr.String() != tt.wantStderr {
				t.Fatalf("WriteUsage = %d, stdout %q, stderr %q", status, stdout.String(), stderr.String())
			}
		})
	}
}
