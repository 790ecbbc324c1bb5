package regions

import (
	"cmp"
	"context"
	"slices"
	"testing"
)

// goneRun drives the two regions of urgentFleet: a paced client of one
// fixed-window counter sends rate requests per second to region at(t)
// (t: µs since start; "": lost), each decision counted by its region's agent lag
// µs after it was made, with its time; every region and the coordinator
// step every tenth of a period, as the aggregator does. It stops at end
// and returns every report the regions sent.
type goneRun struct {
	t       *testing.T
	regs    map[string]*Region
	ledgers map[string]*Ledger
	coord   *Coordinator
	q       *queue
	start   int64
	lim     Limit
	// pending decisions, counted once their time plus lag has come.
	pending []pendingDecision
}

type pendingDecision struct {
	region      string
	at, counted int64
	allowed     bool
}

func newGoneRun(t *testing.T, lim Limit) *goneRun {
	start := int64(1_763_000_000) * sec
	regs, ledgers, coord, q := urgentFleet(t, start)
	q.keep = true
	return &goneRun{t: t, regs: regs, ledgers: ledgers, coord: coord, q: q, start: start, lim: lim}
}

// run sends the client's requests from..to (µs since start) at rate per
// second to region(t), stepping the fleet as it goes.
func (g *goneRun) run(from, to int64, rate float64, lag int64, region func(t int64) string) {
	g.t.Helper()
	ctx := context.Background()
	step := int64(DefaultPeriod / 10)
	gap := int64(float64(sec) / rate)
	next := from
	for now := from; now < to; now += 1000 {
		for ; next <= now; next += gap {
			name := region(next)
			if name == "" {
				continue // the gateway stalled: the request is lost
			}
			a, err := g.ledgers[name].Admit("c", g.lim, 1, g.start+next)
			if err != nil {
				g.t.Fatal(err)
			}
			g.pending = append(g.pending, pendingDecision{region: name, at: g.start + next, counted: g.start + next + lag, allowed: a.Allowed})
		}
		abs := g.start + now
		slices.SortStableFunc(g.pending, func(a, b pendingDecision) int { return cmp.Compare(a.counted, b.counted) })
		for len(g.pending) > 0 && g.pending[0].counted <= abs {
			p := g.pending[0]
			g.pending = g.pending[1:]
			g.regs[p.region].ObserveAt("c", g.lim, 1, p.allowed, p.at)
		}
		if now%step != 0 {
			continue
		}
		for _, name := range []string{"r1", "r2"} {
			if err := g.regs[name].Tick(ctx, abs); err != nil {
				g.t.Fatal(err)
			}
		}
		g.coord.Tick(abs)
		g.q.deliver(g.t, g.regs, g.coord, abs)
	}
}

// reports are the reports sent since the run began, or since sent was
// last cleared.
func (g *goneRun) reports() []*Report {
	var out []*Report
	for _, m := range g.q.sent {
		if rep, ok := m.m.(*Report); ok {
			out = append(out, rep)
		}
	}
	return out
}

// goneReports are the urgent reports of region with the counter's demand
// 0 (its demand found gone), sent at or after from (µs since start).
func (g *goneRun) goneReports(region string, from int64) []*Report {
	var out []*Report
	for _, rep := range g.reports() {
		if rep.Region == region && rep.Urgent && rep.Time >= g.start+from {
			for _, cr := range rep.Counters {
				if cr.Counter == "c" && cr.Demand == 0 {
					out = append(out, rep)
				}
			}
		}
	}
	return out
}

