package regions

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
)

// Region is a region's agent: the owner feeds it the region's decisions
// (Observe), the messages addressed to it (Handle) and the clock (Tick at
// every period boundary); it reports hot counters to the coordinator,
// carries out orders through the Store and applies the loans it receives.
// Its own state (demand, the highest epoch seen) is only a hint: losing it
// in a restart costs a period of reports, never safety. It is not safe
// for concurrent use.
type Region struct {
	cfg    Config
	fleet  Fleet
	name   string
	index  int
	store  Store
	tr     Transport
	log    *slog.Logger
	static map[Limit]int64

	maxEpoch  Epoch
	lastHeard int64 // the region's clock when it last heard a coordinator
	period    int64 // the period of the last Tick
	stepAt    int64 // the region's clock at the last Tick
	demand    map[string]*demand
}

// demand is a counter's decisions in the current period and the two
// before it.
// lim is the limit the decisions were counted under (the rule's); held,
// once a report found it, the limit the region's ledger holds for the
// counter, which an override or a penalty may have cut or raised.
type demand struct {
	lim, held          Limit
	cur, curRejected   int64
	last, lastRejected int64
	prev, prevRejected int64
	// closed counts the periods closed since the counter's demand was
	// first seen (prev is a whole period's only from the third).
	closed int
	// urgent: reported within the current period (Report.Urgent).
	urgent bool
	// since is the region's clock at the first step that saw any of
	// its demand: a demand that began a moment ago is a rate over the
	// time since (rate).
	since int64
	// seen is the time of the latest decision counted (ObserveAt).
	seen int64
	// sample is the ledger's state of the counter when last read (a
	// fixed window's).
	sample sample
	// goneFrom, when not 0, is when the counter's demand went: the
	// ledger admitted nothing since then though it had room and the
	// demand's rate called for several admissions, and no decision made
	// since has been counted (gone). Until one is, the counter's demand
	// is 0 in reports and in what a give keeps.
	goneFrom int64
}

// sample is a fixed window's use in the region's ledger at a moment.
type sample struct {
	at, window, used int64
}

// limit is the limit the counter is decided under in the region, as far
// as the agent knows.
func (d *demand) limit() Limit {
	if d.held != (Limit{}) {
		return d.held
	}
	return d.lim
}

