package regions

import (
	"context"
	"testing"
)

// queue is an in-memory network for a few regions and one coordinator:
// messages wait until deliver hands them over, in the order sent.
type queue struct {
	msgs []queued
}

type queued struct {
	to Node
	m  Message
}

func (q *queue) Send(to Node, m Message) { q.msgs = append(q.msgs, queued{to, m}) }

// deliver hands every message (and those they cause) to the regions and
// the coordinator, at now.
func (q *queue) deliver(t *testing.T, regs map[string]*Region, coord *Coordinator, now int64) {
	t.Helper()
	for len(q.msgs) > 0 {
		next := q.msgs[0]
		q.msgs = q.msgs[1:]
		switch next.to {
		case ToCoordinators:
			if err := coord.Handle(next.m, now); err != nil {
				t.Fatalf("coordinator: %v", err)
			}
		case ToRegions:
			for _, r := range regs {
				if err := r.Handle(context.Background(), next.m, now); err != nil {
					t.Fatalf("region %s: %v", r.Name(), err)
				}
			}
		default:
			if err := regs[string(next.to)].Handle(context.Background(), next.m, now); err != nil {
				t.Fatalf("region %s: %v", next.to, err)
			}
		}
	}
}

// TestRegionLendsUnderTheLimitItsLedgerHolds: a key whose limit an
// override or a penalty cut is decided in its region under the cut limit,
// while the aggregator counts its demand under the rule's: the region
// reports it under the limit its ledger holds, and units of that limit
// move to it like any other counter's.
func TestRegionLendsUnderTheLimitItsLedgerHolds(t *testing.T) {
	for _, kind := range []Kind{FixedWindow, SlidingWindow, Bucket} {
		t.Run(kind.String(), func(t *testing.T) {
			ctx := context.Background()
			cfg := Config{}.WithDefaults()
			fleet := EqualFleet("r1", "r2")
			rule := Limit{Kind: kind, Units: 300, Window: 10 * sec}
			cut := rule
			cut.Units = 100 // a share of 50 in each region
			q := &queue{}
			start := int64(1000*sec + 300_000)
			regs := map[string]*Region{}
			ledgers := map[string]*Ledger{}
			for _, name := range []string{"r1", "r2"} {
				l, err := NewLedger(cfg, fleet, name)
				if err != nil {
					t.Fatal(err)
				}
				r, err := NewRegion(cfg, fleet, name, l, q, nil, start)
				if err != nil {
					t.Fatal(err)
				}
				regs[name], ledgers[name] = r, l
			}
			e := NewEpoch(1, 0)
			coord, err := NewCoordinator(cfg, fleet, e, q, nil)
			if err != nil {
				t.Fatal(err)
			}
			regs["r1"].Lead(e, start)
			// r2's gateways decide the key under the cut limit, far above
			// it; the aggregator counts the demand under the rule's.
			admitted := func(now int64) (n int64) {
				for range 100 {
					a, err := ledgers["r2"].Admit("k", cut, 1, now)
					if err != nil {
						t.Fatal(err)
					}
					if a.Allowed {
						n++
					}
					regs["r2"].Observe("k", rule, 1, a.Allowed)
				}
				return n
			}
			if n := admitted(start); n != 50 {
				t.Fatalf("r2 admitted %d under the cut limit before any loan, want its static share 50", n)
			}
			var got int64
			for p := int64(1); p <= 4 && got <= 50; p++ {
				now := (1000+p)*sec + 10
				for _, r := range regs {
					if err := r.Tick(ctx, now); err != nil {
						t.Fatalf("period %d: tick: %v", p, err)
					}
				}
				q.deliver(t, regs, coord, now)
				plan := now + cfg.PlanOffset
				coord.Tick(plan)
				q.deliver(t, regs, coord, plan)
				in, ok := ledgers["r2"].Inspect("k", plan+cfg.Skew)
				if !ok {
					t.Fatal("r2 holds no ledger for the key")
				}
				got = in.Share
				if kind == FixedWindow {
					got = in.Windows[0].Share
				}
				admitted(plan + cfg.Skew)
			}
			if got <= 50 {
				t.Fatalf("r2's share of the cut limit is %d after four periods: no loan (its static share is 50)", got)
			}
			if in, _ := ledgers["r1"].Inspect("k", (1005)*sec); in.Kind != kind {
				t.Fatalf("r1 gave under another kind: %+v", in)
			}
		})
	}
}
