package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// buildGateway builds bin/gateway into a temporary directory.
func buildGateway(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", dir, "github.com/tollgate/tollgate/gateway/cmd/gateway")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build gateway: %v\n%s", err, out)
	}
	return filepath.Join(dir, "gateway")
}

// TestRegionsScenarioShort runs the regions scenario with two regions
// (real redis-servers and gateway processes) and short phases: the exact
// judge finds no over-admission for the rotating client, shares follow
// demand (each region's NATS, Kafka and aggregator running), and the
// summary has every phase, as a table and as JSON.
func TestRegionsScenarioShort(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-servers, gateways, NATS, Kafka and aggregators")
	}
	gw := buildGateway(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ro := regionsOptions{regions: 2, limit: 20, window: time.Second, phase: time.Second,
		partition: time.Second, latency: 100 * time.Millisecond, redisTimeout: 2 * time.Second, json: true,
		agents: true, period: 500 * time.Millisecond}
	var out bytes.Buffer
	sum, err := regionsScenario(ctx, options{gateway: gw}, ro, log, &out)
	if err != nil {
		t.Fatalf("regions scenario: %v\n%s", err, out.String())
	}
	var printed regionsSummary
	if err := json.Unmarshal(out.Bytes(), &printed); err != nil {
		t.Fatalf("-json summary does not parse: %v\n%s", err, out.String())
	}
	if len(printed.Phases) != len(sum.Phases) || printed.Regions != 2 || len(printed.Shares) != 2 {
		t.Fatalf("-json summary %+v, want the run's %+v", printed, sum)
	}
	if err := sum.overAdmitted(); err != nil {
		t.Fatalf("the judge found over-admission: %v\n%s", err, out.String())
	}
	wants := []string{"rotating client", "client moving", "split 70/30", "split 50/50", "partition", "after the partition", "added on every link"}
	for _, w := range wants {
		found := false
		for _, p := range sum.Phases {
			if strings.HasPrefix(p.Phase, w) || strings.Contains(p.Phase, w) {
				found = true
				if p.Requests == 0 || p.Errors > 0 {
					t.Errorf("phase %q: %d requests, %d errors", p.Phase, p.Requests, p.Errors)
				}
			}
		}
		if !found {
			t.Errorf("the summary has no phase %q:\n%s", w, out.String())
		}
	}
	rot := sum.Phases[0]
	if !strings.HasPrefix(rot.Phase, "rotating") || !rot.Met || rot.Value != 0 || rot.Admitted == 0 {
		t.Fatalf("rotating client: %+v, want 0 over-admission and some admissions", rot)
	}
	// Shares follow demand: after the heal the client all in r1 gets more
	// than r1's static share (half of L) in a whole window, which only a
	// loan from r2 gives.
	for _, p := range sum.Phases {
		if strings.HasPrefix(p.Phase, "after the partition") && p.Value <= 60 {
			t.Errorf("after the heal r1 had at most %.0f %% of L in a whole window, want above its static share (50 %%): no loan reached it\n%s", p.Value, out.String())
		}
	}
	if sum.Links != 1 {
		t.Errorf("%d cross-region links, want 1 (r2's to r1)", sum.Links)
	}
	var table bytes.Buffer
	if err := printRegions(&table, sum); err != nil {
		t.Fatal(err)
	}
	for _, w := range append(wants, "static shares", "target") {
		if !strings.Contains(table.String(), w) {
			t.Errorf("the table lacks %q:\n%s", w, table.String())
		}
	}
}

func TestSpreadPattern(t *testing.T) {
	tests := []struct {
		split []int
		want  string
	}{
		{[]int{5, 5}, "[0 1 0 1 0 1 0 1 0 1]"},
		{[]int{7, 3}, "[0 1 0 0 0 1 0 0 1 0]"},
		{[]int{1, 1, 1}, "[0 1 2]"},
	}
	for _, tt := range tests {
		if got := fmt.Sprint(spreadPattern(tt.split)); got != tt.want {
			t.Errorf("spreadPattern(%v) = %s, want %s", tt.split, got, tt.want)
		}
	}
}

// TestStalls: a phase's note names the answers slower than stallAfter,
// failed requests aside, and says nothing when there were none.
func TestStalls(t *testing.T) {
	t0 := time.Unix(1_763_000_000, 0)
	answer := func(took time.Duration, err error) shot {
		return shot{sent: t0, answered: t0.Add(took), err: err}
	}
	tests := []struct {
		name  string
		shots []shot
		want  string
	}{
		{"none", []shot{answer(time.Millisecond, nil), answer(stallAfter, nil)}, ""},
		{"two slow", []shot{answer(time.Millisecond, nil), answer(stallAfter+1, nil), answer(time.Second, nil)}, "; 2 answers took over 250ms"},
		{"a failed request is not an answer", []shot{answer(time.Second, io.EOF)}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := stalls(tt.shots)
			if !strings.HasPrefix(got, tt.want) || (tt.want == "") != (got == "") {
				t.Fatalf("stalls = %q, want it to start with %q", got, tt.want)
			}
		})
	}
}
