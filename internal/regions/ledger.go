package regions

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
)

// Store is a region's side of its shares, kept where the region's
// gateways decide (its Redis): every call is atomic there (one Lua script
// in production). The region's agent (Region) is its only caller besides
// the gateways' admissions.
//
// The rules every implementation keeps, which the safety argument rests
// on (docs/regions.md):
//
//   - Give removes the units from the region's share before it returns:
//     nothing is sent that the region can still admit against. It gives
//     only units the region has not used (fixed window: of each window
//     the loan covers; sliding window: of its share now, against what it
//     admitted over the trailing window) and, for sliding windows and
//     buckets, only units of its own share, never units it borrowed. It
//     gets them back only after the loan ends plus the skew bound (plus
//     the window, for a sliding window).
//   - Receive applies each loan at most once: a duplicate changes
//     nothing, an extension only moves its end, and a loan that has lapsed
//     at the receiver is never applied again while its units could still
//     be counted there. The receiver uses a loan from the start of its
//     first slot plus the skew bound to the end of its last slot minus the
//     skew bound.
//   - Nothing else raises a share.
//   - An admission under a limit of other units (an override, a penalty,
//     the rule's limit changed; the same kind and window), or a give under
//     one to a counter holding no loans, carries the counter over to it
//     and voids the loans made under the old limit: a
//     void loan received counts nothing and is never applied again, a
//     void loan given keeps its units out until they come back and is
//     never extended or reported (refused: RefusedLimit).
type Store interface {
	// Give carries out an order: a new loan of up to o.Loan.Units, or
	// (o.Extend) the extension of loan o.Loan.ID to o.Loan.Last. keep is
	// what the region wants to keep for its own demand over a window; the
	// store gives only what exceeds it. It answers the loan as given (its
	// Units 0 and a reason when nothing was given); asked again with the
	// same ID it answers the same loan without giving twice.
	Give(ctx context.Context, o *Order, keep int64, now int64) (Loan, string, error)
	// Receive applies a transfer addressed to this region. It answers
	// whether the units were applied (or extended) and if not why.
	Receive(ctx context.Context, t *Transfer, now int64) (bool, string, error)
	// State answers a counter's share and use now, and the loans it gave
	// that are still out.
	State(ctx context.Context, counter string, lim Limit, now int64) (CounterState, error)
	// Active lists the counters holding loans, given or received.
	Active(ctx context.Context, now int64) ([]Named, error)
}

// Named is a counter and its limit.
type Named struct {
	Counter string
	Limit   Limit
}

// CounterState is a counter's state in one region.
type CounterState struct {
	// Share is what the region may admit against now: for a fixed window
	// its share of the current window, for a sliding window its share of
	// the trailing window, for a bucket its capacity (its rate is
	// Share/Window).
	Share int64
	// Used is what it has admitted against the share: the current
	// window's count, the trailing window's count, or the capacity in use
	// (capacity − tokens, rounded up).
	Used int64
	// Out lists the loans the region gave and holds units for.
	Out []LoanState
}

// Admission is the answer to Ledger.Admit.
type Admission struct {
	Allowed bool
	// Remaining is what is left of the region's share after the call
	// (never below 0).
	Remaining int64
	// RetryAfter, on a rejection, is the time in microseconds until the
	// cost is admitted by the region's share as the region knows it,
	// counting only what it is sure of: borrowed units go when their loan
	// ends, and units it lent count as gone even past their loan's end.
	// Until then the region gives nothing away, so a client that waits
	// that long is admitted unless others took the units meanwhile.
	RetryAfter int64
}

// Refusal reasons of Give and Receive.
const (
	RefusedPast     = "past"     // the loan's slots are over
	RefusedNothing  = "nothing"  // nothing to spare
	RefusedPromised = "promised" // a Retry-After the region sent is running
	RefusedUnknown  = "unknown"  // an extension of a loan the giver does not hold
	RefusedLapsed   = "lapsed"   // the loan lapsed at the receiver
	RefusedExpired  = "expired"  // a loan arriving after its end
	RefusedLimit    = "limit"    // the loan was made under another limit than the counter's now
)

