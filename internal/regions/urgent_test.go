package regions

import (
	"context"
	"testing"
)

// urgentFleet is two regions of the default configuration, their agents
// over exact ledgers, a coordinator in r1 and a queue between them, all
// having reported once at start (a period boundary) and planned nothing.
func urgentFleet(t *testing.T, start int64) (map[string]*Region, map[string]*Ledger, *Coordinator, *queue) {
	t.Helper()
	ctx := context.Background()
	cfg := Config{}.WithDefaults()
	fleet := EqualFleet("r1", "r2")
	q := &queue{}
	regs, ledgers := newAgents(t, cfg, fleet, q, start-1, "r1", "r2")
	coord, err := NewCoordinator(cfg, fleet, NewEpoch(1, 0), q, nil)
	if err != nil {
		t.Fatal(err)
	}
	regs["r1"].Lead(coord.Epoch(), start)
	for _, r := range regs {
		if err := r.Tick(ctx, start); err != nil {
			t.Fatal(err)
		}
	}
	q.deliver(t, regs, coord, start)
	coord.Tick(start + cfg.PlanOffset)
	q.deliver(t, regs, coord, start+cfg.PlanOffset)
	return regs, ledgers, coord, q
}

// TestUrgentReportPlannedAtOnce: a counter that was cold at the last
// period boundary and whose demand now outruns its region's share is
// reported within the period (once), its demand so far scaled to a whole
// period, and the coordinator plans it at once: the loan lands in the
// same period, not after the next boundary and plan. A counter whose
// share covers its demand is not reported before the boundary.
func TestUrgentReportPlannedAtOnce(t *testing.T) {
	lim := Limit{Kind: FixedWindow, Units: 100, Window: sec}
	tests := []struct {
		name    string
		demand  int   // requests in the period before at
		at      int64 // µs into the period
		urgent  bool  // reported within the period
		minDiff int64
	}{
		// 80 requests in 400 ms: 200 in a period of 1 s, against 50.
		{"demand beyond the share", 80, 400_000, true, 20},
		// 30 in 900 ms: 33 in a period, 41 with the headroom: hot, but
		// within the share of 50.
		{"demand within the share", 30, 900_000, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			start := int64(1_763_000_000) * sec
			regs, ledgers, coord, q := urgentFleet(t, start)
			r1, l1 := regs["r1"], ledgers["r1"]
			for i := range tt.demand {
				now := start + 10_000 + int64(i)*(tt.at-10_000)/int64(tt.demand)
				a, err := l1.Admit("c", lim, 1, now)
				if err != nil {
					t.Fatal(err)
				}
				r1.Observe("c", lim, 1, a.Allowed)
			}
			now := start + tt.at
			if err := r1.Tick(ctx, now); err != nil {
				t.Fatal(err)
			}
			var reports []*Report
			for _, m := range q.msgs {
				if rep, ok := m.m.(*Report); ok {
					reports = append(reports, rep)
				}
			}
			if got := len(reports) == 1 && reports[0].Urgent; got != tt.urgent {
				t.Fatalf("urgent report sent = %v (%d reports), want %v", got, len(reports), tt.urgent)
			}
			if tt.urgent {
				if c := reports[0].Counters; len(c) != 1 || c[0].Counter != "c" || c[0].Demand != int64(tt.demand)*sec/tt.at {
					t.Fatalf("urgent report counters %+v, want c with demand %d", c, int64(tt.demand)*sec/tt.at)
				}
			}
			q.deliver(t, regs, coord, now)
			st, err := l1.State(ctx, "c", lim, now+2*DefaultSkew)
			if err != nil {
				t.Fatal(err)
			}
			static := l1.Static(lim.Units)
			if st.Share < static+tt.minDiff || (!tt.urgent && st.Share != static) {
				t.Fatalf("r1's share %d in the period the demand came, want %d + at least %d", st.Share, static, tt.minDiff)
			}
			// Once a period: ticking again in it reports nothing.
			if err := r1.Tick(ctx, now+50_000); err != nil {
				t.Fatal(err)
			}
			if len(q.msgs) != 0 {
				t.Fatalf("a second tick in the period sent %d messages, want none", len(q.msgs))
			}
		})
	}
}

