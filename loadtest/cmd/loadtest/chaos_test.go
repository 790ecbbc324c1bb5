package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/loadtest/internal/chaos/history"
)

func TestChaosUsage(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"help", []string{"chaos", "-h"}, exitOK, "chaos: N invariants held, M violated, F faults (seed S)"},
		{"unknown kind", []string{"chaos", "-kinds", "gw-kill,meteor"}, exitUsage, `unknown fault kind "meteor"`},
		{"too short", []string{"chaos", "-duration", "1s", "-bin", t.TempDir()}, exitUsage, "-duration 1s"},
		{"too few gateways", []string{"chaos", "-gateways", "2", "-bin", t.TempDir()}, exitUsage, "-gateways 2"},
		{"no binaries", []string{"chaos", "-seed", "1", "-bin", t.TempDir(), "-quiet"}, exitFailed, "make build"},
		{"stray argument", []string{"chaos", "now"}, exitUsage, "unexpected arguments"},
		{"child without a server", []string{"chaos-child"}, exitUsage, "kafka or nats"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			code, _, stderr := runCmd(t, t.Context(), tt.args...)
			if code != tt.code || !strings.Contains(stderr, tt.want) {
				t.Fatalf("exit %d, want %d; stderr:\n%s\nwant it to hold %q", code, tt.code, stderr, tt.want)
			}
		})
	}
}

// A history written with -history is judged again with -check: the exit
// status and the last line follow the verdicts.
func TestChaosCheckHistory(t *testing.T) {
	t.Parallel()
	h := &history.History{
		Meta: history.Meta{Seed: 9, Gateways: 3, Aggregators: 2, Propagation: 2e6, RecoveryBound: 60e6, MaxUnscheduledDegraded: 0.01},
		Rules: []history.Rule{{ID: "fw", Algorithm: history.FixedWindow, Limit: 2, Window: 2e6, Strict: true,
			OnFailure: "open", Scope: "key", Endpoints: []string{"/fw"}}},
		Keys:   []history.Key{{Name: "k", Raw: "sk_k", Tenant: "t"}},
		Usage:  []history.Usage{{Aggregator: "agg1", Tenants: map[string]history.Totals{"t": {Allowed: 2}}}},
		Counts: history.Counts{Complete: true},
		Probes: []history.Probe{{What: "propagation", Target: "gw1", OK: true, Took: 1000}},
	}
	const t0 = 1_700_000_000_000_000
	for i := range 2 {
		h.Answers = append(h.Answers, history.Answer{Gateway: 1, Key: "k", Endpoint: "/fw", Cost: 1,
			Sent: t0 + int64(i)*1000, Recv: t0 + int64(i)*1000 + 10, Status: 200})
	}
	write := func(name string, h *history.History) string {
		p := filepath.Join(t.TempDir(), name)
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := history.Write(f, h); err != nil {
			t.Fatal(err)
		}
		f.Close()
		return p
	}
	good := write("good.jsonl", h)
	report := filepath.Join(t.TempDir(), "chaos.html")
	code, stdout, stderr := runCmd(t, t.Context(), "chaos", "-check", good, "-report", report)
	if code != exitOK || !strings.HasSuffix(stdout, "chaos: 5 invariants held, 0 violated, 0 faults (seed 9)\n") {
		t.Fatalf("exit %d; stdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if b, err := os.ReadFile(report); err != nil || !strings.Contains(string(b), "invariant 1") {
		t.Fatalf("report: %v", err)
	}
	// One admission too many: invariant 1 fails, and so does the run.
	h.Answers = append(h.Answers, history.Answer{Gateway: 2, Key: "k", Endpoint: "/fw", Cost: 1, Sent: t0 + 5000, Recv: t0 + 5010, Status: 200})
	h.Usage[0].Tenants["t"] = history.Totals{Allowed: 3}
	code, stdout, stderr = runCmd(t, t.Context(), "chaos", "-check", write("bad.jsonl", h))
	if code != exitFailed || !strings.HasSuffix(stdout, "chaos: 4 invariants held, 1 violated, 0 faults (seed 9)\n") ||
		!strings.Contains(stderr, "-seed 9") {
		t.Fatalf("exit %d; stdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if code, _, _ := runCmd(t, t.Context(), "chaos", "-check", filepath.Join(t.TempDir(), "none")); code != exitFailed {
		t.Fatalf("a missing history: exit %d", code)
	}
}