// TestDemandGoneMovesUnitsAtOnce: a client at four times the limit in
// r1, which has borrowed r2's units, moves to r2. r1's ledger admits
// nothing of it from then on though its share has room, and no decision
// made since reaches its agent, so r1 reports the counter's demand gone
// (an urgent report, demand 0) and lends what it holds to r2 at once: r2
// holds at least 90 % of the limit 40 % into the first whole window after
// the move, where before it waited until r1's demand, counted over two
// periods, had fallen (the next plan but one). A decision made after the
// demand went brings it back; one made before does not.
func TestDemandGoneMovesUnitsAtOnce(t *testing.T) {
	lim := Limit{Kind: FixedWindow, Units: 100, Window: 2 * sec}
	tests := []struct {
		name string
		lag  int64 // µs from a decision to its agent
		move int64 // µs since start
	}{
		{"decisions 50 ms late, move early in a window", 50_000, 6_300_000},
		{"decisions 50 ms late, move late in a window", 50_000, 7_700_000},
		{"decisions 300 ms late", 300_000, 6_900_000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			where := func(at int64) string {
				if at < tt.move {
					return "r1"
				}
				return "r2"
			}
			g := newGoneRun(t, lim)
			// The first whole window after the move, and 40 % into it.
			first := (fdiv(g.start+tt.move, lim.Window) + 1) * lim.Window
			check := first - g.start + lim.Window*2/5
			g.run(0, check, 200, tt.lag, where)
			if len(g.goneReports("r1", tt.move)) == 0 {
				t.Errorf("r1 reported no demand gone after the move")
			}
			st, err := g.ledgers["r2"].State(context.Background(), "c", lim, g.start+check)
			if err != nil {
				t.Fatal(err)
			}
			if st.Share < lim.Units*9/10 {
				t.Fatalf("r2's share %d of the first whole window after the move, 40 %% into it; want ≥ %d", st.Share, lim.Units*9/10)
			}
		})
	}
	t.Run("decisions made before and after", func(t *testing.T) {
		const move = 6_300_000
		g := newGoneRun(t, lim)
		r1 := g.regs["r1"]
		var d *demand
		for at := int64(0); at < 10*sec; at += 10_000 {
			g.run(at, at+10_000, 200, 50_000, func(t int64) string {
				if t < move {
					return "r1"
				}
				return "r2"
			})
			if d = r1.demand["c"]; d != nil && d.goneFrom != 0 {
				break
			}
		}
		if d == nil || d.goneFrom == 0 {
			t.Fatalf("r1's demand not gone after the move")
		}
		r1.ObserveAt("c", lim, 1, true, d.goneFrom-1)
		if d.goneFrom == 0 {
			t.Fatalf("a decision made before the demand went brought it back")
		}
		if dem, _ := r1.recent(d); dem != 0 {
			t.Fatalf("r1's demand %d while gone, want 0", dem)
		}
		r1.ObserveAt("c", lim, 1, true, d.goneFrom)
		if d.goneFrom != 0 {
			t.Fatalf("a decision made since the demand went left it gone")
		}
	})
}

// TestDemandGoneNotForSteadyTraffic: a client that stays, at a steady
// rate well within the share, with its decisions reaching the agent late
// (up to more than the time its rate calls for eight arrivals in), is
// never taken for gone: the ledger shows its admissions.
func TestDemandGoneNotForSteadyTraffic(t *testing.T) {
	lim := Limit{Kind: FixedWindow, Units: 100, Window: 2 * sec}
	tests := []struct {
		name string
		rate float64
		lag  int64
	}{
		{"fast, decisions on time", 45, 20_000},
		{"fast, decisions 800 ms late", 45, 800_000},
		{"slow, decisions 800 ms late", 12, 800_000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newGoneRun(t, lim)
			g.run(0, 12*sec, tt.rate, tt.lag, func(int64) string { return "r1" })
			if got := g.goneReports("r1", 0); len(got) != 0 {
				t.Fatalf("r1 reported its steady demand gone %d times, first %+v", len(got), got[0])
			}
		})
	}
}