// Ledger is a region's shares in memory, exactly: the reference model of
// the region's Redis scripts, and the store the simulation runs. It is
// not safe for concurrent use.
type Ledger struct {
	cfg      Config
	fleet    Fleet
	region   string
	index    int
	counters map[string]*counter
	// active holds the counters that may hold loans (Redis: a set the
	// scripts add to when they give or receive).
	active map[string]bool
}

var _ Store = (*Ledger)(nil)

// NewLedger is the ledger of region in fleet.
func NewLedger(cfg Config, fleet Fleet, region string) (*Ledger, error) {
	cfg, i, err := Place(cfg, fleet, region)
	if err != nil {
		return nil, fmt.Errorf("regions: new ledger: %w", err)
	}
	return &Ledger{cfg: cfg, fleet: fleet, region: region, index: i, counters: map[string]*counter{}, active: map[string]bool{}}, nil
}

// counter is one counter's state in the region.
type counter struct {
	lim    Limit
	static int64
	outs   map[LoanID]*outLoan
	ins    map[LoanID]*inLoan
	// promise: no give before this time (a Retry-After is running).
	promise int64
	// fixed window: units charged in each window's body, and in each
	// boundary's band, per slot (band.go).
	n    map[int64]int64
	band map[int64][]int64
	// sliding window: admissions over the trailing window, oldest first,
	// and their sum.
	log    []logEntry
	logSum int64
	// bucket: tokens × Window, as of ts.
	tok, ts int64
}

type logEntry struct{ t, cost int64 }

// outLoan is a loan the region gave.
type outLoan struct {
	to          string
	units       int64
	first, last int64
	given       int64 // the region's clock at the give
	// void: made under another limit than the counter's now. Its units
	// stay out until they come back as any loan's do, but it is never
	// extended or raised, nor reported.
	void bool
}

// inLoan is a loan the region received.
type inLoan struct {
	from        string
	units       int64
	first, last int64 // fixed window: the windows applied
	received    int64 // the region's clock when first applied
	// void: made under another limit than the counter's now. Its units
	// are 0 and it is never applied again; the record stays, as a lapsed
	// one's does, so that no copy of the transfer is applied.
	void bool
}

// lookup returns the counter, creating it with lim, or a
// *LimitMismatchError.
func (l *Ledger) lookup(name string, lim Limit, now int64) (*counter, error) {
	if c, ok := l.counters[name]; ok {
		if c.lim != lim {
			return nil, &LimitMismatchError{Counter: name, Held: c.lim, Asked: lim}
		}
		l.prune(c, now)
		return c, nil
	}
	if err := lim.Validate(l.cfg); err != nil {
		return nil, err
	}
	c := &counter{lim: lim, static: l.fleet.Static(lim.Units)[l.index], outs: map[LoanID]*outLoan{}, ins: map[LoanID]*inLoan{}}
	switch lim.Kind {
	case FixedWindow:
		c.n, c.band = map[int64]int64{}, map[int64][]int64{}
	case Bucket:
		c.tok, c.ts = c.static*lim.Window, now
	}
	l.counters[name] = c
	return c, nil
}

// relimit carries a counter over to a limit of other units (the rule's
// limit changed, or an override or a penalty applies to the counter), as
// the gateways' script does: what the region counted stays, its static
// share becomes the new limit's, and every loan made under the old limit
// becomes void. A void loan received stops counting at once (as if its
// transfer had been lost); a void loan given keeps its units out until
// they come back as any loan's do (so the giver may hold less than its
// new static share for a while). So once every region decides the counter
// under the new limit, the shares sum to at most the new limit, whatever
// was lent under the old one.
//
// A bucket's tokens are first brought to now under the old limit: the
// new one counts from now on.
func (l *Ledger) relimit(c *counter, lim Limit, now int64) {
	if c.lim.Kind == Bucket {
		l.settle(c, now)
	}
	c.lim, c.static = lim, l.fleet.Static(lim.Units)[l.index]
	for _, o := range c.outs {
		o.void = true
	}
	for _, in := range c.ins {
		in.units, in.void = 0, true
	}
}

