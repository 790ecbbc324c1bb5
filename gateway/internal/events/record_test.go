package events_test

import (
	"testing"

	"github.com/tollgate/tollgate/guard"
)

// TestRecordDoesNotAllocate counts the allocations of Record and Report
// exactly (no Run: nothing else in the process allocates): none, whether
// the event fits the open chunk, seals it and takes the next one, or is
// dropped because memory is full.
func TestRecordDoesNotAllocate(t *testing.T) {
	c := startKafka(t, 0, "")
	cfg := testConfig(t, c.ListenAddrs(), t.TempDir())
	cfg.MemoryBytes = 1 << 20 // 32 chunks of 32 KiB: ~8000 events, then drops
	p := newProducer(t, cfg)
	reqs, ds := benchDecisions()
	report := &guard.Decision{Status: 200, Tenant: "acme", KeyID: "kid", Endpoint: "/v1/x", Cost: 3, Deciding: -1}
	i := 0
	allocs := testing.AllocsPerRun(20_000, func() {
		p.Record(reqs[i%len(reqs)], ds[i%len(ds)], "proxy")
		p.Report(reqs[i%len(reqs)], report, "report")
		i++
	})
	if allocs != 0 {
		t.Fatalf("Record and Report allocate %v times per call", allocs)
	}
	if p.metric(t, "tollgate_events_recorded_total") == 0 || p.metric(t, "tollgate_events_dropped_total") == 0 {
		t.Fatalf("the run did not cover both paths: recorded %v, dropped %v",
			p.metric(t, "tollgate_events_recorded_total"), p.metric(t, "tollgate_events_dropped_total"))
	}
}