// TestUrgentReportDuplicateOrdersNothing: the loans an urgent plan
// ordered count as out until the givers report them, so a second urgent
// plan of the counter in the period (a duplicated report) orders no more.
func TestUrgentReportDuplicateOrdersNothing(t *testing.T) {
	lim := Limit{Kind: FixedWindow, Units: 100, Window: sec}
	start := int64(1_763_000_000) * sec
	_, ledgers, coord, q := urgentFleet(t, start)
	st, err := ledgers["r1"].State(context.Background(), "c", lim, start)
	if err != nil {
		t.Fatal(err)
	}
	rep := &Report{Region: "r1", Epoch: coord.Epoch(), Time: start + 400_000, Urgent: true,
		Counters: []CounterReport{{Counter: "c", Limit: lim, Share: st.Share, Used: st.Share, Demand: 200, Rejected: 20}}}
	orders := func() (n int, units int64) {
		for _, m := range q.msgs {
			if o, ok := m.m.(*Order); ok {
				n++
				units += o.Loan.Units
			}
		}
		q.msgs = nil
		return n, units
	}
	if err := coord.Handle(rep, start+400_000); err != nil {
		t.Fatal(err)
	}
	if n, units := orders(); n == 0 || units == 0 {
		t.Fatalf("urgent report: %d orders of %d units, want some", n, units)
	}
	if err := coord.Handle(rep, start+450_000); err != nil {
		t.Fatal(err)
	}
	if n, units := orders(); n != 0 {
		t.Fatalf("the same urgent report again: %d orders of %d units, want none", n, units)
	}
}

// TestGiverKeepsWhatNewDemandNeeds: a region whose demand for a counter
// began in this period, ordered to lend units of the current fixed
// window, keeps what that demand needs for the rest of the window at its
// rate so far, not at the few units the period's part has counted (an
// urgent plan early in a period would otherwise take them).
func TestGiverKeepsWhatNewDemandNeeds(t *testing.T) {
	lim := Limit{Kind: FixedWindow, Units: 100, Window: sec}
	start := int64(1_763_000_000) * sec
	regs, ledgers, coord, q := urgentFleet(t, start)
	r2, l2 := regs["r2"], ledgers["r2"]
	// 10 requests in the first 250 ms: 40 per second.
	for i := range 10 {
		a, err := l2.Admit("c", lim, 1, start+int64(i)*25_000)
		if err != nil {
			t.Fatal(err)
		}
		r2.Observe("c", lim, 1, a.Allowed)
	}
	given := orderGive(t, r2, q, coord.Epoch(), lim, start+250_000)
	// Its share 50, 10 used, and the rest of the window at 40 per second
	// is 30 more: at most 10 to give.
	if given < 0 || given > 10 {
		t.Fatalf("r2 gave %d units of the current window, want 0 to 10", given)
	}
}