// holdsLoans reports whether a loan the counter gave or received still
// counts or its record is still needed (what prune keeps), changing
// nothing.
func (l *Ledger) holdsLoans(c *counter, now int64) bool {
	for _, o := range c.outs {
		if now < l.regain(c, o) {
			return true
		}
	}
	for _, in := range c.ins {
		if now < l.forgetIn(c, in) {
			return true
		}
	}
	return false
}

// Slot arithmetic, in the region's clock.
func (l *Ledger) slotStart(c *counter, s int64) int64 { return s * c.lim.slotLen(l.cfg) }
func (l *Ledger) slotEnd(c *counter, s int64) int64   { return (s + 1) * c.lim.slotLen(l.cfg) }

// regain is when the giver has units of an outgoing loan back: the loan's
// end plus the skew bound, plus the window for a sliding window (units the
// receiver admitted count there until they slide out).
func (l *Ledger) regain(c *counter, o *outLoan) int64 {
	t := l.slotEnd(c, o.last) + l.cfg.Skew
	if c.lim.Kind == SlidingWindow {
		t += c.lim.Window
	}
	return t
}

// validity is when a received loan counts at the receiver (time kinds).
func (l *Ledger) validity(c *counter, in *inLoan) (from, to int64) {
	return max(in.received, l.slotStart(c, in.first)+l.cfg.Skew), l.slotEnd(c, in.last) - l.cfg.Skew
}

// forgetIn is when the receiver may drop its record of a loan: after it
// lapsed and every unit it admitted against it has slid out, so that
// applying the loan again (a delayed duplicate) is as safe as applying a
// loan never seen.
func (l *Ledger) forgetIn(c *counter, in *inLoan) int64 {
	t := l.slotEnd(c, in.last) + l.cfg.Skew
	if c.lim.Kind == SlidingWindow {
		t += c.lim.Window + l.cfg.Skew
	}
	return t
}

// prune drops loans whose records are no longer needed and windows and
// log entries that can no longer count.
func (l *Ledger) prune(c *counter, now int64) {
	if c.lim.Kind == Bucket {
		l.settle(c, now)
	}
	for id, o := range c.outs {
		if now >= l.regain(c, o) {
			delete(c.outs, id)
		}
	}
	for id, in := range c.ins {
		if now >= l.forgetIn(c, in) {
			delete(c.ins, id)
		}
	}
	switch c.lim.Kind {
	case FixedWindow:
		cur := fdiv(now-l.cfg.Skew, c.lim.Window)
		for j := range c.n {
			if j < cur {
				delete(c.n, j)
			}
		}
		for j := range c.band {
			if j < cur {
				delete(c.band, j)
			}
		}
	case SlidingWindow:
		i := 0
		for i < len(c.log) && c.log[i].t <= now-c.lim.Window {
			c.logSum -= c.log[i].cost
			i++
		}
		c.log = c.log[i:]
	}
}

// own is the region's own units not lent at now (time kinds).
func (l *Ledger) own(c *counter, now int64) int64 {
	s := c.static
	for _, o := range c.outs {
		if o.given <= now && now < l.regain(c, o) {
			s -= o.units
		}
	}
	return s
}

// borrowed is the units of received loans valid at now (time kinds).
func (l *Ledger) borrowed(c *counter, now int64) int64 {
	var s int64
	for _, in := range c.ins {
		if from, to := l.validity(c, in); from <= now && now < to {
			s += in.units
		}
	}
	return s
}

// eff is the share at now (time kinds).
func (l *Ledger) eff(c *counter, now int64) int64 {
	return l.own(c, now) + l.borrowed(c, now)
}

// share is the share of window j (fixed window).
func (l *Ledger) share(c *counter, j int64) int64 {
	s := c.static
	for _, o := range c.outs {
		if o.first <= j && j <= o.last {
			s -= o.units
		}
	}
	for _, in := range c.ins {
		if in.first <= j && j <= in.last {
			s += in.units
		}
	}
	return s
}

