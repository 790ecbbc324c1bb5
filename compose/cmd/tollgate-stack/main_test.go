package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/compose/stack"
	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/internal/testnet"
)

func TestHelpListsEveryVariable(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	if code := run(t.Context(), []string{"--help"}, configs.MapLookup(nil), &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	vars, err := stack.Vars()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"TOLLGATE_REDIS_SERVER", "default: 127.0.0.1:8080", "default: 127.0.0.1:9000", "default: configs/rules.yaml"}
	for _, v := range vars {
		want = append(want, v.Name)
	}
	for _, s := range want {
		if !strings.Contains(out.String(), s) {
			t.Errorf("--help lacks %s", s)
		}
	}
	// The text above the variables names every part the stack runs, and
	// how to join it.
	head, _, _ := strings.Cut(out.String(), "Environment variables:")
	head = strings.Join(strings.Fields(head), " ") // words, whatever the wrapping
	for _, s := range []string{"Redis", "NATS", "Kafka-protocol broker", "aggregator", "demo API", "gateway", "bin/stack.env", "bin/stack.pid"} {
		if !strings.Contains(head, s) {
			t.Errorf("--help's description lacks %s:\n%s", s, head)
		}
	}
}

func TestExitCodes(t *testing.T) {
	t.Parallel()
	busy := testnet.Listen(t) // after the parallel subtests
	free := map[string]string{
		"TOLLGATE_LISTEN": "127.0.0.1:0", "TOLLGATE_API_LISTEN": "127.0.0.1:0", "TOLLGATE_METRICS_LISTEN": "127.0.0.1:0",
		"TOLLGATE_GRPC_LISTEN": "127.0.0.1:0", "TOLLGATE_DEMO_LISTEN": "127.0.0.1:0", "TOLLGATE_RULES_FILE": "../../../configs/rules.yaml",
	}
	with := func(k, v string) map[string]string {
		m := map[string]string{k: v}
		for k, v := range free {
			if _, ok := m[k]; !ok {
				m[k] = v
			}
		}
		return m
	}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		code int
		want string
	}{
		{"bad flag", []string{"--nope"}, nil, 2, "--help"},
		{"stray argument", []string{"start"}, nil, 2, "unexpected argument"},
		{"bad variable", nil, with("TOLLGATE_STACK_REDIS", "docker"), 2, "TOLLGATE_STACK_REDIS"},
		{"missing rules file", nil, with("TOLLGATE_RULES_FILE", "/nonexistent/rules.yaml"), 1, "TOLLGATE_RULES_FILE"},
		{"busy port", nil, with("TOLLGATE_DEMO_LISTEN", busy.Addr().String()), 1, "set TOLLGATE_DEMO_LISTEN to another address"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var out, errOut bytes.Buffer
			if code := run(t.Context(), tt.args, configs.MapLookup(tt.env), &out, &errOut); code != tt.code || !strings.Contains(errOut.String(), tt.want) {
				t.Fatalf("exit %d, want %d; stderr %q lacks %q?", code, tt.code, errOut.String(), tt.want)
			}
		})
	}
}
