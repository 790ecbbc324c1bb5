package regionsim

import (
	"cmp"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/tollgate/tollgate/internal/regions"
)

// Net is the network between regions. Each directed link gets a base delay
// drawn once from [MinDelay, MaxDelay]; every message adds an exponential
// jitter (which reorders), may be lost or duplicated, and may be held for
// a long time (a stale message arriving after the state it was about has
// moved on). Messages within a region take a few hundred microseconds and
// are never lost.
type Net struct {
	MinDelay, MaxDelay time.Duration
	Jitter             time.Duration // mean
	Loss, Dup          float64
	Stale              float64       // probability of being held 1 s to StaleMax
	StaleMax           time.Duration // default 30 s
}

// Options configure a Sim.
type Options struct {
	Seed    uint64
	Regions int // 1 to 7 (default 3)
	Config  regions.Config
	Net     Net
	// NoSkew puts every clock on true time; otherwise each region's clock
	// is off by a fixed amount within Config.Skew, a third of them at the
	// bound.
	NoSkew bool
	// DemandLag is how long after a decision its region's agent counts
	// it (the decision stream's lag to the aggregator); 0: at once.
	DemandLag time.Duration
	// DemandBatch, if set, delivers the decisions to the agents in
	// batches: each at the first multiple of it (true time) at or after
	// its decision plus DemandLag, as a decision stream consumed in polls
	// does.
	DemandBatch time.Duration
	// Log receives the protocol's logs (nil: discard).
	Log *slog.Logger
	// Ledger, if set, makes each region's ledger (for instance one kept in
	// a real Redis); nil for a region, or a nil Ledger option, is the
	// exact in-memory regions.Ledger.
	Ledger func(cfg regions.Config, fleet regions.Fleet, region string) (Ledger, error)
}

// Ledger is a region's shares as the simulation uses them: a
// regions.Store, and admissions and inspections as regions.Ledger answers
// them.
type Ledger interface {
	regions.Store
	Admit(ctx context.Context, counter string, lim regions.Limit, cost, now int64) (regions.Admission, error)
	Inspect(ctx context.Context, counter string, now int64) (regions.Inspection, bool, error)
}

// memLedger is the in-memory regions.Ledger as a Ledger.
type memLedger struct{ *regions.Ledger }

var _ Ledger = memLedger{}

func (m memLedger) Admit(_ context.Context, counter string, lim regions.Limit, cost, now int64) (regions.Admission, error) {
	return m.Ledger.Admit(counter, lim, cost, now)
}

func (m memLedger) Inspect(_ context.Context, counter string, now int64) (regions.Inspection, bool, error) {
	in, ok := m.Ledger.Inspect(counter, now)
	return in, ok, nil
}

// Names are the regions' names, in fleet order.
var Names = []string{"r1", "r2", "r3", "r4", "r5", "r6", "r7"}

// Sim is one simulated fleet. It is not safe for concurrent use.
type Sim struct {
	cfg   regions.Config
	fleet regions.Fleet
	net   Net
	log   *slog.Logger
	rng   *rand.Rand
	ctx   context.Context

	start, now int64
	q          events
	seq        uint64
	regs       []*region
	cut        [][]bool
	delay      [][]int64

	counters map[string]*Counter
	order    []*Counter
	cold     []*Counter
	coldRate float64
	lag      int64 // Options.DemandLag, µs
	batch    int64 // Options.DemandBatch, µs
	coldGen  int

	stats Stats
	err   error
}

// region is one region of the simulation.
type region struct {
	idx    int
	name   string
	offset int64 // its clock minus true time
	ledger Ledger
	agent  *regions.Region
	coord  *regions.Coordinator
	up     bool
	// seen is the highest epoch any message delivered to the region
	// named, kept across its agent's restarts as the aggregator keeps it:
	// a coordinator it starts never reuses an epoch (a restarted agent
	// forgets the highest it had seen).
	seen regions.Epoch
}

// Stats counts a run.
type Stats struct {
	Steps                                       int64
	Requests, Admitted, Rejected, Lost          int64
	FalseRejections                             int64
	Messages, Entries                           int64 // crossing regions
	ByKind                                      map[string]int64
	Dropped, Duplicated                         int64
	Coordinators                                int // started, the first included
	Checks                                      int64
	Orders, Gives, Transfers, Applied, Refusals int64
	// Mismatches are orders and transfers a region refused because they
	// name another limit than the one it decides the counter under.
	Mismatches int64
}

