package regions

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
)

// Coordinator plans where a fleet's units should be, once per period, from
// the regions' reports: targets that follow demand, loans from the regions
// above their targets' static shares to those below, and extensions of
// the loans still wanted. It holds no state a successor needs: the
// regions' reports name every loan still out, so a new coordinator (a
// higher epoch, after a failover) extends them by their IDs. It is not
// safe for concurrent use.
type Coordinator struct {
	cfg   Config
	fleet Fleet
	epoch Epoch
	tr    Transport
	log   *slog.Logger

	seq      uint64
	deposed  bool
	planned  int64 // the period of the last plan
	reports  map[string]received
	targets  map[string][]int64
	lastPlan PlanStats
	// ordered are the new loans this coordinator ordered in the last
	// period, which the givers' reports may not list yet: an urgent plan
	// between two reports counts them as out, so as not to order the same
	// units twice.
	ordered map[LoanID]ordered
	now     int64 // the plan's time
}

// ordered is a new loan ordered, and when.
type ordered struct {
	loan Loan
	at   int64
}

// received is a region's latest report and when it arrived.
type received struct {
	rep *Report
	at  int64
}

// PlanStats counts what one plan did.
type PlanStats struct {
	Counters, Extended, New, Lapsed int
}

// NewCoordinator is a coordinator of epoch, sending through tr. A nil log
// discards.
func NewCoordinator(cfg Config, fleet Fleet, epoch Epoch, tr Transport, log *slog.Logger) (*Coordinator, error) {
	cfg = cfg.WithDefaults()
	if err := errors.Join(cfg.Validate(), fleet.Validate()); err != nil {
		return nil, fmt.Errorf("regions: new coordinator: %w", err)
	}
	if epoch == 0 || epoch.Index() >= len(fleet.Members) {
		return nil, fmt.Errorf("regions: new coordinator: %w: epoch %s", ErrInvalid, epoch)
	}
	if tr == nil {
		return nil, fmt.Errorf("regions: new coordinator: %w: a transport is required", ErrInvalid)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Coordinator{cfg: cfg, fleet: fleet, epoch: epoch, tr: tr, log: log, planned: math.MinInt64,
		reports: map[string]received{}, targets: map[string][]int64{}, ordered: map[LoanID]ordered{}}, nil
}

// Epoch is the coordinator's epoch.
func (c *Coordinator) Epoch() Epoch { return c.epoch }

// Deposed reports whether the coordinator has learned of a higher epoch
// and stopped; the owner drops it.
func (c *Coordinator) Deposed() bool { return c.deposed }

// Targets is the last plan's target share of each region for a counter
// (fleet order), or nil if the last plan did not cover it.
func (c *Coordinator) Targets(counter string) []int64 { return c.targets[counter] }

// LastPlan counts what the last plan did.
func (c *Coordinator) LastPlan() PlanStats { return c.lastPlan }

func (c *Coordinator) depose(e Epoch) {
	if e > c.epoch && !c.deposed {
		c.deposed = true
		c.log.Info("regions: coordinator deposed", "epoch", c.epoch.String(), "by", e.String())
	}
}

// Handle takes a message addressed to the coordinators. An invalid message
// is refused with an error and changes nothing.
func (c *Coordinator) Handle(m Message, now int64) error {
	if err := m.Validate(c.cfg); err != nil {
		return fmt.Errorf("regions: coordinator: %w", err)
	}
	switch m := m.(type) {
	case *Report:
		if c.fleet.Index(m.Region) < 0 {
			return fmt.Errorf("regions: coordinator: %w: report from %q, not in the fleet", ErrInvalid, m.Region)
		}
		c.depose(m.Epoch)
		prev, ok := c.reports[m.Region]
		if m.Urgent {
			c.urgent(m, prev, ok, now)
			return nil
		}
		if ok && prev.rep.Time == m.Time && prev.at >= now-c.cfg.Period {
			// The rest of a report split in parts.
			merged := *prev.rep
			merged.Counters = append(slices.Clip(merged.Counters), m.Counters...)
			c.reports[m.Region] = received{rep: &merged, at: now}
			return nil
		}
		if ok && prev.rep.Time > m.Time {
			return nil // an older report, reordered
		}
		c.reports[m.Region] = received{rep: m, at: now}
	case *Fenced:
		c.depose(m.Epoch)
	case *Heartbeat:
		c.depose(m.Epoch)
	}
	return nil
}

// Tick plans once per period, PlanOffset after its boundary; other calls
// do nothing. A deposed coordinator does nothing.
func (c *Coordinator) Tick(now int64) {
	if c.deposed {
		return
	}
	k := fdiv(now-c.cfg.PlanOffset, c.cfg.Period)
	if k <= c.planned {
		return
	}
	c.planned = k
	c.tr.Send(ToRegions, &Heartbeat{Epoch: c.epoch})
	clear(c.targets)
	c.lastPlan = PlanStats{}
	c.planAll(nil, now)
}

// urgent takes a region's urgent report: its counters replace or join
// those of the region's last report (which keeps its time, so the next
// report at a boundary replaces it), and those counters are planned at
// once. Without a recent report to join, the urgent one stands alone,
// dated just before its period's boundary for the same reason.
func (c *Coordinator) urgent(m *Report, prev received, ok bool, now int64) {
	if c.deposed {
		return
	}
	var merged Report
	if ok && now-prev.at <= c.cfg.Period+c.cfg.Period/2 {
		merged = *prev.rep
		merged.Counters = slices.DeleteFunc(slices.Clone(merged.Counters), func(cr CounterReport) bool {
			return slices.ContainsFunc(m.Counters, func(u CounterReport) bool { return u.Counter == cr.Counter })
		})
		merged.Counters = append(merged.Counters, m.Counters...)
	} else {
		merged = *m
		merged.Time = fdiv(m.Time, c.cfg.Period)*c.cfg.Period - 1
	}
	merged.Urgent = false
	c.reports[m.Region] = received{rep: &merged, at: now}
	names := map[string]bool{}
	for _, cr := range m.Counters {
		if cr.Demand == 0 && cr.Rejected == 0 && !c.rejectedElsewhere(cr.Counter, m.Region, now) {
			// A demand gone from the region: planned at once only where
			// another region wants the units. Else the next boundary's
			// plan will do, and a region that took a stall of its own
			// gateways for its client leaving gives nothing meanwhile.
			continue
		}
		names[cr.Counter] = true
	}
	if len(names) > 0 {
		c.planAll(names, now)
	}
}

// rejectedElsewhere reports whether a region other than region, in a
// report the plan would read, rejected some of counter's demand.
func (c *Coordinator) rejectedElsewhere(counter, region string, now int64) bool {
	for name, r := range c.reports {
		if name == region || now-r.at > c.cfg.Period+c.cfg.Period/2 {
			continue
		}
		for _, cr := range r.rep.Counters {
			if cr.Counter == counter && cr.Rejected > 0 {
				return true
			}
		}
	}
	return false
}

// planAll plans the counters the recent reports name (only, unless nil,
// those in only).
func (c *Coordinator) planAll(only map[string]bool, now int64) {
	// The reports of this period's boundary list what was given before
	// it; what was ordered since may not be given yet.
	c.now = now
	for id, o := range c.ordered {
		if o.at < fdiv(now, c.cfg.Period)*c.cfg.Period {
			delete(c.ordered, id)
		}
	}
	// Regions whose report of this period boundary or the one before has
	// arrived are reachable; only they give or receive.
	n := len(c.fleet.Members)
	reach := make([]bool, n)
	byCounter := map[string][]*CounterReport{}
	limits := map[string]Limit{}
	for name, r := range c.reports {
		if now-r.at > c.cfg.Period+c.cfg.Period/2 {
			continue
		}
		i := c.fleet.Index(name)
		reach[i] = true
		for j := range r.rep.Counters {
			cr := &r.rep.Counters[j]
			if only != nil && !only[cr.Counter] {
				continue
			}
			if lim, ok := limits[cr.Counter]; ok && lim != cr.Limit {
				// Regions disagree on the limit (a rule change under
				// way): leave the counter alone until they agree.
				limits[cr.Counter] = Limit{}
				continue
			}
			limits[cr.Counter] = cr.Limit
			if byCounter[cr.Counter] == nil {
				byCounter[cr.Counter] = make([]*CounterReport, n)
			}
			byCounter[cr.Counter][i] = cr
		}
	}
	for _, name := range slices.Sorted(maps.Keys(byCounter)) {
		lim := limits[name]
		if lim == (Limit{}) {
			continue
		}
		c.plan(name, lim, byCounter[name], reach, now)
	}
}

// plan decides one counter's targets and sends its orders.
func (c *Coordinator) plan(name string, lim Limit, reps []*CounterReport, reach []bool, now int64) {
	c.lastPlan.Counters++
	n := len(c.fleet.Members)
	static := c.fleet.Static(lim.Units)
	needs := make([]int64, n)
	weights := make([]int64, n)
	for i := range n {
		if !reach[i] {
			continue
		}
		weights[i] = c.fleet.Members[i].Weight
		if reps[i] != nil {
			needs[i] = min(need(c.cfg, lim, reps[i].Demand), lim.Units)
		}
	}
	target := targetsFor(static, weights, needs, reach)
	c.targets[name] = target

	slot := fdiv(now, lim.slotLen(c.cfg))
	// The loans still out, as their givers report them.
	var loans []outstanding
	for g := range n {
		if !reach[g] || reps[g] == nil {
			continue
		}
		for _, o := range reps[g].Out {
			if r := c.fleet.Index(o.To); r >= 0 && o.Last >= slot {
				loans = append(loans, outstanding{from: g, to: r, LoanState: o})
			}
		}
	}
	// Loans ordered since the givers last reported count as out.
	for _, o := range c.ordered {
		g, r := c.fleet.Index(o.loan.From), c.fleet.Index(o.loan.To)
		if o.loan.Counter != name || o.loan.Limit != lim || g < 0 || r < 0 || !reach[g] || o.loan.Last < slot ||
			slices.ContainsFunc(loans, func(l outstanding) bool { return l.ID == o.loan.ID }) {
			continue
		}
		loans = append(loans, outstanding{from: g, to: r, LoanState: LoanState{ID: o.loan.ID, To: o.loan.To,
			Units: o.loan.Units, First: o.loan.First, Last: o.loan.Last}})
	}
	slices.SortFunc(loans, func(a, b outstanding) int {
		if d := cmp.Compare(b.Units, a.Units); d != 0 {
			return d
		}
		return a.ID.Compare(b.ID)
	})
	tol := int64(math.Floor(c.cfg.Tolerance * float64(lim.Units)))
	if lim.Kind == FixedWindow {
		c.planWindows(name, lim, static, target, reach, loans, tol, now)
	} else {
		c.planPeriods(name, lim, flows(static, target, reach, loans), loans, tol, slot)
	}
}

// outstanding is a loan a reachable giver reports.
type outstanding struct {
	from, to int
	LoanState
}

// flows decides how many units each reachable region should lend each
// other so that every reachable region's share reaches its target:
// flow[g][r] from g to r. Pairs that already have a loan (loans, largest
// first) are filled first, so that a plan keeps last period's loans.
func flows(static, target []int64, reach []bool, loans []outstanding) [][]int64 {
	n := len(static)
	want := make([]int64, n)
	have := make([]int64, n)
	for i := range n {
		if reach[i] {
			want[i] = max(target[i]-static[i], 0)
			have[i] = max(static[i]-target[i], 0)
		}
	}
	flow := make([][]int64, n)
	for i := range flow {
		flow[i] = make([]int64, n)
	}
	for _, l := range loans {
		if u := min(want[l.to], have[l.from]); u > 0 {
			flow[l.from][l.to] += u
			want[l.to] -= u
			have[l.from] -= u
		}
	}
	for _, r := range largestFirst(want) {
		for _, g := range largestFirst(have) {
			if u := min(want[r], have[g]); u > 0 {
				flow[g][r] += u
				want[r] -= u
				have[g] -= u
			}
		}
	}
	return flow
}

// planPeriods orders the loans of a sliding window or a bucket: one loan
// per pair of regions, extended each period to the end of the next one
// and raised when the flow grew by more than tol; a loan more than tol
// above its flow is left to lapse (and a new one asked for), so shares
// fall back to static within two periods of the coordinator's last plan.
func (c *Coordinator) planPeriods(name string, lim Limit, flow [][]int64, loans []outstanding, tol, slot int64) {
	n := len(flow)
	last := slot + 1
	kept := make([][]bool, n)
	for i := range kept {
		kept[i] = make([]bool, n)
	}
	for _, l := range loans {
		f := flow[l.from][l.to]
		if kept[l.from][l.to] || f <= tol || l.Units > f+tol {
			c.lastPlan.Lapsed++
			continue
		}
		kept[l.from][l.to] = true
		units := l.Units
		if f > l.Units+tol {
			units = f
		}
		if l.Last < last || units > l.Units {
			c.lastPlan.Extended++
			c.order(&Order{Epoch: c.epoch, Extend: true, Loan: Loan{
				ID: l.ID, Counter: name, Limit: lim, From: c.fleet.Members[l.from].Name, To: c.fleet.Members[l.to].Name,
				Units: units, First: l.First, Last: max(last, l.Last),
			}})
		}
	}
	for g := range n {
		for r := range n {
			if f := flow[g][r]; !kept[g][r] && f > tol {
				c.newLoan(name, lim, g, r, f, slot, last)
			}
		}
	}
}

// planWindows orders the loans of a fixed window, whose units belong to
// the windows they name: for each window starting before the next plan,
// each region's holding of that window (its static share, plus what the
// loans out lend it, less what they lend from it) is set against its
// target. A region whose target is below its static share (a giver) lends
// what it holds above its target, its own units and those it borrowed
// alike, to the regions whose target is above their static share (the
// receivers) and that hold less than their targets; differences within
// tol move nothing. So a client that moves to a region that lent gets its
// units back, and units a third region lent the old region go on to the
// new one rather than staying where no one needs them. A receiver never
// gives back what it holds above its target, nor a giver ask for more:
// a target that wobbles with demand moves no units to and fro.
// Consecutive windows after the current one with the same loans share
// them; the current window always has loans of its own (a giver lends a
// loan's least room over its windows). Loans end with their windows;
// nothing is extended.
func (c *Coordinator) planWindows(name string, lim Limit, static, target []int64, reach []bool, loans []outstanding, tol, now int64) {
	n := len(static)
	first := fdiv(now, lim.Window)
	last := fdiv(now+c.cfg.Period, lim.Window)
	nw := int(last - first + 1)
	// give[g][r][k]: units g is to lend r of window first+k.
	give := make([][][]int64, n)
	for g := range give {
		give[g] = make([][]int64, n)
		for r := range give[g] {
			give[g][r] = make([]int64, nw)
		}
	}
	for k := range nw {
		w := first + int64(k)
		held := slices.Clone(static)
		for _, l := range loans {
			if l.First <= w && w <= l.Last {
				held[l.from] -= l.Units
				held[l.to] += l.Units
			}
		}
		over := make([]int64, n)
		under := make([]int64, n)
		for i := range n {
			switch {
			case !reach[i]:
			case target[i] < static[i]:
				over[i] = max(held[i]-target[i], 0)
			case target[i] > static[i]:
				under[i] = max(target[i]-held[i], 0)
			}
		}
		for _, r := range largestFirst(under) {
			for _, g := range largestFirst(over) {
				if u := min(under[r], over[g], lim.Units); u > tol {
					give[g][r][k] = u
					under[r] -= u
					over[g] -= u
				}
			}
		}
	}
	for g := range n {
		for r := range n {
			runStart, runUnits := int64(-1), int64(0)
			flush := func(end int64) {
				if runStart >= 0 {
					c.newLoan(name, lim, g, r, runUnits, runStart, end)
				}
				runStart = -1
			}
			for k := range nw {
				w, u := first+int64(k), give[g][r][k]
				if runStart >= 0 && (u != runUnits || k == 1) {
					flush(w - 1)
				}
				if runStart < 0 && u > 0 {
					runStart, runUnits = w, u
				}
			}
			flush(last)
		}
	}
}

func (c *Coordinator) newLoan(name string, lim Limit, g, r int, units, first, last int64) {
	c.seq++
	c.lastPlan.New++
	o := &Order{Epoch: c.epoch, Loan: Loan{
		ID: LoanID{Epoch: c.epoch, Seq: c.seq}, Counter: name, Limit: lim,
		From: c.fleet.Members[g].Name, To: c.fleet.Members[r].Name,
		Units: units, First: first, Last: last,
	}}
	c.ordered[o.Loan.ID] = ordered{loan: o.Loan, at: c.now}
	c.order(o)
}

func (c *Coordinator) order(o *Order) { c.tr.Send(Node(o.Loan.From), o) }

// targetsFor splits the units of the reachable regions' static shares among
// them by need: when the needs fit, each region gets its need and the
// rest goes by weight; when they do not, the units go in proportion to the
// needs. Unreachable regions keep their static share. Largest-remainder
// rounding throughout, so the targets of the reachable regions sum to
// their static shares exactly.
func targetsFor(static, weights, needs []int64, reach []bool) []int64 {
	n := len(static)
	target := slices.Clone(static)
	var pool, total int64
	for i := range n {
		if reach[i] {
			pool += static[i]
			total = satAdd(total, needs[i])
		}
	}
	if pool == 0 {
		return target
	}
	split := func(units int64, parts []int64) []int64 {
		var sum int64
		for _, p := range parts {
			sum = satAdd(sum, p)
		}
		if sum == 0 || sum == math.MaxInt64 {
			return make([]int64, n)
		}
		return largestRemainder(units, units, parts, sum)
	}
	reachNeeds := make([]int64, n)
	reachWeights := make([]int64, n)
	for i := range n {
		if reach[i] {
			reachNeeds[i] = needs[i]
			reachWeights[i] = max(weights[i], 1)
		}
	}
	var alloc []int64
	if total <= pool {
		alloc = slices.Clone(reachNeeds)
		extra := split(pool-total, reachWeights)
		for i := range n {
			alloc[i] += extra[i]
		}
	} else {
		alloc = split(pool, reachNeeds)
	}
	for i := range n {
		if reach[i] {
			target[i] = alloc[i]
		}
	}
	return target
}

func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// String names the plan's counts, for logs.
func (p PlanStats) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "counters=%d extended=%d new=%d lapsed=%d", p.Counters, p.Extended, p.New, p.Lapsed)
	return b.String()
}