// TestDemandGonePlannedOnlyWhereWanted: traffic split 70/30 at 90 % of
// L; r1's gateway stalls for 1.3 s (two thirds of a window), so its ledger
// admits nothing though it has room and no decision reaches its agent.
// r1 takes that for its demand gone, but no other region rejects the
// counter, so the coordinator plans nothing on it: r1 is not ordered to
// lend before the next plan at a boundary (which reads the demand the
// stall lowered, as it would without this).
func TestDemandGonePlannedOnlyWhereWanted(t *testing.T) {
	lim := Limit{Kind: FixedWindow, Units: 100, Window: 2 * sec}
	g := newGoneRun(t, lim)
	const stallFrom, stallTo = 8_600_000, 9_900_000
	var n int
	where := func(at int64) string {
		n++
		switch {
		case at >= stallFrom && at < stallTo:
			if n%10 < 7 {
				return ""
			}
			return "r2"
		case n%10 < 7:
			return "r1"
		}
		return "r2"
	}
	g.run(0, stallFrom, 45, 50_000, where)
	g.q.sent = nil
	// Until the next plan at a boundary, which reads the demand the stall
	// lowered as any plan would.
	g.run(stallFrom, 10*sec+DefaultPlanOffset-1000, 45, 50_000, where)
	var orders []*Order
	for _, m := range g.q.sent {
		if o, ok := m.m.(*Order); ok && o.Loan.From == "r1" {
			orders = append(orders, o)
		}
	}
	if len(g.goneReports("r1", stallFrom)) == 0 {
		t.Fatalf("r1 did not take the stall for its demand gone: the test shows nothing")
	}
	if len(orders) > 0 {
		t.Fatalf("r1, whose gateway stalled, was ordered to lend %+v", orders[0].Loan)
	}
}

// TestGiverKeepsItsDemandUnrounded: a giver keeps of a window its demand
// over the two periods it counts times the headroom, rounded down (but
// never below the demand itself): 16 for 7 and 6 in its last two periods
// (13.5 a window of two periods, as the 30 % side of the regions
// scenario's 70/30 split; 13 × 1.25 = 16.25), 17 for 7 and 7 (17.5). It
// kept 18 for both (its rate rounded to 7 a period, times two, times
// 1.25, rounded up): the unit or two kept for rounding is what its
// receiver lacked at the ends of its windows. A demand too small for the
// headroom to make a unit keeps the demand (2 and 1: 3).
func TestGiverKeepsItsDemandUnrounded(t *testing.T) {
	tests := []struct {
		name    string
		periods []int // decisions in each period before the order
		keep    int64
	}{
		{"7 then 6", []int{7, 7, 6, 7}, 16},
		{"7 then 7", []int{7, 7, 7, 7}, 17},
		{"2 then 1", []int{1, 1, 2, 1}, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			cfg := Config{}.WithDefaults()
			fleet := EqualFleet("r1", "r2")
			lim := Limit{Kind: FixedWindow, Units: 50, Window: 2 * sec}
			start := int64(1_763_000_000) * sec
			l := newLedger(t, cfg, fleet, "r2")
			q := &queue{}
			r2, err := NewRegion(cfg, fleet, "r2", l, q, nil, start)
			if err != nil {
				t.Fatal(err)
			}
			for k, n := range tt.periods {
				at := start + int64(k)*sec
				for i := range n {
					now := at + 10_000 + int64(i)*100_000
					a, err := l.Admit("c", lim, 1, now)
					if err != nil {
						t.Fatal(err)
					}
					r2.ObserveAt("c", lim, 1, a.Allowed, now)
				}
				if err := r2.Tick(ctx, at+sec); err != nil {
					t.Fatal(err)
				}
			}
			now := start + int64(len(tt.periods))*sec + 10_000
			next := fdiv(now, lim.Window) + 1
			e := NewEpoch(1, 0)
			q.msgs = nil
			o := &Order{Epoch: e, Loan: Loan{ID: LoanID{Epoch: e, Seq: 1}, Counter: "c", Limit: lim, From: "r2", To: "r1", Units: 25, First: next, Last: next}}
			if err := r2.Handle(ctx, o, now); err != nil {
				t.Fatal(err)
			}
			for _, m := range q.msgs {
				if g, ok := m.m.(*GiveResult); ok {
					if static := l.Static(lim.Units); g.Loan.Units != static-tt.keep {
						t.Fatalf("r2 gave %d of the next window, want %d (its static share %d less %d kept)", g.Loan.Units, static-tt.keep, static, tt.keep)
					}
					return
				}
			}
			t.Fatalf("no give result among %+v", q.msgs)
		})
	}
}