// New builds a fleet of opts.Regions regions (equal weights), region r1
// running the first coordinator. Nothing runs until RunFor.
func New(opts Options) (*Sim, error) {
	opts.Regions = cmp.Or(opts.Regions, 3)
	if opts.Regions < 1 || opts.Regions > len(Names) {
		return nil, fmt.Errorf("regionsim: %d regions, want 1 to %d", opts.Regions, len(Names))
	}
	cfg := opts.Config.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("regionsim: %w", err)
	}
	opts.Net.StaleMax = cmp.Or(opts.Net.StaleMax, 30*time.Second)
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Sim{
		cfg: cfg, fleet: regions.EqualFleet(Names[:opts.Regions]...), net: opts.Net, log: log,
		rng: rand.New(rand.NewPCG(opts.Seed, opts.Seed^0x9e3779b97f4a7c15)), ctx: context.Background(),
		counters: map[string]*Counter{}, stats: Stats{ByKind: map[string]int64{}}, lag: opts.DemandLag.Microseconds(),
		batch: opts.DemandBatch.Microseconds(),
	}
	// Start somewhere in 2024, at no particular boundary.
	s.start = 1_704_067_200_000_000 + s.rng.Int64N(86_400_000_000)
	s.now = s.start
	n := opts.Regions
	s.cut = make([][]bool, n)
	s.delay = make([][]int64, n)
	for i := range n {
		s.cut[i] = make([]bool, n)
		s.delay[i] = make([]int64, n)
		for j := range n {
			lo, hi := opts.Net.MinDelay.Microseconds(), opts.Net.MaxDelay.Microseconds()
			s.delay[i][j] = lo
			if hi > lo {
				s.delay[i][j] += s.rng.Int64N(hi - lo + 1)
			}
		}
	}
	for i := range n {
		r := &region{idx: i, name: Names[i], up: true}
		if !opts.NoSkew && cfg.Skew > 0 {
			switch s.rng.IntN(3) {
			case 0:
				r.offset = cfg.Skew
				if s.rng.IntN(2) == 0 {
					r.offset = -cfg.Skew
				}
			default:
				r.offset = s.rng.Int64N(2*cfg.Skew+1) - cfg.Skew
			}
		}
		if opts.Ledger != nil {
			l, err := opts.Ledger(cfg, s.fleet, r.name)
			if err != nil {
				return nil, fmt.Errorf("regionsim: %w", err)
			}
			r.ledger = l
		}
		if r.ledger == nil {
			l, err := regions.NewLedger(cfg, s.fleet, r.name)
			if err != nil {
				return nil, fmt.Errorf("regionsim: %w", err)
			}
			r.ledger = memLedger{l}
		}
		s.regs = append(s.regs, r)
		if err := s.startAgent(r); err != nil {
			return nil, err
		}
		s.scheduleTicks(r)
	}
	if err := s.startCoordinator(s.regs[0], regions.NewEpoch(1, 0)); err != nil {
		return nil, err
	}
	s.every(s.cfg.Period, s.sweep)
	return s, nil
}

// Config is the protocol configuration the fleet runs.
func (s *Sim) Config() regions.Config { return s.cfg }

// Fleet is the simulated fleet.
func (s *Sim) Fleet() regions.Fleet { return s.fleet }

// Regions is the number of regions.
func (s *Sim) Regions() int { return len(s.regs) }

// Stats is what the run counted so far.
func (s *Sim) Stats() Stats { return s.stats }

// Elapsed is the true time since the start.
func (s *Sim) Elapsed() time.Duration { return time.Duration(s.now-s.start) * time.Microsecond }

// Offset is region i's clock minus true time.
func (s *Sim) Offset(i int) time.Duration { return time.Duration(s.regs[i].offset) * time.Microsecond }

func (s *Sim) local(r *region) int64 { return s.now + r.offset }

// Err is the first violation found, if any.
func (s *Sim) Err() error { return s.err }

func (s *Sim) fail(err error) {
	if s.err == nil {
		s.err = fmt.Errorf("at %v (step %d): %w", s.Elapsed(), s.stats.Steps, err)
	}
}

// events is the queue, ordered by time then sequence.
type event struct {
	at  int64
	seq uint64
	fn  func()
}

type events []*event

func (q events) Len() int { return len(q) }
func (q events) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q events) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *events) Push(x any)   { *q = append(*q, x.(*event)) }
func (q *events) Pop() any {
	old := *q
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	return e
}

func (s *Sim) schedule(at int64, fn func()) {
	s.seq++
	heap.Push(&s.q, &event{at: max(at, s.now), seq: s.seq, fn: fn})
}

// At runs fn at d after the start (or now, if that has passed).
func (s *Sim) At(d time.Duration, fn func()) { s.schedule(s.start+d.Microseconds(), fn) }