// NewRegion is the agent of region name, its Store, sending through tr.
// now is the region's clock: the failover timer starts from it. A nil log
// discards.
func NewRegion(cfg Config, fleet Fleet, name string, store Store, tr Transport, log *slog.Logger, now int64) (*Region, error) {
	cfg = cfg.WithDefaults()
	if err := errors.Join(cfg.Validate(), fleet.Validate()); err != nil {
		return nil, fmt.Errorf("regions: new region: %w", err)
	}
	i := fleet.Index(name)
	if i < 0 {
		return nil, fmt.Errorf("regions: new region: %w: %q not in the fleet", ErrInvalid, name)
	}
	if store == nil || tr == nil {
		return nil, fmt.Errorf("regions: new region: %w: a store and a transport are required", ErrInvalid)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Region{
		cfg: cfg, fleet: fleet, name: name, index: i, store: store, tr: tr, log: log,
		static: map[Limit]int64{}, lastHeard: now, period: fdiv(now, cfg.Period), demand: map[string]*demand{},
	}, nil
}

// Name is the region's name.
func (r *Region) Name() string { return r.name }

// Epoch is the highest coordinator epoch the region has seen.
func (r *Region) Epoch() Epoch { return r.maxEpoch }

// Observe counts one decision of a global counter: its cost, admitted or
// not, made at an unknown time (taken as the last Tick's). The aggregator
// calls ObserveAt from the decision stream; it needs no exactly-once
// (demand only steers where units go).
func (r *Region) Observe(counter string, lim Limit, cost int64, allowed bool) {
	r.ObserveAt(counter, lim, cost, allowed, 0)
}

// ObserveAt is Observe of a decision made at the region's clock at (0:
// unknown, taken as the last Tick's). A decision made after a counter's
// demand was found gone (gone) brings it back.
func (r *Region) ObserveAt(counter string, lim Limit, cost int64, allowed bool, at int64) {
	d := r.demand[counter]
	if d == nil {
		d = &demand{lim: lim}
		r.demand[counter] = d
	}
	if at <= 0 {
		at = r.stepAt
	}
	d.lim = lim
	d.cur += cost
	if !allowed {
		d.curRejected += cost
	}
	d.seen = max(d.seen, at)
	if d.goneFrom != 0 && at >= d.goneFrom {
		d.goneFrom = 0
	}
}

func (r *Region) staticOf(lim Limit) int64 {
	s, ok := r.static[lim]
	if !ok {
		if len(r.static) > 4096 {
			clear(r.static)
		}
		s = r.fleet.Static(lim.Units)[r.index]
		r.static[lim] = s
	}
	return s
}

// hot reports whether a counter's last period calls for the coordinator:
// it rejected, or its demand exceeded HotFraction of what its static share
// admits in a period.
func (r *Region) hot(d *demand) bool {
	dem, rej := r.recent(d)
	if rej > 0 {
		return true
	}
	lim := d.limit()
	per := float64(r.staticOf(lim)) * float64(r.cfg.Period) / float64(lim.Window)
	return float64(dem) > r.cfg.HotFraction*per
}

// need is the units a region wants over a window for a demand of d units
// in the last period: its rate times the window times the headroom.
func need(cfg Config, lim Limit, d int64) int64 { return needOver(cfg, lim, d, 1) }

// needOver is need for a demand of d units over the last periods periods.
func needOver(cfg Config, lim Limit, d, periods int64) int64 {
	if d <= 0 {
		return 0
	}
	return capped(math.Ceil(float64(d) * float64(lim.Window) / float64(periods*cfg.Period) * cfg.Headroom))
}

// capped is n units, at most MaxInt64/2.
func capped(n float64) int64 {
	if n >= float64(math.MaxInt64/2) {
		return math.MaxInt64 / 2
	}
	return int64(n)
}

// keepOver is what a giver keeps over a window for a demand of d units
// over the last periods periods: its rate times the window times the
// headroom, rounded down, but never less than its rate times the window
// rounded up. Rounded up, the headroom took a unit more than a steady
// 30 % side of a split needs and left its receiver a unit short at the
// ends of its windows.
func keepOver(cfg Config, lim Limit, d, periods int64) int64 {
	if d <= 0 {
		return 0
	}
	bare := float64(d) * float64(lim.Window) / float64(periods*cfg.Period)
	return capped(max(math.Ceil(bare), math.Floor(bare*cfg.Headroom)))
}

// track notes, at each step, when a counter's demand was first seen.
func (r *Region) track(now int64) {
	for _, d := range r.demand {
		d.since = cmp.Or(d.since, now)
	}
}

// Tick closes the period when now has entered a new one: the demand
// counted becomes the last period's, and the region reports its hot
// counters and every counter holding a loan to the coordinators. Within a
// period it reports at once the counters that turned hot since the last
// report (urgent); the owner calls it often (every tenth of a period) so
// that a counter that starts rejecting is planned without waiting for the
// next boundary.
func (r *Region) Tick(ctx context.Context, now int64) error {
	r.stepAt = now
	r.track(now)
	k := fdiv(now, r.cfg.Period)
	if k <= r.period {
		return r.urgent(ctx, now)
	}
	gap := k - r.period
	r.period = k
	for name, d := range r.demand {
		if gap == 1 {
			d.prev, d.prevRejected = d.last, d.lastRejected
			d.last, d.lastRejected = d.cur, d.curRejected
			d.closed++
		} else {
			d.prev, d.prevRejected, d.last, d.lastRejected, d.closed = 0, 0, 0, 0, 0
		}
		d.cur, d.curRejected, d.urgent = 0, 0, false
		if d.last == 0 {
			delete(r.demand, name)
		}
	}
	report := map[string]Limit{}
	for name, d := range r.demand {
		if r.hot(d) {
			report[name] = d.limit()
		}
	}
	active, err := r.store.Active(ctx, now)
	if err != nil {
		return fmt.Errorf("regions: tick: %w", err)
	}
	for _, a := range active {
		report[a.Counter] = a.Limit
	}
	reps := r.reports(now, false)
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(report)) {
		cr, err := r.counterReport(ctx, name, report[name], now)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if d := r.demand[name]; d != nil {
			// Demand is in the units requests cost, whatever the limit.
			cr.Demand, cr.Rejected = r.recent(d)
		}
		reps.add(cr)
	}
	// An empty report still says the region is there.
	reps.send(len(report) == 0)
	if len(errs) > 0 {
		return fmt.Errorf("regions: tick: %w", errors.Join(errs...))
	}
	return nil
}

// reportBatch sends a region's counter reports to the coordinators in
// Reports of at most MaxReportCounters counters.
type reportBatch struct {
	r      *Region
	now    int64
	urgent bool
	rep    *Report
}