// TestCoordinatorReturnsUnitsOfAReversedFlow: r2 lent r1 its share of
// the coming windows; then the client moves to r2. The coordinator orders
// r1 to lend r2 r1's own share and r2's units back, not r1's share alone
// (with which r2 would hold half of L where it holds all the demand).
func TestCoordinatorReturnsUnitsOfAReversedFlow(t *testing.T) {
	lim := Limit{Kind: FixedWindow, Units: 100, Window: sec}
	cfg := Config{}.WithDefaults()
	q := &queue{}
	coord, err := NewCoordinator(cfg, EqualFleet("r1", "r2"), NewEpoch(1, 0), q, nil)
	if err != nil {
		t.Fatal(err)
	}
	start := int64(1_763_000_000) * sec
	w := start / sec
	lent := LoanState{ID: LoanID{Epoch: coord.Epoch(), Seq: 1}, To: "r1", Units: 50, First: w, Last: w + 1}
	for _, rep := range []*Report{
		{Region: "r1", Epoch: coord.Epoch(), Time: start, Counters: []CounterReport{{Counter: "c", Limit: lim, Share: 100}}},
		{Region: "r2", Epoch: coord.Epoch(), Time: start, Counters: []CounterReport{
			{Counter: "c", Limit: lim, Share: 0, Used: 0, Demand: 200, Rejected: 200, Out: []LoanState{lent}}}},
	} {
		if err := coord.Handle(rep, start); err != nil {
			t.Fatal(err)
		}
	}
	coord.Tick(start + cfg.PlanOffset)
	var units int64
	for _, m := range q.msgs {
		if o, ok := m.m.(*Order); ok && o.Loan.From == "r1" && o.Loan.To == "r2" && o.Loan.First <= w+1 && w+1 <= o.Loan.Last {
			units += o.Loan.Units
		}
	}
	if units != 100 {
		t.Fatalf("ordered r1 to lend r2 %d units of the next window, want 100 (its own 50 and r2's 50 back)", units)
	}
}

// TestCoordinatorCurrentWindowLoanApart: a plan late in a window orders
// the current window and the next as two loans, so what the giver has
// used of the current window (a loan gets the least room of its windows)
// does not cap what it lends of the next.
func TestCoordinatorCurrentWindowLoanApart(t *testing.T) {
	lim := Limit{Kind: FixedWindow, Units: 100, Window: sec}
	cfg := Config{Period: sec / 2}.WithDefaults()
	q := &queue{}
	coord, err := NewCoordinator(cfg, EqualFleet("r1", "r2"), NewEpoch(1, 0), q, nil)
	if err != nil {
		t.Fatal(err)
	}
	start := int64(1_763_000_000)*sec + sec/2 // the second period of window w
	w := start / sec
	for _, rep := range []*Report{
		{Region: "r1", Epoch: coord.Epoch(), Time: start, Counters: []CounterReport{{Counter: "c", Limit: lim, Share: 50, Used: 40, Demand: 35}}},
		{Region: "r2", Epoch: coord.Epoch(), Time: start, Counters: []CounterReport{{Counter: "c", Limit: lim, Share: 50, Used: 10, Demand: 15}}},
	} {
		if err := coord.Handle(rep, start); err != nil {
			t.Fatal(err)
		}
	}
	coord.Tick(start + cfg.PlanOffset)
	var spans [][2]int64
	for _, m := range q.msgs {
		if o, ok := m.m.(*Order); ok {
			spans = append(spans, [2]int64{o.Loan.First - w, o.Loan.Last - w})
		}
	}
	if len(spans) != 2 || spans[0] != [2]int64{0, 0} || spans[1] != [2]int64{1, 1} {
		t.Fatalf("loans ordered for windows %v (relative to the current), want [0 0] and [1 1]", spans)
	}
}

