package regions

import (
	"context"
	"testing"
)

// queue is an in-memory network for a few regions and one coordinator:
// messages wait until deliver hands them over, in the order sent.
type queue struct {
	msgs []queued
	// sent is every message sent, when kept (keep).
	sent []queued
	keep bool
}

type queued struct {
	to Node
	m  Message
}

func (q *queue) Send(to Node, m Message) {
	q.msgs = append(q.msgs, queued{to, m})
	if q.keep {
		q.sent = append(q.sent, queued{to, m})
	}
}

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
// move to it like any other counter's, from a region whose ledger still
// holds the rule's limit (its gateways have not decided the key since).
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
			regs, ledgers := newAgents(t, cfg, fleet, q, start, "r1", "r2")
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
			// r1 decided the key once under the rule's limit before the
			// override reached it, and not since: its ledger holds the
			// rule's limit and no loans, and is carried over by the order.
			if _, err := ledgers["r1"].Admit("k", rule, 1, start-sec); err != nil {
				t.Fatal(err)
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

// TestLedgerLimitChangeVoidsLoans: a limit changed under a counter while
// units are lent (a penalty applied, then lifted) leaves the loans made
// under the old limit void in both regions: the receiver stops counting
// them at once, the giver keeps their units out until they come back, and
// neither extends nor applies them again. So the shares sum to at most
// the limit both regions decide under, whatever was lent under another.
func TestLedgerLimitChangeVoidsLoans(t *testing.T) {
	for _, kind := range []Kind{FixedWindow, SlidingWindow, Bucket} {
		t.Run(kind.String(), func(t *testing.T) {
			ctx := context.Background()
			cfg := Config{}.WithDefaults()
			fleet := EqualFleet("r1", "r2")
			full := Limit{Kind: kind, Units: 100, Window: 10 * sec}
			cut := full
			cut.Units = 20
			giver, receiver := newLedger(t, cfg, fleet, "r1"), newLedger(t, cfg, fleet, "r2")
			now := int64(1000 * sec)
			slot := now / full.slotLen(cfg)
			e := NewEpoch(1, 0)
			lend := func(seq uint64, lim Limit, units int64, at int64) Loan {
				t.Helper()
				o := &Order{Epoch: e, Loan: Loan{ID: LoanID{Epoch: e, Seq: seq}, Counter: "k", Limit: lim,
					From: "r1", To: "r2", Units: units, First: slot, Last: slot + 1}}
				loan, refused, err := giver.Give(ctx, o, 0, at)
				if err != nil || refused != "" {
					t.Fatalf("give %d: %+v %q %v", seq, loan, refused, err)
				}
				if ok, why, err := receiver.Receive(ctx, &Transfer{Loan: loan}, at+1000); !ok || err != nil {
					t.Fatalf("receive %d: %q %v", seq, why, err)
				}
				return loan
			}
			shares := func(at int64) (g, r int64) {
				t.Helper()
				share := func(l *Ledger) int64 {
					in, ok := l.Inspect("k", at)
					if !ok {
						t.Fatal("no ledger")
					}
					if kind == FixedWindow {
						return in.Windows[0].Share
					}
					return in.Share
				}
				return share(giver), share(receiver)
			}
			decideUnder := func(lim Limit, at int64) {
				t.Helper()
				for _, l := range []*Ledger{giver, receiver} {
					if _, err := l.Admit("k", lim, 0, at); err != nil {
						t.Fatal(err)
					}
				}
			}
			loan := lend(1, full, 40, now)
			at := now + cfg.Skew + 2000
			if g, r := shares(at); g != 10 || r != 90 {
				t.Fatalf("before the penalty: shares %d and %d, want 10 and 90", g, r)
			}
			// The penalty reaches both regions' gateways.
			decideUnder(cut, at)
			g, r := shares(at)
			if r != 10 || max(g, 0)+r > cut.Units {
				t.Fatalf("under the penalty: shares %d and %d, want the receiver at its static 10 and at most %d in all", g, r, cut.Units)
			}
			// The void loan is neither extended nor applied again.
			ext := &Order{Epoch: e, Extend: true, Loan: loan}
			ext.Loan.Limit, ext.Loan.Units, ext.Loan.Last = cut, 10, slot+2
			if _, refused, err := giver.Give(ctx, ext, 0, at); err != nil || refused != RefusedLimit {
				t.Fatalf("extension of a void loan: refused %q, %v; want %q", refused, err, RefusedLimit)
			}
			again := loan
			again.Limit, again.Units = cut, 10
			if ok, why, err := receiver.Receive(ctx, &Transfer{Loan: again}, at); ok || err != nil || why != RefusedLimit {
				t.Fatalf("a void loan's transfer again: applied %v %q %v, want refused %q", ok, why, err, RefusedLimit)
			}
			// Under the penalty the other way: r2 lends r1 5 of its 10.
			o := &Order{Epoch: e, Loan: Loan{ID: LoanID{Epoch: e, Seq: 2}, Counter: "k", Limit: cut,
				From: "r2", To: "r1", Units: 5, First: slot, Last: slot + 1}}
			back, refused, err := receiver.Give(ctx, o, 0, at)
			if err != nil || refused != "" || back.Units != 5 {
				t.Fatalf("give under the penalty: %+v %q %v", back, refused, err)
			}
			if ok, why, err := giver.Receive(ctx, &Transfer{Loan: back}, at+1000); !ok || err != nil {
				t.Fatalf("receive under the penalty: %q %v", why, err)
			}
			if g, r := shares(at + 2000); g != -25 || r != 5 {
				t.Fatalf("under the penalty, r2 having lent 5: shares %d and %d, want -25 (nothing) and 5", g, r)
			}
			// Lifted: the loan made under the penalty is void in turn, and
			// what each lent stays out.
			decideUnder(full, at+3000)
			if g, r := shares(at + 3000); g != 10 || r != 45 {
				t.Fatalf("lifted: shares %d and %d, want 50-40 and 50-5", g, r)
			}
		})
	}
}