// reports starts the reports of a step at now.
func (r *Region) reports(now int64, urgent bool) *reportBatch {
	return &reportBatch{r: r, now: now, urgent: urgent}
}

// add adds cr, sending the report it fills.
func (b *reportBatch) add(cr CounterReport) {
	if b.rep == nil {
		b.rep = b.report()
	}
	b.rep.Counters = append(b.rep.Counters, cr)
	if len(b.rep.Counters) == MaxReportCounters {
		b.r.tr.Send(ToCoordinators, b.rep)
		b.rep = nil
	}
}

func (b *reportBatch) report() *Report {
	return &Report{Region: b.r.name, Epoch: b.r.maxEpoch, Time: b.now, Urgent: b.urgent}
}

// send sends what add has not sent yet; with empty, an empty report
// when nothing was added.
func (b *reportBatch) send(empty bool) {
	if b.rep == nil && empty {
		b.rep = b.report()
	}
	if b.rep != nil {
		b.r.tr.Send(ToCoordinators, b.rep)
		b.rep = nil
	}
}

// counterReport is a counter's state for a report, under the limit its
// ledger holds: the region decides the counter under another limit than
// the rule's after an override or a penalty (or the rule changed), and
// its shares are of that limit, so it reports and lends under it.
func (r *Region) counterReport(ctx context.Context, name string, lim Limit, now int64) (CounterReport, error) {
	st, err := r.store.State(ctx, name, lim, now)
	if mm, ok := errors.AsType[*LimitMismatchError](err); ok {
		lim = mm.Held
		st, err = r.store.State(ctx, name, lim, now)
	}
	if err != nil {
		return CounterReport{}, err
	}
	if d := r.demand[name]; d != nil {
		d.held = lim
		if lim.Kind == FixedWindow {
			d.sample = sample{at: now, window: fdiv(now, lim.Window), used: st.Used}
		}
	}
	return CounterReport{Counter: name, Limit: lim, Share: st.Share, Used: st.Used, Out: st.Out}, nil
}

// sofar is u units counted in the current period so far, scaled to a
// whole period; the elapsed part counts as at least a quarter of it, so
// that a burst at a period's start is not magnified without bound.
func (r *Region) sofar(u, now int64) int64 {
	v, _ := mulDiv(max(u, 0), r.cfg.Period, max(now-r.period*r.cfg.Period, r.cfg.Period/4))
	return v
}

// recent is a counter's demand and rejections per period over the last
// two periods (the last alone until two whole ones are counted), 0 while
// its demand is gone. A decision stream delivers in polls, so a period
// may count one poll more or fewer than the region's rate; over two
// periods that noise is halved,
// and a region that counted two polls in its last period does not take
// its rate for twice what it is (keeping units another region needs) nor,
// after one, for half (taking the units it lent).
func (r *Region) recent(d *demand) (dem, rej int64) {
	if d.goneFrom != 0 {
		return 0, 0
	}
	if d.closed < 3 {
		return d.last, d.lastRejected
	}
	return (d.last + d.prev + 1) / 2, (d.lastRejected + d.prevRejected + 1) / 2
}

// rate is the counter's demand over the last period and this one so far,
// scaled to a whole period (the elapsed time counts as at least a quarter
// of a period), from when its demand began if that was later (from a step
// before the one that first saw it): a region whose client started a
// moment ago is not taken for one whose client sends a few requests a
// period.
func (r *Region) rate(d *demand, now int64) int64 {
	if d.goneFrom != 0 {
		return 0
	}
	start := (r.period - 1) * r.cfg.Period
	units := d.last + d.cur
	switch {
	case d.since == 0 || d.closed == 0:
		// Not seen at a step yet, or only in this period.
		start, units = max(d.since-r.cfg.Period/10, r.period*r.cfg.Period), d.cur
	case d.since-r.cfg.Period/10 > start:
		start = d.since - r.cfg.Period/10
	}
	v, _ := mulDiv(max(units, 0), r.cfg.Period, max(now-start, r.cfg.Period/4))
	return v
}

