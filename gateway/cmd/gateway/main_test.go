package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/internal/testnet"
)

func TestHelpListsEveryVariable(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	if code := run(t.Context(), []string{"--help"}, configs.MapLookup(nil), &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	for _, name := range []string{
		"TOLLGATE_LISTEN", "TOLLGATE_UPSTREAM", "TOLLGATE_API_LISTEN", "TOLLGATE_API_TOKEN",
		"TOLLGATE_METRICS_LISTEN", "TOLLGATE_GRPC_LISTEN", "TOLLGATE_RULES_FILE", "TOLLGATE_KEY_SECRET",
		"TOLLGATE_REDIS_MODE", "TOLLGATE_REDIS_ADDRS", "TOLLGATE_REDIS_PASSWORD_FILE", "TOLLGATE_REDIS_TIMEOUT",
		"TOLLGATE_KAFKA_BROKERS", "TOLLGATE_NATS_URL", "TOLLGATE_GATEWAY_ID", "TOLLGATE_IDENTITY_KEY_SOURCES",
		"default: 127.0.0.1:8080", "default: 50ms", "TOLLGATE_MAX_RULES_PER_REQUEST", "TOLLGATE_GRPC_TLS_CLIENT_CA_FILE",
		"Usage: bin/gateway", "TOLLGATE_UPSTREAM=http://127.0.0.1:9000 bin/gateway",
	} {
		if !strings.Contains(out.String(), name) {
			t.Errorf("--help lacks %s", name)
		}
	}
}

func TestExitCodes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		env  map[string]string
		code int
		want string
	}{
		{"no key secret", nil, nil, 2, "TOLLGATE_KEY_SECRET"},
		{"bad flag", []string{"--nope"}, nil, 2, "--help"},
		{"stray argument", []string{"serve"}, nil, 2, "unexpected argument"},
		{"bad variable", nil, map[string]string{"TOLLGATE_KEY_SECRET": "0123456789abcdef", "TOLLGATE_REDIS_TIMEOUT": "fast"}, 2, "TOLLGATE_REDIS_TIMEOUT"},
		{"missing config file", []string{"--config", "/nonexistent/gw.yaml"}, nil, 2, "/nonexistent/gw.yaml"},
		{"missing rules file", nil, map[string]string{"TOLLGATE_KEY_SECRET": "0123456789abcdef", "TOLLGATE_RULES_FILE": "/nonexistent/rules.yaml",
			"TOLLGATE_API_LISTEN": "127.0.0.1:0", "TOLLGATE_METRICS_LISTEN": "127.0.0.1:0", "TOLLGATE_GRPC_LISTEN": "off"}, 1, "rules_file"},
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

// TestBusyPortsAreAllNamed: with two of its ports taken, bin/gateway says
// so for both, each with the variable that moves it, one line each.
func TestBusyPortsAreAllNamed(t *testing.T) {
	t.Parallel()
	var busy []string
	for range 2 {
		ln := testnet.Listen(t)
		busy = append(busy, ln.Addr().String())
	}
	env := map[string]string{
		"TOLLGATE_KEY_SECRET": "0123456789abcdef", "TOLLGATE_RULES_FILE": filepath.Join("..", "..", "..", "configs", "rules.yaml"),
		"TOLLGATE_UPSTREAM": "http://127.0.0.1:9", "TOLLGATE_LISTEN": busy[0], "TOLLGATE_API_LISTEN": "127.0.0.1:0",
		"TOLLGATE_METRICS_LISTEN": busy[1], "TOLLGATE_GRPC_LISTEN": "off", "TOLLGATE_REDIS_ADDRS": "127.0.0.1:9",
	}
	var out, errOut bytes.Buffer
	if code := run(t.Context(), nil, configs.MapLookup(env), &out, &errOut); code != 1 {
		t.Fatalf("exit %d with two ports taken, want 1; stderr %s", code, errOut.String())
	}
	t.Logf("stderr:\n%s", errOut.String())
	lines := strings.Split(strings.TrimSpace(errOut.String()), "\n")
	for i, want := range []struct{ addr, variable string }{{busy[0], "TOLLGATE_LISTEN"}, {busy[1], "TOLLGATE_METRICS_LISTEN"}} {
		found := false
		for _, l := range lines {
			found = found || strings.Contains(l, want.addr+" is already in use ("+want.variable+")")
		}
		if !found {
			t.Errorf("busy listener %d: no line names %s and %s in\n%s", i, want.addr, want.variable, errOut.String())
		}
	}
}

func TestExampleConfig(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	if code := run(t.Context(), []string{"--example-config"}, configs.MapLookup(nil), &out, &errOut); code != 0 || !bytes.Equal(out.Bytes(), configs.GatewayYAML()) {
		t.Fatalf("exit %d, output %d bytes", code, out.Len())
	}
}
