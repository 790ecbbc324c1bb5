package aggregator

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate/tollgate/compose/natsserver/natstest"
	"github.com/tollgate/tollgate/internal/regions"
	"github.com/tollgate/tollgate/internal/regions/regionwire"
)

// TestRegionsLargeReportGoesInParts: a report whose counters do not fit
// in one NATS message (10,000 counters of 1,000-byte names) reaches the
// coordinators whole, in parts of the same time, each within the maximum
// message size.
func TestRegionsLargeReportGoesInParts(t *testing.T) {
	t.Parallel()
	ns := natstest.StartTB(t)
	nc := natstest.Connect(t, ns.ClientURL())
	sub, err := nc.SubscribeSync(regionwire.CoordinatorsSubject)
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		t.Fatal(err)
	}
	a := newRegionAgent(&Server{cfg: Config{Region: "eu", RegionsPeriod: time.Second}, log: slog.New(slog.DiscardHandler)},
		prometheus.NewRegistry())
	a.nc = nc
	lim := regions.Limit{Kind: regions.Bucket, Units: 100, Window: 60_000_000}
	rep := &regions.Report{Region: "eu", Epoch: regions.NewEpoch(1, 0), Time: 1_764_000_000_000_000}
	const n = regions.MaxReportCounters
	for i := range n {
		rep.Counters = append(rep.Counters, regions.CounterReport{Counter: fmt.Sprintf("%06d%s", i, strings.Repeat("c", 994)),
			Limit: lim, Share: 50, Demand: 10})
	}
	a.send(regions.ToCoordinators, rep)
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	parts := 0
	for len(seen) < n {
		m, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("after %d parts and %d counters: %v", parts, len(seen), err)
		}
		if len(m.Data) > regionwire.MaxMessageSize {
			t.Fatalf("a part of %d bytes", len(m.Data))
		}
		_, got, err := regionwire.Decode(m.Data, a.cfg)
		if err != nil {
			t.Fatal(err)
		}
		part := got.(*regions.Report)
		if part.Time != rep.Time || part.Region != "eu" {
			t.Fatalf("a part of another report: %+v", part)
		}
		for _, c := range part.Counters {
			if seen[c.Counter] {
				t.Fatalf("counter %.6s… sent twice", c.Counter)
			}
			seen[c.Counter] = true
		}
		parts++
	}
	t.Logf("a report of %d counters went in %d parts", n, parts)
}