// charged is the windows an admission at now counts in: its window, and
// the neighbour whose boundary is within the skew bound.
func (l *Ledger) charged(c *counter, now int64) []int64 {
	return windowsOf(cellAt(c.lim.Window, l.cfg.Skew, now), c.lim.Window, now)
}

// used is what window j holds: the most any interval of true window j
// (whatever the region's clock offset within the skew bound) holds.
func (l *Ledger) used(c *counter, j int64) int64 {
	return windowUse(c.n[j], c.band[j], c.band[j+1], 0, bandLen-1)
}

// usedAt is the most window j's intervals that cover cell x hold: what an
// admission in x adds to.
func (l *Ledger) usedAt(c *counter, j int64, x cell) int64 {
	lo, hi := shifts(j, x)
	return windowUse(c.n[j], c.band[j], c.band[j+1], lo, hi)
}

// count adds units to cell x (none: nothing is made).
func (c *counter) count(x cell, units int64) {
	if units == 0 {
		return
	}
	if x.q < 0 {
		c.n[x.j] += units
		return
	}
	b := c.band[x.j]
	if b == nil {
		b = make([]int64, bandLen)
		c.band[x.j] = b
	}
	b[x.q] += units
}

// usage is the units admitted over the trailing window (sliding), as of
// the last prune.
func usage(c *counter) int64 { return c.logSum }

// breaks lists the times in (from, to) at which a time kind's share may
// change by itself (a loan starting, lapsing or coming back), sorted.
func (l *Ledger) breaks(c *counter, from, to int64) []int64 {
	var ts []int64
	add := func(t int64) {
		if from < t && t < to {
			ts = append(ts, t)
		}
	}
	for _, o := range c.outs {
		add(o.given)
		add(l.regain(c, o))
	}
	for _, in := range c.ins {
		a, b := l.validity(c, in)
		add(a)
		add(b)
	}
	slices.Sort(ts)
	return slices.Compact(ts)
}

// settle brings a bucket's tokens to now: refilled at the share's rate,
// never above its capacity, through every change of the share since the
// last settle.
func (l *Ledger) settle(c *counter, now int64) {
	w := c.lim.Window
	if now <= c.ts {
		// The tokens above the capacity go (it fell at this instant: a
		// limit cut).
		c.tok = min(c.tok, l.capacity(c, now)*w)
		return
	}
	t := c.ts
	for _, b := range append(l.breaks(c, c.ts, now), now) {
		e := l.capacity(c, t)
		c.tok = min(c.tok, e*w)
		if b-t >= w {
			c.tok = e * w
		} else {
			c.tok = min(c.tok+e*(b-t), e*w)
		}
		t = b
	}
	c.tok = min(c.tok, l.capacity(c, now)*w)
	c.ts = now
}

// capacity is a bucket's capacity at t: its share, or 0 while loans made
// under another limit hold more of the region's units than its share
// (relimit), so that its tokens never fall below 0.
func (l *Ledger) capacity(c *counter, t int64) int64 { return max(l.eff(c, t), 0) }

// Admit decides an admission of cost against the region's share at now
// and charges it when admitted: what the gateways' scripts do for a
// global rule.
func (l *Ledger) Admit(name string, lim Limit, cost, now int64) (Admission, error) {
	if cost < 0 {
		return Admission{}, fmt.Errorf("regions: admit: %w: cost %d", ErrInvalid, cost)
	}
	if c, ok := l.counters[name]; ok && c.lim != lim && c.lim.Kind == lim.Kind && c.lim.Window == lim.Window {
		if err := lim.Validate(l.cfg); err != nil {
			return Admission{}, fmt.Errorf("regions: admit: %w", err)
		}
		l.relimit(c, lim, now)
	}
	c, err := l.lookup(name, lim, now)
	if err != nil {
		return Admission{}, fmt.Errorf("regions: admit: %w", err)
	}
	var a Admission
	switch lim.Kind {
	case FixedWindow:
		x := cellAt(lim.Window, l.cfg.Skew, now)
		room := int64(math.MaxInt64)
		for _, j := range windowsOf(x, lim.Window, now) {
			room = min(room, l.share(c, j)-l.usedAt(c, j, x))
		}
		if a.Allowed = room >= cost; a.Allowed {
			c.count(x, cost)
			room -= cost
		} else {
			a.RetryAfter = l.retryFixed(c, cost, now)
		}
		a.Remaining = max(room, 0)
	case SlidingWindow:
		room := l.eff(c, now) - usage(c)
		if a.Allowed = room >= cost; a.Allowed {
			c.log = append(c.log, logEntry{t: now, cost: cost})
			c.logSum += cost
			room -= cost
		} else {
			a.RetryAfter = l.retrySliding(c, cost, now)
		}
		a.Remaining = max(room, 0)
	case Bucket:
		w := lim.Window
		if a.Allowed = c.tok >= cost*w; a.Allowed {
			c.tok -= cost * w
		} else {
			a.RetryAfter = l.retryBucket(c, cost, now)
		}
		a.Remaining = max(c.tok/w, 0)
	}
	if !a.Allowed {
		c.promise = max(c.promise, now+a.RetryAfter)
	}
	return a, nil
}