// every runs fn every d of true time from now on.
func (s *Sim) every(d int64, fn func()) {
	var tick func()
	tick = func() {
		fn()
		s.schedule(s.now+d, tick)
	}
	s.schedule(s.now+d, tick)
}

// RunFor runs d of true time, or until the first violation, which it
// returns.
func (s *Sim) RunFor(d time.Duration) error {
	end := s.now + d.Microseconds()
	for s.err == nil && s.q.Len() > 0 && s.q[0].at <= end {
		e := heap.Pop(&s.q).(*event)
		s.now = e.at
		s.stats.Steps++
		e.fn()
	}
	if s.err == nil {
		s.now = max(s.now, end)
	}
	return s.err
}

// exp draws an exponential time with the given mean (µs).
func (s *Sim) exp(mean float64) int64 {
	if mean <= 0 {
		return 0
	}
	return int64(math.Ceil(s.rng.ExpFloat64() * mean))
}

// startAgent gives region r a fresh agent (its ledger is its Redis: it
// stays).
func (s *Sim) startAgent(r *region) error {
	a, err := regions.NewRegion(s.cfg, s.fleet, r.name, countingStore{r.ledger, s}, s.transport(r.idx), s.log, s.local(r))
	if err != nil {
		return fmt.Errorf("regionsim: %w", err)
	}
	r.agent = a
	return nil
}

// countingStore is a region's ledger that counts the transfers it applies.
type countingStore struct {
	Ledger
	s *Sim
}

func (c countingStore) Receive(ctx context.Context, t *regions.Transfer, now int64) (bool, string, error) {
	ok, why, err := c.Ledger.Receive(ctx, t, now)
	if ok {
		c.s.stats.Applied++
	}
	return ok, why, err
}

func (s *Sim) startCoordinator(r *region, e regions.Epoch) error {
	c, err := regions.NewCoordinator(s.cfg, s.fleet, e, s.transport(r.idx), s.log)
	if err != nil {
		return fmt.Errorf("regionsim: %w", err)
	}
	r.coord = c
	r.agent.Lead(e, s.local(r))
	s.stats.Coordinators++
	return nil
}

// scheduleTicks runs region r's ticks, at its own clock's boundaries and
// every tenth of a period between, and its coordinator's plan ticks.
func (s *Sim) scheduleTicks(r *region) {
	p := s.cfg.Period
	next := func(offset int64) int64 { // next true time at which r's clock reads k×P + offset
		local := s.local(r)
		b := (floorDiv(local-offset, p)+1)*p + offset
		return b - r.offset
	}
	var tick, plan func()
	tick = func() {
		if r.up {
			if err := r.agent.Tick(s.ctx, s.local(r)); err != nil {
				s.fail(fmt.Errorf("region %s tick: %w", r.name, err))
			}
			if r.coord == nil {
				if e, ok := r.agent.Candidate(s.local(r)); ok {
					if e <= r.seen {
						e = regions.NewEpoch(r.seen.Term()+1, e.Index())
					}
					if err := s.startCoordinator(r, e); err != nil {
						s.fail(err)
					}
				}
			}
		}
		// Between boundaries too, as the aggregator does, for the agent's
		// urgent reports.
		s.schedule(min(next(0), s.now+p/10), tick)
	}
	plan = func() {
		if r.up && r.coord != nil {
			r.coord.Tick(s.local(r))
			if r.coord.Deposed() {
				r.coord = nil
			}
		}
		s.schedule(next(s.cfg.PlanOffset), plan)
	}
	s.schedule(next(0), tick)
	s.schedule(next(s.cfg.PlanOffset), plan)
}

func (s *Sim) transport(from int) regions.Transport {
	return regions.TransportFunc(func(to regions.Node, m regions.Message) { s.send(from, to, m) })
}

// send routes a message from region index from; broadcasts go to every
// region (or coordinator) at the moment of sending.
func (s *Sim) send(from int, to regions.Node, m regions.Message) {
	var dst []int
	switch to {
	case regions.ToCoordinators:
		for _, r := range s.regs {
			if r.coord != nil {
				dst = append(dst, r.idx)
			}
		}
	case regions.ToRegions:
		for _, r := range s.regs {
			dst = append(dst, r.idx)
		}
	default:
		if j := s.fleet.Index(string(to)); j >= 0 {
			dst = append(dst, j)
		}
	}
	kind := regions.TypeName(m)
	switch m := m.(type) {
	case *regions.Order:
		s.stats.Orders++
	case *regions.Transfer:
		s.stats.Transfers++
	case *regions.GiveResult:
		if m.Loan.Units > 0 && m.Refused == "" {
			s.stats.Gives++
		} else {
			s.stats.Refusals++
		}
	}
	for _, j := range dst {
		if j != from {
			s.stats.Messages++
			s.stats.ByKind[kind]++
			if rep, ok := m.(*regions.Report); ok {
				s.stats.Entries += int64(max(len(rep.Counters), 1))
			} else {
				s.stats.Entries++
			}
		}
		s.transmit(from, j, to == regions.ToCoordinators, m)
	}
}