// TestCoordinatorPassesOnBorrowedUnits: with three regions, r2 and r3
// lent r1 their shares of the coming windows; then the client moves from
// r1 to r2. The coordinator orders r1 to lend r2 all it holds of the next
// window, r3's units too, not r1's own share and r2's back alone (with
// which r2 would hold two thirds of L while r3's third sat unused in r1).
func TestCoordinatorPassesOnBorrowedUnits(t *testing.T) {
	lim := Limit{Kind: FixedWindow, Units: 99, Window: sec}
	cfg := Config{}.WithDefaults()
	q := &queue{}
	coord, err := NewCoordinator(cfg, EqualFleet("r1", "r2", "r3"), NewEpoch(1, 0), q, nil)
	if err != nil {
		t.Fatal(err)
	}
	start := int64(1_763_000_000) * sec
	w := start / sec
	from2 := LoanState{ID: LoanID{Epoch: coord.Epoch(), Seq: 1}, To: "r1", Units: 33, First: w, Last: w + 1}
	from3 := LoanState{ID: LoanID{Epoch: coord.Epoch(), Seq: 2}, To: "r1", Units: 33, First: w, Last: w + 1}
	for _, rep := range []*Report{
		{Region: "r1", Epoch: coord.Epoch(), Time: start, Counters: []CounterReport{{Counter: "c", Limit: lim, Share: 99}}},
		{Region: "r2", Epoch: coord.Epoch(), Time: start, Counters: []CounterReport{
			{Counter: "c", Limit: lim, Share: 0, Demand: 200, Rejected: 200, Out: []LoanState{from2}}}},
		{Region: "r3", Epoch: coord.Epoch(), Time: start, Counters: []CounterReport{
			{Counter: "c", Limit: lim, Share: 0, Out: []LoanState{from3}}}},
	} {
		if err := coord.Handle(rep, start); err != nil {
			t.Fatal(err)
		}
	}
	coord.Tick(start + cfg.PlanOffset)
	var units int64
	for _, m := range q.msgs {
		if o, ok := m.m.(*Order); ok && o.Loan.To == "r2" && o.Loan.First <= w+1 && w+1 <= o.Loan.Last {
			if o.Loan.From != "r1" {
				t.Errorf("ordered %s, which lent its units of the window, to lend r2 %d more", o.Loan.From, o.Loan.Units)
				continue
			}
			units += o.Loan.Units
		}
	}
	if units != 99 {
		t.Fatalf("ordered r1 to lend r2 %d units of the next window, want 99 (its own 33, r2's 33 back and r3's 33)", units)
	}
}

// TestGiverKeepsWhatDemandJustBegunNeeds: a region whose demand for a
// counter began 100 ms ago, 650 ms into the period, ordered to lend units
// of the current fixed window, keeps what that demand needs for the rest
// of the window at its rate since it began (100 per second), not at the
// rate of the whole period so far (13 per second), which would lend what
// the next 250 ms need.
func TestGiverKeepsWhatDemandJustBegunNeeds(t *testing.T) {
	ctx := context.Background()
	lim := Limit{Kind: FixedWindow, Units: 100, Window: sec}
	start := int64(1_763_000_000) * sec
	regs, ledgers, coord, q := urgentFleet(t, start)
	r2, l2 := regs["r2"], ledgers["r2"]
	for now := start + 100_000; now <= start+600_000; now += 100_000 {
		if err := r2.Tick(ctx, now); err != nil {
			t.Fatal(err)
		}
	}
	// 10 requests from 650 ms to 750 ms: 100 per second.
	for i := range 10 {
		a, err := l2.Admit("c", lim, 1, start+650_000+int64(i)*10_000)
		if err != nil {
			t.Fatal(err)
		}
		r2.Observe("c", lim, 1, a.Allowed)
	}
	now := start + 750_000
	if err := r2.Tick(ctx, now-50_000); err != nil { // the step that sees them
		t.Fatal(err)
	}
	q.msgs = nil
	given := orderGive(t, r2, q, coord.Epoch(), lim, now)
	// Its share 50, 10 used; the rest of the window at 100 per second is
	// 25 more (the rate floored at a quarter period's: 40 per quarter
	// second, 50 over the window with the headroom, 12 of them in the
	// 250 ms left): at most 28 to give, where the period's rate gave 36.
	if given < 0 || given > 28 {
		t.Fatalf("r2 gave %d units of the current window, want 0 to 28", given)
	}
}

// orderGive orders r2 to lend r1 40 units of counter c's current window
// at now, and returns the units r2's give result names (-1: none).
func orderGive(t *testing.T, r2 *Region, q *queue, e Epoch, lim Limit, now int64) int64 {
	t.Helper()
	o := &Order{Epoch: e, Loan: Loan{ID: LoanID{Epoch: e, Seq: 99}, Counter: "c", Limit: lim,
		From: "r2", To: "r1", Units: 40, First: now / sec, Last: now / sec}}
	if err := r2.Handle(context.Background(), o, now); err != nil {
		t.Fatal(err)
	}
	var given int64 = -1
	for _, m := range q.msgs {
		if g, ok := m.m.(*GiveResult); ok {
			given = g.Loan.Units
		}
	}
	return given
}