// sureShare is a time kind's share at t > now as far as the region is
// sure of it: loans received end as recorded, loans given never come back.
func (l *Ledger) sureShare(c *counter, now, t int64) int64 {
	s := l.own(c, now)
	for _, in := range c.ins {
		if from, to := l.validity(c, in); from <= now && t < to {
			s += in.units
		}
	}
	return s
}

// retryFixed is the wait until a window the region is sure of has room
// for cost, counted from after the skew band at its start. Only the
// windows where a share or a count can change are looked at (fixedBreaks),
// so the work does not grow with how far ahead a loan reaches.
func (l *Ledger) retryFixed(c *counter, cost, now int64) int64 {
	w := c.lim.Window
	j := fdiv(now, w)
	last := j + 1
	for _, o := range c.outs {
		last = max(last, o.last+1)
	}
	for _, in := range c.ins {
		last = max(last, in.last+1)
	}
	for _, m := range l.fixedBreaks(c, j, last, j, j+1) {
		t := max(now, m*w+l.cfg.Skew)
		if t < (m+1)*w-l.cfg.Skew && l.share(c, m)-l.used(c, m) >= cost {
			return t - now
		}
	}
	// Not even the static share takes cost: the window after every known
	// loan is the best guess (docs/regions.md says when this is early).
	return (last+1)*w + l.cfg.Skew - now
}

// fixedBreaks lists, sorted, the windows in [lo, hi] at which a fixed
// window's share or count may differ from the window before (a loan's
// first window and the one after its last, a counted window and the one
// after it), and the windows also given: between two listed windows
// nothing changes, so looking at these is looking at all.
func (l *Ledger) fixedBreaks(c *counter, lo, hi int64, also ...int64) []int64 {
	var ws []int64
	add := func(m int64) {
		if lo <= m && m <= hi {
			ws = append(ws, m)
		}
	}
	for _, m := range also {
		add(m)
	}
	for m := range c.n {
		add(m)
		add(m + 1)
	}
	for m := range c.band { // counts in windows m-1 and m
		add(m - 1)
		add(m)
		add(m + 1)
	}
	for _, o := range c.outs {
		add(o.first)
		add(o.last + 1)
	}
	for _, in := range c.ins {
		add(in.first)
		add(in.last + 1)
	}
	slices.Sort(ws)
	return slices.Compact(ws)
}

// minRoomFixed is the least, over the windows lo to hi, of what is
// neither used nor kept. keepFixed is the same for every window after the
// current one, so the current window, the next and the breaks suffice.
func (l *Ledger) minRoomFixed(c *counter, lo, hi, keep, now int64) int64 {
	cur := fdiv(now, c.lim.Window)
	room := int64(math.MaxInt64)
	for _, j := range l.fixedBreaks(c, lo, hi, lo, cur, cur+1) {
		room = min(room, l.share(c, j)-l.used(c, j)-l.keepFixed(c, j, keep, now))
	}
	return room
}