// transmit carries one copy (or two) of m from region i to region j.
func (s *Sim) transmit(i, j int, toCoord bool, m regions.Message) {
	if i == j {
		s.schedule(s.now+50+s.rng.Int64N(450), func() { s.deliver(i, j, toCoord, m) })
		return
	}
	if s.cut[i][j] || !s.regs[i].up || !s.regs[j].up || s.rng.Float64() < s.net.Loss {
		s.stats.Dropped++
		return
	}
	copies := 1
	if s.rng.Float64() < s.net.Dup {
		copies = 2
		s.stats.Duplicated++
	}
	for range copies {
		d := s.delay[i][j] + s.exp(float64(s.net.Jitter.Microseconds()))
		if s.rng.Float64() < s.net.Stale {
			lo := int64(1_000_000)
			d += lo + s.rng.Int64N(max(s.net.StaleMax.Microseconds()-lo, 1))
		}
		s.schedule(s.now+d, func() { s.deliver(i, j, toCoord, m) })
	}
}

func (s *Sim) deliver(i, j int, toCoord bool, m regions.Message) {
	r := s.regs[j]
	if i != j && (s.cut[i][j] || !r.up) {
		s.stats.Dropped++
		return
	}
	r.seen = max(r.seen, regions.EpochOf(m))
	if toCoord {
		if r.coord == nil {
			return
		}
		if err := r.coord.Handle(m, s.local(r)); err != nil {
			s.fail(fmt.Errorf("coordinator in %s: %w", r.name, err))
		}
		if r.coord.Deposed() {
			r.coord = nil
		}
		return
	}
	if err := r.agent.Handle(s.ctx, m, s.local(r)); errors.Is(err, regions.ErrLimitMismatch) {
		// An order or a transfer made under another limit than the
		// region decides the counter under now: refused, nothing changed.
		s.stats.Mismatches++
	} else if err != nil {
		s.fail(fmt.Errorf("region %s: %w", r.name, err))
		return
	}
	var name string
	switch m := m.(type) {
	case *regions.Order:
		name = m.Loan.Counter
	case *regions.Transfer:
		name = m.Loan.Counter
	default:
		return
	}
	if c := s.counters[name]; c != nil {
		s.checkShares(c)
	}
}

// sweep checks the shares of every counter holding loans, once a period.
func (s *Sim) sweep() {
	seen := map[string]bool{}
	for _, r := range s.regs {
		active, err := r.ledger.Active(s.ctx, s.local(r))
		if err != nil {
			s.fail(err)
			return
		}
		for _, a := range active {
			if !seen[a.Counter] {
				seen[a.Counter] = true
				if c := s.counters[a.Counter]; c != nil {
					s.checkShares(c)
				}
			}
		}
	}
}

// checkShares asserts that the shares the regions hold now, each on its
// own clock, sum to at most the limit. When the regions decide the
// counter under different limits (an override or a penalty reaching them
// at different times), the bound is the largest limit a region holds;
// once they all hold the same one, it is that one, whatever was lent
// under another.
func (s *Sim) checkShares(c *Counter) {
	s.stats.Checks++
	type held struct {
		in    regions.Inspection
		ok    bool
		lim   regions.Limit
		share int64 // the static share of lim, for a region without a ledger
	}
	hs := make([]held, len(s.regs))
	var bound int64
	same := true
	for i, r := range s.regs {
		h := held{lim: c.limitIn(i)}
		if h.in, h.ok = s.inspect(r, c); h.ok {
			h.lim = h.in.Limit
		} else {
			h.share = s.fleet.Static(h.lim.Units)[i]
		}
		if i > 0 && h.lim != hs[0].lim {
			same = false
		}
		bound = max(bound, h.lim.Units)
		hs[i] = h
	}
	desc := fmt.Sprintf("%d (the largest limit a region holds)", bound)
	if same {
		desc = fmt.Sprintf("%d (every region's limit)", bound)
	}
	if c.Limit.Kind != regions.FixedWindow {
		var sum int64
		for _, h := range hs {
			if h.ok {
				sum += max(h.in.Share, 0)
			} else {
				sum += h.share
			}
		}
		if sum > bound {
			s.fail(fmt.Errorf("counter %s: shares sum to %d > %s%s", c.Name, sum, desc, s.describe(c)))
		}
		return
	}
	sums := map[int64]int64{}
	for i, h := range hs {
		if h.ok {
			for _, w := range h.in.Windows {
				sums[w.Window] += max(w.Share, 0)
			}
			continue
		}
		for _, w := range windowsAt(s.local(s.regs[i]), c.Limit.Window, s.cfg.Skew) {
			sums[w] += h.share
		}
	}
	for w, sum := range sums {
		if sum > bound {
			s.fail(fmt.Errorf("counter %s: shares of window %d sum to %d > %s%s", c.Name, w, sum, desc, s.describe(c)))
		}
	}
}

