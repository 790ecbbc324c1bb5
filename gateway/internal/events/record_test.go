package events_test

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// TestRecordDoesNotAllocate counts the allocations of Record and Report
// exactly (no Run: nothing else in the process allocates): none, whether
// the event fits the open chunk, seals it and takes the next one, or is
// dropped because memory is full, and with shadow rules' ids to write.
func TestRecordDoesNotAllocate(t *testing.T) {
	c := startKafka(t, 0, "")
	cfg := testConfig(t, c.Addrs(), t.TempDir())
	cfg.MemoryBytes = 1 << 20 // 32 chunks of 32 KiB: ~8000 events, then drops
	p := newProducer(t, cfg)
	reqs, ds := benchDecisions()
	// Decisions beyond the schema's bounds are corrected without
	// allocating too.
	ds[1].Endpoint = "/" + strings.Repeat("é", 4000)
	ds[2].Time = time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	ds[3].Cost, ds[3].RetryAfter = -7, 1<<62
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
	// The ids of shadow rules that would have rejected cost none either.
	_, shadow := decision(5)
	shadow.Rules = append(shadow.Rules, guard.RuleResult{ID: "shadow-a", Shadow: true}, guard.RuleResult{ID: "shadow-b", Shadow: true})
	if allocs := testing.AllocsPerRun(1000, func() { p.Record(reqs[0], shadow, "proxy") }); allocs != 0 {
		t.Fatalf("Record allocates %v times per call for a decision with shadow rejections", allocs)
	}
	if p.metric(t, "tollgate_events_recorded_total") == 0 || p.metric(t, "tollgate_events_dropped_total") == 0 {
		t.Fatalf("the run did not cover both paths: recorded %v, dropped %v",
			p.metric(t, "tollgate_events_recorded_total"), p.metric(t, "tollgate_events_dropped_total"))
	}
}

// TestRecordKeepsEventsWithinBounds records decisions the aggregator would
// refuse as they are — a Redis time in 2099 or 1970, a 950 KB endpoint, a
// cost of 9e18 — and reads them back from Kafka: every one arrives, within
// the bounds, and the corrections are counted, with no allocation.
func TestRecordKeepsEventsWithinBounds(t *testing.T) {
	t.Parallel()
	c := startKafka(t, 0, "")
	p := start(t, testConfig(t, c.Addrs(), t.TempDir()))
	before := time.Now()
	req, future := decision(1)
	future.Time = time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	_, past := decision(2)
	past.Time = 1
	_, long := decision(3)
	long.Endpoint = "/" + strings.Repeat("e", 950_000)
	_, costly := decision(6)
	costly.Allowed, costly.Status, costly.Cost = true, 200, 9_000_000_000_000_000_000
	ds := []*guard.Decision{future, past, long, costly}
	for _, d := range ds {
		p.Record(req, d, "proxy")
	}
	p.waitDrained(t, 30*time.Second)
	after := time.Now()
	recs := readAll(t, c.Addrs())
	if len(recs) != len(ds) {
		t.Fatalf("%d events in Kafka, want %d", len(recs), len(ds))
	}
	for _, r := range recs {
		ev := &tollgatev1.DecisionEvent{}
		if err := proto.Unmarshal(r.Value, ev); err != nil {
			t.Fatal(err)
		}
		at := time.UnixMicro(ev.TimeUnixMicros)
		if at.Before(before.Add(-time.Second)) || at.After(after.Add(time.Second)) {
			t.Errorf("event time %v, want the gateway's clock (%v..%v)", at, before, after)
		}
		if len(ev.Endpoint) > tollgatev1.MaxEndpointLen || ev.Cost < 0 || ev.Cost > tollgatev1.MaxCost {
			t.Errorf("endpoint of %d bytes, cost %d", len(ev.Endpoint), ev.Cost)
		}
	}
	for field, want := range map[string]float64{"time": 2, "length": 1, "cost": 1} {
		if got := p.metric(t, "tollgate_events_corrected_total", "field", field); got != want {
			t.Errorf("corrected{field=%q} = %v, want %v", field, got, want)
		}
	}
	if d := p.metric(t, "tollgate_events_dropped_total"); d != 0 {
		t.Errorf("%v events dropped", d)
	}
}