// retrySliding is the wait until enough of what the region admitted has
// slid out for cost to fit the share it is sure of.
// The share it is sure of only falls with time, so the first moment that
// fits is when an admission slides out.
func (l *Ledger) retrySliding(c *counter, cost, now int64) int64 {
	u := usage(c)
	for i, e := range c.log {
		u -= e.cost
		if i+1 < len(c.log) && c.log[i+1].t == e.t {
			continue
		}
		if t := e.t + c.lim.Window; l.sureShare(c, now, t)-u >= cost {
			return t - now
		}
	}
	return c.lim.Window
}

// retryBucket is the wait until the tokens reach cost, refilling at the
// rate the region is sure of.
func (l *Ledger) retryBucket(c *counter, cost, now int64) int64 {
	w := c.lim.Window
	need := cost * w
	tok, t := c.tok, now
	ends := []int64{}
	for _, in := range c.ins {
		if _, to := l.validity(c, in); to > now {
			ends = append(ends, to)
		}
	}
	slices.Sort(ends)
	for _, b := range append(ends, math.MaxInt64) {
		e := l.sureShare(c, now, t)
		capa := e * w
		tok = min(tok, capa)
		if capa < need || e == 0 {
			if b == math.MaxInt64 {
				break
			}
			continue
		}
		// tok + e × dt >= need
		dt := (need - tok + e - 1) / e
		if t+dt < b {
			return t + dt - now
		}
		tok = min(tok+e*(b-t), capa)
		t = b
	}
	return w
}

// Give implements Store.
func (l *Ledger) Give(_ context.Context, o *Order, keep int64, now int64) (Loan, string, error) {
	if err := o.Validate(l.cfg); err != nil {
		return Loan{}, "", fmt.Errorf("regions: give: %w", err)
	}
	if o.Loan.From != l.region {
		return Loan{}, "", fmt.Errorf("regions: give: %w: loan from %q", ErrNotMine, o.Loan.From)
	}
	if l.fleet.Index(o.Loan.To) < 0 {
		return Loan{}, "", fmt.Errorf("regions: give: %w: loan to %q, not in the fleet", ErrInvalid, o.Loan.To)
	}
	if c, ok := l.counters[o.Loan.Counter]; ok && c.lim != o.Loan.Limit && c.lim.Kind == o.Loan.Limit.Kind &&
		c.lim.Window == o.Loan.Limit.Window && !l.holdsLoans(c, now) {
		// A region whose gateways have not decided the counter since its
		// limit changed (an override or a penalty elsewhere): holding no
		// loans, its ledger is carried over as they would carry it.
		l.relimit(c, o.Loan.Limit, now)
	}
	c, err := l.lookup(o.Loan.Counter, o.Loan.Limit, now)
	if err != nil {
		return Loan{}, "", fmt.Errorf("regions: give: %w", err)
	}
	keep = max(keep, 0)
	if rec, ok := c.outs[o.Loan.ID]; ok {
		if rec.to != o.Loan.To {
			return Loan{}, "", fmt.Errorf("regions: give: %w: loan %s went to %q, not %q", ErrInvalid, o.Loan.ID, rec.to, o.Loan.To)
		}
		reason := l.grow(c, rec, o.Loan.Units, o.Loan.Last, keep, now)
		return l.outLoanOf(o.Loan, rec), reason, nil
	}
	loan := o.Loan
	loan.Units = 0
	if o.Extend {
		return loan, RefusedUnknown, nil
	}
	if now < c.promise {
		return loan, RefusedPromised, nil
	}
	if c.lim.Kind == FixedWindow {
		first := max(loan.First, fdiv(now-l.cfg.Skew, c.lim.Window))
		if first > loan.Last {
			return loan, RefusedPast, nil
		}
		loan.First = first
	} else if now >= l.slotEnd(c, loan.Last)-l.cfg.Skew {
		return loan, RefusedPast, nil
	}
	loan.Units = min(o.Loan.Units, l.spare(c, loan.First, loan.Last, keep, now))
	if loan.Units <= 0 {
		loan.Units = 0
		return loan, RefusedNothing, nil
	}
	l.active[loan.Counter] = true
	c.outs[loan.ID] = &outLoan{to: loan.To, units: loan.Units, first: loan.First, last: loan.Last, given: now}
	return loan, "", nil
}