// urgent reports, within a period, the counters that turned hot since
// the last report and need more than their share: not hot in the last
// period, now past HotFraction of what the static share admits in a whole
// period, and rejecting or with a need (their demand so far, scaled to a
// whole period) above the region's share. Each is
// reported once a period, its demand so far scaled to a whole period
// (sofar). Cold counters never are, so
// these reports too grow with hot counters, not keys.
func (r *Region) urgent(ctx context.Context, now int64) error {
	goneErr := r.gone(ctx, now)
	names := r.demandWhere(func(d *demand) bool {
		if d.urgent || d.goneFrom != 0 || r.hot(d) {
			return false
		}
		lim := d.limit()
		per := float64(r.staticOf(lim)) * float64(r.cfg.Period) / float64(lim.Window)
		return d.curRejected > 0 || float64(d.cur) > r.cfg.HotFraction*per
	})
	if len(names) == 0 {
		return goneErr
	}
	reps := r.reports(now, true)
	var errs []error
	for _, name := range names {
		d := r.demand[name]
		cr, err := r.counterReport(ctx, name, d.limit(), now)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		cr.Demand, cr.Rejected = r.sofar(d.cur, now), r.sofar(d.curRejected, now)
		if cr.Rejected == 0 && need(r.cfg, cr.Limit, cr.Demand) <= cr.Share {
			continue // its share covers the demand: the next report will do
		}
		d.urgent = true
		reps.add(cr)
	}
	reps.send(false)
	if len(errs) > 0 {
		return errors.Join(goneErr, fmt.Errorf("regions: urgent report: %w", errors.Join(errs...)))
	}
	return goneErr
}