// inspect is region r's inspection of c now; a failure fails the run.
func (s *Sim) inspect(r *region, c *Counter) (regions.Inspection, bool) {
	in, ok, err := r.ledger.Inspect(s.ctx, c.Name, s.local(r))
	if err != nil {
		s.fail(fmt.Errorf("region %s inspect %s: %w", r.name, c.Name, err))
	}
	return in, ok
}

// windowsAt is the windows an admission at local time t counts in: its
// own, and the neighbour whose boundary is within skew.
func windowsAt(t, w, skew int64) []int64 {
	j := floorDiv(t, w)
	ws := []int64{j}
	if t-j*w < skew {
		ws = append(ws, j-1)
	}
	if (j+1)*w-t <= skew {
		ws = append(ws, j+1)
	}
	return ws
}

func (s *Sim) describe(c *Counter) string {
	out := ""
	for _, r := range s.regs {
		in, _, _ := r.ledger.Inspect(s.ctx, c.Name, s.local(r))
		out += fmt.Sprintf("; %s (clock %+dµs) %+v", r.name, r.offset, in)
	}
	return out
}

// Partition cuts the links between side and the other regions: both ways,
// or with oneWay only from side to the others.
func (s *Sim) Partition(side []int, oneWay bool) {
	for i := range s.regs {
		for j := range s.regs {
			in, jn := slices.Contains(side, i), slices.Contains(side, j)
			if in && !jn || !oneWay && !in && jn {
				s.cut[i][j] = true
			}
		}
	}
}

// Heal restores every link.
func (s *Sim) Heal() {
	for i := range s.cut {
		clear(s.cut[i])
	}
}

// CrashCoordinator stops the coordinator running in region i, if any.
func (s *Sim) CrashCoordinator(i int) { s.regs[i].coord = nil }

// RestartAgent restarts region i's aggregator: a fresh agent, and no
// coordinator; its Redis keeps its ledger.
func (s *Sim) RestartAgent(i int) {
	r := s.regs[i]
	r.coord = nil
	if err := s.startAgent(r); err != nil {
		s.fail(err)
	}
}

// Outage takes region i off the network and its traffic away for d, then
// restarts its aggregator.
func (s *Sim) Outage(i int, d time.Duration) {
	r := s.regs[i]
	if !r.up {
		return
	}
	r.up, r.coord = false, nil
	s.schedule(s.now+d.Microseconds(), func() {
		r.up = true
		if err := s.startAgent(r); err != nil {
			s.fail(err)
		}
	})
}

// Coordinators lists the epochs of the coordinators running.
func (s *Sim) Coordinators() []regions.Epoch {
	var es []regions.Epoch
	for _, r := range s.regs {
		if r.coord != nil {
			es = append(es, r.coord.Epoch())
		}
	}
	return es
}

// Leader is the running coordinator with the highest epoch, or nil.
func (s *Sim) leader() *regions.Coordinator {
	var best *regions.Coordinator
	for _, r := range s.regs {
		if r.coord != nil && (best == nil || r.coord.Epoch() > best.Epoch()) {
			best = r.coord
		}
	}
	return best
}

// Targets is the leading coordinator's last targets for c, or nil.
func (s *Sim) Targets(c *Counter) []int64 {
	if l := s.leader(); l != nil {
		return l.Targets(c.Name)
	}
	return nil
}

// Share is region i's share of c now and what it has used of it (the
// current window for a fixed window).
func (s *Sim) Share(c *Counter, i int) (share, used int64) {
	r := s.regs[i]
	st, err := r.ledger.State(s.ctx, c.Name, c.Limit, s.local(r))
	if err != nil {
		s.fail(err)
	}
	return st.Share, st.Used
}

// Static is every region's static share of c.
func (s *Sim) Static(c *Counter) []int64 { return s.fleet.Static(c.Limit.Units) }