// spare is what the region can give now: for a fixed window, of every
// window first to last, what is neither used nor kept; for a sliding
// window, of its own units what its trailing use and its keep leave; for
// a bucket, its own units beyond keep. Buckets settle first, so the
// tokens above the new capacity are dropped at the current rate.
func (l *Ledger) spare(c *counter, first, last, keep, now int64) int64 {
	switch c.lim.Kind {
	case FixedWindow:
		return l.minRoomFixed(c, max(first, fdiv(now-l.cfg.Skew, c.lim.Window)), last, keep, now)
	case SlidingWindow:
		return min(l.own(c, now), l.eff(c, now)-max(usage(c), keep))
	default:
		l.settle(c, now)
		return l.own(c, now) - keep
	}
}

// grow extends an outgoing loan to last and, for sliding windows and
// buckets, raises it towards units, as far as the rules allow; it says
// why when it did not do all of it. A fixed window's loan never grows in
// units (its units belong to its windows): the coordinator lends more
// with a new loan.
func (l *Ledger) grow(c *counter, rec *outLoan, units, last, keep, now int64) string {
	if rec.void {
		return RefusedLimit
	}
	if last <= rec.last && units <= rec.units {
		return "" // a duplicate: the loan as it is
	}
	if now < c.promise {
		return RefusedPromised
	}
	if c.lim.Kind == FixedWindow {
		if last <= rec.last {
			return ""
		}
		if l.minRoomFixed(c, max(rec.last+1, fdiv(now-l.cfg.Skew, c.lim.Window)), last, keep, now) < rec.units {
			return RefusedNothing
		}
		rec.last = last
		return ""
	}
	if now >= l.regain(c, rec) {
		return RefusedPast
	}
	if c.lim.Kind == Bucket {
		l.settle(c, now)
	}
	reason := ""
	if last > rec.last {
		if l.own(c, now) < keep {
			reason = RefusedNothing
		} else {
			rec.last = last
		}
	}
	if units > rec.units {
		if add := min(units-rec.units, l.spare(c, rec.first, rec.last, keep, now)); add > 0 {
			rec.units += add
		} else {
			reason = RefusedNothing
		}
	}
	return reason
}

// keepFixed is what the region keeps of window j for its own demand: keep
// is over a whole window, prorated for the part of the current window
// still to come.
func (l *Ledger) keepFixed(c *counter, j, keep, now int64) int64 {
	w := c.lim.Window
	left := min(max((j+1)*w-now, 0), w)
	k, _ := mulDiv(keep, left, w)
	return k
}

func (l *Ledger) outLoanOf(asked Loan, rec *outLoan) Loan {
	asked.Units, asked.First, asked.Last = rec.units, rec.first, rec.last
	return asked
}

// Receive implements Store.
func (l *Ledger) Receive(_ context.Context, t *Transfer, now int64) (bool, string, error) {
	if err := t.Validate(l.cfg); err != nil {
		return false, "", fmt.Errorf("regions: receive: %w", err)
	}
	loan := t.Loan
	if loan.To != l.region {
		return false, "", fmt.Errorf("regions: receive: %w: loan to %q", ErrNotMine, loan.To)
	}
	if l.fleet.Index(loan.From) < 0 {
		return false, "", fmt.Errorf("regions: receive: %w: loan from %q, not in the fleet", ErrInvalid, loan.From)
	}
	c, err := l.lookup(loan.Counter, loan.Limit, now)
	if err != nil {
		return false, "", fmt.Errorf("regions: receive: %w", err)
	}
	if loan.Units == 0 {
		return false, RefusedNothing, nil
	}
	if c.lim.Kind == Bucket {
		l.settle(c, now)
	}
	if rec, ok := c.ins[loan.ID]; ok {
		if rec.void {
			return false, RefusedLimit, nil
		}
		if rec.from != loan.From || rec.first != loan.First || c.lim.Kind == FixedWindow && rec.units != loan.Units {
			return false, "", fmt.Errorf("regions: receive: %w: loan %s was %d units from %q from slot %d", ErrInvalid, loan.ID, rec.units, rec.from, rec.first)
		}
		if c.lim.Kind != FixedWindow {
			if _, to := l.validity(c, rec); now >= to {
				return false, RefusedLapsed, nil
			}
		}
		if loan.Last <= rec.last && loan.Units <= rec.units {
			return false, "", nil
		}
		// Both only grow: a reordered older copy changes nothing.
		rec.last, rec.units = max(rec.last, loan.Last), max(rec.units, loan.Units)
		return true, "", nil
	}
	if c.lim.Kind == FixedWindow && now >= l.slotEnd(c, loan.Last)+l.cfg.Skew ||
		c.lim.Kind != FixedWindow && now >= l.slotEnd(c, loan.Last)-l.cfg.Skew {
		return false, RefusedExpired, nil
	}
	l.active[loan.Counter] = true
	c.ins[loan.ID] = &inLoan{from: loan.From, units: loan.Units, first: loan.First, last: loan.Last, received: now}
	return true, "", nil
}