// demandWhere is the names of the counters whose demand keep accepts, in
// order.
func (r *Region) demandWhere(keep func(*demand) bool) []string {
	var names []string
	for name, d := range r.demand {
		if keep(d) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// goneArrivals is how many arrivals a counter's demand rate must call for,
// in a time when its decisions stopped coming and the region's ledger
// admitted none of it though it had room, before the region takes that
// demand for gone (gone). A steady client sends them in such a time all
// but always (a Poisson stream misses all sixteen one time in ten
// million), but a gateway stalled for that long looks the same (half a
// second for a client at 30 a second), which is why the coordinator acts
// on it at once only for a counter another region rejects.
const goneArrivals = 16

// arrivals is how many arrivals a counter's recent demand rate calls for
// in dt.
func (r *Region) arrivals(d *demand, dt int64) float64 {
	dem, _ := r.recent(d)
	return float64(dem) * float64(max(dt, 0)) / float64(r.cfg.Period)
}

// gone finds, within a period, the fixed-window counters whose demand
// has gone from the region (its client left, most often for another
// region) and reports each at once with a demand of 0, so that the
// coordinator plans it there and then and the units its share holds go
// where they are wanted, instead of staying for the one or two periods
// the region's demand (counted over two periods, from a decision stream
// that arrives late and in polls) takes to fall. Two kinds of evidence,
// neither enough alone: the decision stream brought no decision of the
// counter made in a time its rate calls for goneArrivals in (a stream
// may stall or lag), and the ledger, which the gateways admit through at
// once, admitted nothing of it since a read made after that last
// decision, over a time its rate calls for goneArrivals in again, though
// the share had room (with none, requests are rejected and the ledger
// shows nothing), within the body of one window (within the skew bound of
// a boundary the window on the other side, whose share may be spent,
// counts too). Only counters reported (hot, or holding loans) are
// watched, each with at most one ledger read per step while its decisions
// have stopped: they too grow with hot counters, not keys. A decision
// made since counts again (ObserveAt); a give then keeps what the demand
// needs, as before.
func (r *Region) gone(ctx context.Context, now int64) error {
	names := r.demandWhere(func(d *demand) bool {
		return d.goneFrom == 0 && d.sample.at != 0 && d.limit().Kind == FixedWindow && d.seen > 0 &&
			now-d.seen >= r.cfg.Period/10 && r.arrivals(d, now-d.seen) >= goneArrivals
	})
	if len(names) == 0 {
		return nil
	}
	reps := r.reports(now, true)
	var errs []error
	for _, name := range names {
		d := r.demand[name]
		lim, smp := d.limit(), d.sample
		fresh := smp.at > d.seen
		// Only the window's body counts: within the skew bound of a
		// boundary an admission may lie in the window on the other side
		// too, and that window's share may have no room.
		w := fdiv(now, lim.Window)
		if now >= (w+1)*lim.Window-r.cfg.Skew {
			continue
		}
		from, used := smp.at, smp.used
		if w != smp.window {
			used = 0
		}
		from = max(from, w*lim.Window+r.cfg.Skew)
		if fresh && r.arrivals(d, now-from) < goneArrivals {
			continue // quiet so far, not for long enough yet
		}
		// Read the ledger: the test's end, or a read after the last
		// decision to start it from.
		cr, err := r.counterReport(ctx, name, lim, now)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !fresh || cr.Limit != lim || cr.Used != used || cr.Share <= cr.Used {
			continue
		}
		d.goneFrom = from
		r.log.Debug("regions: a counter's demand has gone from the region", slog.String("counter", name),
			slog.Int64("quiet_since", from), slog.Int64("share", cr.Share), slog.Int64("used", cr.Used))
		cr.Demand, cr.Rejected = 0, 0
		reps.add(cr)
	}
	reps.send(false)
	if len(errs) > 0 {
		return fmt.Errorf("regions: demand gone: %w", errors.Join(errs...))
	}
	return nil
}

// heard notes a coordinator's epoch; false when it is below the highest
// seen (the sender is fenced and told so).
func (r *Region) heard(e Epoch, now int64) bool {
	if e < r.maxEpoch {
		r.tr.Send(ToCoordinators, &Fenced{Epoch: r.maxEpoch})
		return false
	}
	r.maxEpoch = e
	r.lastHeard = max(r.lastHeard, now)
	return true
}

// Handle takes a message addressed to the region (or broadcast). An
// invalid message is refused with an error and changes nothing.
func (r *Region) Handle(ctx context.Context, m Message, now int64) error {
	if err := m.Validate(r.cfg); err != nil {
		return fmt.Errorf("regions: region %s: %w", r.name, err)
	}
	switch m := m.(type) {
	case *Heartbeat:
		r.heard(m.Epoch, now)
	case *Order:
		if m.Loan.From != r.name {
			return fmt.Errorf("regions: region %s: order: %w", r.name, ErrNotMine)
		}
		if !r.heard(m.Epoch, now) {
			return nil
		}
		var keep int64
		if d := r.demand[m.Loan.Counter]; d != nil {
			// What the last periods asked, or the rate since, if
			// higher. A fixed window's loan is of units of the current
			// window and the next, so this period's demand counts at
			// its rate with the last period's (its part alone would give
			// away what the rest of the window needs), from when it
			// began if that was later: an urgent plan early in a
			// demand's life reaches the givers before much of their own
			// demand has come through the decision stream. A bucket or sliding window's loan is
			// extended each period, and an extension refused ends it,
			// so a rate guessed from part of a period (noisy) must not
			// refuse it: the part counts as it is.
			cur := d.cur
			if m.Loan.Limit.Kind == FixedWindow {
				cur = r.rate(d, now)
			}
			// The demand over the two periods recent counts, not its
			// rounded half: a unit kept for rounding is a unit the
			// receiver's window lacks.
			dem2 := 2 * d.last
			switch {
			case d.goneFrom != 0:
				dem2 = 0
			case d.closed >= 3:
				dem2 = d.last + d.prev
			}
			keep = keepOver(r.cfg, m.Loan.Limit, max(dem2, 2*cur), 2)
		}
		loan, refused, err := r.store.Give(ctx, m, keep, now)
		if err != nil {
			return fmt.Errorf("regions: region %s: order %s: %w", r.name, m.Loan.ID, err)
		}
		r.tr.Send(ToCoordinators, &GiveResult{Epoch: m.Epoch, Loan: loan, Refused: refused})
		if refused == "" && loan.Units > 0 {
			r.tr.Send(Node(loan.To), &Transfer{Loan: loan})
		}
	case *Transfer:
		if _, _, err := r.store.Receive(ctx, m, now); err != nil {
			return fmt.Errorf("regions: region %s: transfer %s: %w", r.name, m.Loan.ID, err)
		}
	}
	return nil
}

// Candidate reports whether the region should start a coordinator now, and
// with which epoch: it has heard none for FailoverPeriods periods plus two
// per region ahead of it in the fleet's order (so the first region that
// can stands first). The owner starts a Coordinator with that epoch in
// this region and calls Lead.
func (r *Region) Candidate(now int64) (Epoch, bool) {
	wait := int64(r.cfg.FailoverPeriods+2*r.index) * r.cfg.Period
	if now-r.lastHeard <= wait {
		return 0, false
	}
	return NewEpoch(r.maxEpoch.Term()+1, r.index), true
}

// Lead records that the owner started a coordinator of epoch e in this
// region.
func (r *Region) Lead(e Epoch, now int64) {
	r.maxEpoch = max(r.maxEpoch, e)
	r.lastHeard = max(r.lastHeard, now)
}