// State implements Store.
func (l *Ledger) State(_ context.Context, name string, lim Limit, now int64) (CounterState, error) {
	c, err := l.lookup(name, lim, now)
	if err != nil {
		return CounterState{}, fmt.Errorf("regions: state: %w", err)
	}
	var s CounterState
	switch lim.Kind {
	case FixedWindow:
		j := fdiv(now, lim.Window)
		s.Share, s.Used = l.share(c, j), l.used(c, j)
	case SlidingWindow:
		s.Share, s.Used = l.eff(c, now), usage(c)
	case Bucket:
		s.Share = l.eff(c, now)
		s.Used = (s.Share*lim.Window - c.tok + lim.Window - 1) / lim.Window
	}
	s.Share, s.Used = max(s.Share, 0), max(s.Used, 0)
	for _, id := range slices.SortedFunc(maps.Keys(c.outs), LoanID.Compare) {
		o := c.outs[id]
		if o.void {
			continue
		}
		s.Out = append(s.Out, LoanState{ID: id, To: o.to, Units: o.units, First: o.first, Last: o.last})
	}
	return s, nil
}

// Active implements Store.
func (l *Ledger) Active(_ context.Context, now int64) ([]Named, error) {
	var out []Named
	for name := range l.active {
		c := l.counters[name]
		l.prune(c, now)
		if len(c.outs) > 0 || len(c.ins) > 0 {
			out = append(out, Named{Counter: name, Limit: c.lim})
		} else {
			delete(l.active, name)
		}
	}
	slices.SortFunc(out, func(a, b Named) int { return strings.Compare(a.Counter, b.Counter) })
	return out, nil
}

// Inspection is a counter's shares as the ledger holds them, for checks.
type Inspection struct {
	Kind Kind
	// Limit is the limit the ledger holds for the counter.
	Limit Limit
	// Share is a sliding window's or a bucket's share now.
	Share int64
	// Windows are a fixed window's windows the region counts in now, and
	// their shares and counts.
	Windows []WindowShare
}

// WindowShare is one window of a fixed-window counter.
type WindowShare struct {
	Window, Share, Used int64
}

// Inspect answers the counter's shares at now without changing anything
// but the pruning of what can no longer count; ok is false for a counter
// the ledger has never seen.
func (l *Ledger) Inspect(name string, now int64) (Inspection, bool) {
	c, ok := l.counters[name]
	if !ok {
		return Inspection{}, false
	}
	in := Inspection{Kind: c.lim.Kind, Limit: c.lim}
	switch c.lim.Kind {
	case FixedWindow:
		for _, j := range l.charged(c, now) {
			in.Windows = append(in.Windows, WindowShare{Window: j, Share: l.share(c, j), Used: l.used(c, j)})
		}
	default:
		in.Share = l.eff(c, now)
	}
	return in, true
}

// Static is the region's static share of a limit of units.
func (l *Ledger) Static(units int64) int64 { return l.fleet.Static(units)[l.index] }

// Counters is the number of counters the ledger holds.
func (l *Ledger) Counters() int { return len(l.counters) }
