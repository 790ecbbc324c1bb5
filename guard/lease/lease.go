// Package lease is the guard's local fast path: a guard.Store
// decorator that answers hot counters from memory, without a Redis round
// trip, while the fleet never admits more than Redis granted.
//
// Leases. When a counter is hot on this gateway, the check that goes to
// Redis also asks for a lease (guard.Counter.Lease): units charged in
// advance, sized to the counter's recent rate here over the lease's
// lifetime. Redis grants at most a quarter of what is free after the
// request, so leases shrink to nothing as the counter nears its limit.
// Later checks take their cost from the lease with one atomic operation;
// what a lease did not use is given back (guard.Counter.Return) by the
// next check that renews it, or by the background sweep once the lease
// has expired. A lease never outlives the window it was charged in
// (fixed_window, sliding_window_counter: the current sub-window), nor 1 %
// of a token bucket's or GCRA's full-refill time, which bounds what a
// bucket may admit beyond the reference model: units held while the
// bucket would have been full refill in Redis, at most rate × lifetime,
// that is 1 % of the limit (see docs/guard.md). Window leases, exact,
// live up to WithWindowTTL (a minute), bucket leases up to WithMaxTTL
// (10 s).
//
// Negative cache. A counter Redis has just rejected is answered locally,
// with the figures of that rejection, until its Retry-After has passed: no
// Redis call per rejection once a counter is known to be over. It is keyed
// by counter, not by API key, and holds only for the cost that was
// rejected. Retry-After is never early: the rejection's local deadline is
// measured from the moment its reply arrived, after Redis decided.
//
// Both are dropped on a ruleset change (Invalidate, which the guard calls
// from SetRules), when a counter's parameters change (an override), when
// the counter is reset (OpReset: its leases vanish with it) and, for the
// negative cache, on a quota grant (OpAddQuota). Strict counters
// (`strict: true`) and calls holding a shadow counter always go to the
// wrapped store; sliding_window_log counters get no leases (a log's
// charges cannot be given back in part), only the negative cache.
//
// Decisions answered locally carry the figures Redis would have answered
// as far as this gateway knows them: remaining counts this gateway's
// unused lease units as available (as Redis would without leases), but not
// what other gateways did since the lease was granted nor what refilled
// since; reset and `t` count units leased and not yet given back as
// consumed, so they may be later than without leases by the time those
// units take to refill. docs/guard.md lists the differences.
package lease

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/rules"
)

// Defaults.
const (
	// DefaultMaxTTL is the longest a token bucket's or GCRA's lease lives
	// (WithMaxTTL).
	DefaultMaxTTL = 10 * time.Second
	// DefaultWindowTTL is the longest a fixed window's or sliding window
	// counter's lease lives (WithWindowTTL).
	DefaultWindowTTL = time.Minute
	// DefaultCounters is how many counters the store keeps local state
	// for (WithCounters).
	DefaultCounters = 1 << 16
	// DefaultSweepInterval is how often expired leases are given back
	// (WithSweepInterval).
	DefaultSweepInterval = 250 * time.Millisecond
	// returnTimeout is the deadline of one background call giving
	// leases back.
	returnTimeout = time.Second
	// BucketShare is the part of a token bucket's or GCRA's full-refill
	// time a lease may live: it bounds what a bucket may admit beyond the
	// reference model to this part of its limit (the bound: 1 %).
	BucketShare = 0.01
	// minWant is the smallest lease worth asking for: a lease of one unit
	// saves nothing and costs a return.
	minWant = 2
	// maxCounters is the most counters of one call decided locally.
	maxCounters = 8
	// returnBatch is the most counters one background return call holds.
	returnBatch = 32
	// windowMargin is kept between a lease's end and the end of the
	// window its units were charged in (µs).
	windowMargin = 1000
)

// Store is a guard.Store answering hot counters from leases and the
// negative cache, and everything else through the store it wraps. Create
// it with New; it is safe for concurrent use. New starts one goroutine,
// the sweep that gives back expired leases; Close stops it and waits for
// it, then gives back every lease.
type Store struct {
	inner     guard.Store
	namer     func(*guard.CounterID) string
	clock     func() int64
	maxTTL    int64
	windowTTL int64
	interval  time.Duration
	log       *slog.Logger

	tab   table
	epoch atomic.Uint64
	scans atomic.Int64 // the sweep's scans of the whole table, for the tests

	mu      sync.Mutex
	pending []guard.Counter // units to give back that a failed call could not
	// due lists the counters given a lease by the sweep tick (a multiple
	// of interval, in µs of the clock) from which that lease has ended,
	// so that a sweep visits the leases that ended since the last one
	// instead of scanning the whole table: an idle store pays nothing,
	// and a gateway holding 10 000 leases no longer reads each of them
	// four times a second (a tenth of a decision's CPU at 7,000/s was
	// that scan). A counter renewed sits in several lists; the sweep
	// closes only the lease it finds ended.
	due map[int64][]*entry
	// sweptEpoch is the epoch of the last sweep: a sweep that finds the
	// epoch moved (new rules, Invalidate) scans the whole table once,
	// leases of older epochs having ended before their time.
	sweptEpoch uint64

	quit   chan struct{}
	wg     sync.WaitGroup
	once   sync.Once
	closed atomic.Bool

	misses, bypass          atomic.Int64
	retiredLease, retiredNg atomic.Int64
	granted, returned       atomic.Int64
	dropped                 atomic.Int64
}

var (
	_ guard.Store       = (*Store)(nil)
	_ guard.Namer       = (*Store)(nil)
	_ guard.Forgetter   = (*Store)(nil)
	_ guard.Invalidator = (*Store)(nil)
	_ guard.LocalStore  = (*Store)(nil)
)

// Option configures a Store.
type Option func(*Store)

// WithClock sets the local clock, in microseconds (default: the monotonic
// clock). Lease lifetimes and negative-cache deadlines run on it; tests
// drive it by hand.
func WithClock(now func() int64) Option { return func(s *Store) { s.clock = now } }

// WithMaxTTL sets the longest a token bucket's or GCRA's lease lives
// (default DefaultMaxTTL): units a gateway holds are unavailable to the
// others for at most that long. They are further bounded by BucketShare
// of their full-refill time.
func WithMaxTTL(d time.Duration) Option { return func(s *Store) { s.maxTTL = d.Microseconds() } }

// WithWindowTTL sets the longest a lease of a fixed_window or
// sliding_window_counter counter lives (default DefaultWindowTTL), never
// past the end of the (sub-)window its units were counted in. Those
// leases admit nothing the exact counter would not, so they may live
// longer than a bucket's: at a few requests per second per key a lease
// that lives a minute serves the key with one Redis call where a
// ten-second one needs six. What it costs: units a gateway holds and does
// not use are unavailable to the others for up to that long.
func WithWindowTTL(d time.Duration) Option {
	return func(s *Store) { s.windowTTL = d.Microseconds() }
}

// WithCounters sets how many counters local state is kept for (default
// DefaultCounters, rounded up to a power of two); beyond it, idle counters
// make room and busy ones go to the wrapped store.
func WithCounters(n int) Option {
	return func(s *Store) {
		if n > 0 {
			s.tab.size = n
		}
	}
}

// WithSweepInterval sets how often the sweep gives back expired leases
// (default DefaultSweepInterval).
func WithSweepInterval(d time.Duration) Option { return func(s *Store) { s.interval = d } }

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option { return func(s *Store) { s.log = l } }

// New returns a Store wrapping inner, whose names it uses (guard.Namer;
// guard.PlainName for a store without one). It starts the sweep goroutine.
func New(inner guard.Store, opts ...Option) *Store {
	start := time.Now()
	s := &Store{
		inner:     inner,
		namer:     guard.PlainName,
		clock:     func() int64 { return int64(time.Since(start) / time.Microsecond) },
		maxTTL:    DefaultMaxTTL.Microseconds(),
		windowTTL: DefaultWindowTTL.Microseconds(),
		interval:  DefaultSweepInterval,
		quit:      make(chan struct{}),
	}
	s.tab.size = DefaultCounters
	if n, ok := inner.(guard.Namer); ok {
		s.namer = n.CounterName
	}
	for _, o := range opts {
		o(s)
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.tab.init()
	s.wg.Add(1)
	go s.sweeper()
	return s
}

// Close stops the sweep, waits for it, then gives back every lease's
// unused units (within the return timeout). Later calls pass through to
// the wrapped store. Close is idempotent and safe from many goroutines.
func (s *Store) Close() error {
	s.once.Do(func() {
		s.closed.Store(true)
		close(s.quit)
		s.wg.Wait()
		s.epoch.Add(1)
		s.sweep(true)
	})
	s.wg.Wait()
	return nil
}

// CounterName implements guard.Namer with the wrapped store's names.
func (s *Store) CounterName(id *guard.CounterID) string { return s.namer(id) }

// Invalidate implements guard.Invalidator: every lease and negative-cache
// entry is dropped at once; the sweep gives the leases' unused units back.
func (s *Store) Invalidate() { s.epoch.Add(1) }

// Stats are the store's counts since New.
type Stats struct {
	// Lease, Negative: calls answered locally from a lease, or rejected
	// from the negative cache.
	Lease, Negative int64
	// Miss: calls the fast path could have answered that went to the
	// wrapped store; Bypass: calls it never answers (strict or shadow
	// counters, other operations, explicit times).
	Miss, Bypass int64
	// Granted and Returned are lease units taken from and given back to
	// the wrapped store; Dropped, unused units whose return failed with
	// an unknown outcome (they stay charged: never given back twice).
	Granted, Returned, Dropped int64
}

// Stats returns the counts since New. It scans every counter's state:
// call it for metrics, not per decision.
func (s *Store) Stats() Stats {
	st := Stats{
		Lease:    s.retiredLease.Load(),
		Negative: s.retiredNg.Load(),
		Miss:     s.misses.Load(),
		Bypass:   s.bypass.Load(),
		Granted:  s.granted.Load(),
		Returned: s.returned.Load(),
		Dropped:  s.dropped.Load(),
	}
	s.tab.each(func(e *entry) {
		st.Lease += e.leaseHits.Load()
		if l := e.lease.Load(); l != nil {
			st.Lease += l.hits.Load()
		}
		st.Negative += e.negHits.Load()
	})
	return st
}

// entry is the local state of one counter.
type entry struct {
	name    string
	created int64 // local µs

	lease     atomic.Pointer[lease]
	last      atomic.Pointer[snap]
	refilling atomic.Bool
	dead      atomic.Bool
	negHits   atomic.Int64
	leaseHits atomic.Int64 // hits of leases replaced
	misses    atomic.Int64 // calls since the last refill that missed
	// swept: units used from leases the sweep closed since the last
	// refill, for want to count with the rest of the counter's rate.
	swept atomic.Int64

	mu    sync.Mutex
	since int64 // local µs the current rate period began (mu)

	// Owned by whoever holds refilling: life is the lifetime want sized
	// the lease being asked for on, for install to give it; leased that
	// the counter had a lease before (its next ones are renewals).
	life   int64
	leased bool
}

// lease is one grant of units. Its fields are immutable but units and
// hits; units is -1 once the lease is closed (its rest claimed).
type lease struct {
	units atomic.Int64
	hits  atomic.Int64

	alg     rules.Algorithm
	params  rules.Params
	ledger  *guard.Ledger // a global rule's share ledger: its units go back there
	epoch   uint64
	until   int64 // local µs: usable before
	granted int64
	token   string
	// What Redis answered with the grant: remaining with the lease counted
	// as consumed, and times as local µs; t and recv pair Redis time with
	// local time for the decision time of local answers.
	rem             int64
	resetAt, nextAt int64
	t, recv         int64
}

// take takes cost units; it returns the units left, or -1 when the lease
// has fewer than cost. peek only looks.
func (l *lease) take(cost int64, peek bool) int64 {
	for {
		u := l.units.Load()
		if u < cost {
			return -1
		}
		if peek {
			return u - cost
		}
		if l.units.CompareAndSwap(u, u-cost) {
			return u - cost
		}
	}
}

// result is the answer for a call admitted from l at local time now,
// with left units left: remaining counts them as available, as Redis
// would without the lease. `t` past the grant's is an upper bound: the
// time until the counter is full.
func (l *lease) result(now, left int64) guard.CounterResult {
	r := guard.CounterResult{
		Allowed:    true,
		Remaining:  l.rem + left,
		ResetAfter: max(l.resetAt-now, 0),
		NextAfter:  max(l.nextAt-now, 0),
	}
	if r.NextAfter == 0 && r.Remaining < l.params.Limit {
		r.NextAfter = r.ResetAfter
	}
	return r
}

// untake gives back units taken from l for a call that was not answered
// from leases after all. It reports false, and puts nothing back, once l
// is closed (its rest was claimed without them): the caller then gives
// them back to the wrapped store (putBack), or they would stay consumed
// there without being used.
func (l *lease) untake(units int64) bool {
	for {
		u := l.units.Load()
		if u < 0 {
			return false
		}
		if l.units.CompareAndSwap(u, u+units) {
			return true
		}
	}
}

// putBack gives back units taken from lease l of counter name for a call
// that was not admitted after all: to the lease, or to the wrapped store
// once the lease is closed.
func (s *Store) putBack(name string, l *lease, units int64) {
	if !l.untake(units) {
		s.giveBackLater(returnOf(name, l, units))
	}
}

// close claims the units left and makes the lease unusable; a second
// close gets 0.
func (l *lease) close() int64 { return max(l.units.Swap(-1), 0) }

// snap is what the last reply said of a counter, times as local µs. When
// rejected, the counter is answered locally for cost until until.
type snap struct {
	alg             rules.Algorithm
	params          rules.Params
	epoch           uint64
	rem             int64
	resetAt, nextAt int64
	t, recv         int64

	rejected bool
	cost     int64
	until    int64 // local µs
}

// Do implements guard.Store.
func (s *Store) Do(ctx context.Context, op guard.Op, now int64, counters []guard.Counter, res []guard.CounterResult) (int64, error) {
	switch op {
	case guard.OpCheck, guard.OpPeek:
		if now == 0 && s.eligible(counters) {
			if t, ok := s.local(op, counters, res); ok {
				return t, nil
			}
			return s.miss(ctx, op, counters, res)
		}
	case guard.OpReset, guard.OpAddQuota:
		t, err := s.inner.Do(ctx, op, now, counters, res)
		s.forget(op, counters)
		s.bypass.Add(1)
		return t, err
	}
	s.bypass.Add(1)
	return s.inner.Do(ctx, op, now, counters, res)
}

// DoLocal answers a check or a peek from leases or the negative cache
// alone (guard.LocalStore); ok is false, nothing charged, when Do would
// have to call the store.
func (s *Store) DoLocal(op guard.Op, counters []guard.Counter, res []guard.CounterResult) (int64, bool) {
	if (op != guard.OpCheck && op != guard.OpPeek) || !s.eligible(counters) {
		return 0, false
	}
	return s.local(op, counters, res)
}

// eligible reports whether the fast path may answer a call of counters.
func (s *Store) eligible(counters []guard.Counter) bool {
	if len(counters) == 0 || len(counters) > maxCounters || s.closed.Load() {
		return false
	}
	for i := range counters {
		if counters[i].Strict || counters[i].Shadow {
			return false
		}
	}
	return true
}

// leasable reports whether counters of alg may be leased.
func leasable(alg rules.Algorithm) bool { return alg != rules.SlidingWindowLog }

// usable reports whether l may answer c at local time now.
func (l *lease) usable(c *guard.Counter, now int64, epoch uint64) bool {
	return l != nil && now < l.until && l.epoch == epoch && l.params == c.Params && l.alg == c.Algorithm
}

// valid reports whether sn describes c under the current ruleset.
func (sn *snap) valid(c *guard.Counter, epoch uint64) bool {
	return sn != nil && sn.epoch == epoch && sn.params == c.Params && sn.alg == c.Algorithm
}

// local answers a call from leases (every counter takes its cost from
// its lease) or the negative cache (a counter was rejected for this cost
// and its Retry-After has not passed). ok is false when it cannot.
func (s *Store) local(op guard.Op, counters []guard.Counter, res []guard.CounterResult) (int64, bool) {
	var ents [maxCounters]*entry
	for i := range counters {
		if ents[i] = s.tab.get(counters[i].Name); ents[i] == nil {
			return 0, false
		}
	}
	now := s.clock()
	epoch := s.epoch.Load()
	peek := op == guard.OpPeek

	var (
		leases [maxCounters]*lease
		left   [maxCounters]int64
		n      int
	)
	for n = 0; n < len(counters); n++ {
		c := &counters[n]
		l := ents[n].lease.Load()
		if !l.usable(c, now, epoch) {
			break
		}
		if left[n] = l.take(c.Cost, peek); left[n] < 0 {
			break
		}
		leases[n] = l
	}
	if n == len(counters) {
		for i := range counters {
			l := leases[i]
			l.hits.Add(1)
			res[i] = l.result(now, left[i])
			res[i].Charged = !peek
		}
		return leases[0].t + now - leases[0].recv, true
	}
	// Give back what was taken: the call is not answered from leases.
	for i := 0; i < n; i++ {
		if !peek {
			s.putBack(counters[i].Name, leases[i], counters[i].Cost)
		}
	}
	return s.negative(counters, res, ents[:len(counters)], now, epoch)
}

// negative answers a call rejected by the negative cache: some counter
// was rejected for this cost and its Retry-After has not passed. Every
// other counter is answered from its lease or its last reply.
func (s *Store) negative(counters []guard.Counter, res []guard.CounterResult, ents []*entry, now int64, epoch uint64) (int64, bool) {
	var snaps [maxCounters]*snap
	rejecting := -1
	for i := range counters {
		sn := ents[i].last.Load()
		if !sn.valid(&counters[i], epoch) {
			sn = nil
		}
		snaps[i] = sn
		if sn != nil && sn.rejected && sn.cost == counters[i].Cost && now < sn.until && rejecting < 0 {
			rejecting = i
		}
	}
	if rejecting < 0 {
		return 0, false
	}
	for i := range counters {
		c := &counters[i]
		sn := snaps[i]
		switch {
		case sn != nil && sn.rejected && sn.cost == c.Cost && now < sn.until:
			res[i] = guard.CounterResult{
				Remaining:  sn.rem,
				ResetAfter: max(sn.resetAt-now, 0),
				NextAfter:  max(sn.nextAt-now, 0),
				RetryAfter: sn.until - now,
			}
		default:
			if l := ents[i].lease.Load(); l.usable(c, now, epoch) {
				if u := l.units.Load(); u >= c.Cost {
					res[i] = l.result(now, u-c.Cost)
					continue
				}
			}
			if sn == nil {
				return 0, false
			}
			// Not rejected a moment ago (or for another cost): its state
			// as last answered, and whether it could take the cost then.
			res[i] = guard.CounterResult{
				Allowed:    !sn.rejected && sn.rem >= c.Cost,
				Remaining:  sn.rem,
				ResetAfter: max(sn.resetAt-now, 0),
				NextAfter:  max(sn.nextAt-now, 0),
			}
			if !res[i].Allowed {
				return 0, false
			}
		}
	}
	ents[rejecting].negHits.Add(1)
	sn := snaps[rejecting]
	return sn.t + now - sn.recv, true
}

// miss sends a call to the wrapped store, asking for leases for the
// counters that are hot here and giving back the rest of their expiring
// leases, and records the reply for the fast path. A check's counters
// whose lease can take their cost take it and stay here: only the others
// are sent, and the request is admitted when they are (the cost goes back
// to the lease otherwise). A counter shared by many requests, such as a
// global one (one hot Cluster slot), is thus sent only to renew its
// lease, not with every request whose other counters miss.
func (s *Store) miss(ctx context.Context, op guard.Op, counters []guard.Counter, res []guard.CounterResult) (int64, error) {
	s.misses.Add(1)
	var (
		cbuf   [maxCounters]guard.Counter
		rbuf   [maxCounters]guard.CounterResult
		ents   [maxCounters]*entry
		refill [maxCounters]bool
		held   [maxCounters]*lease // per counter: the lease it took its cost from
		left   [maxCounters]int64
		idx    [maxCounters]int // per counter sent: its index in counters
	)
	send := s.clock()
	epoch := s.epoch.Load()
	if op == guard.OpCheck && len(counters) > 1 {
		for i := range counters {
			c := &counters[i]
			e := s.tab.get(c.Name)
			if e == nil {
				continue
			}
			if l := e.lease.Load(); l.usable(c, send, epoch) {
				if left[i] = l.take(c.Cost, false); left[i] >= 0 {
					held[i] = l
				}
			}
		}
	}
	cs := cbuf[:0]
	for i := range counters {
		if held[i] == nil {
			idx[len(cs)] = i
			cs = append(cs, counters[i])
		}
	}
	if len(cs) == 0 {
		// Every lease could take the cost after all (the others' calls
		// refilled them meanwhile).
		for i := range counters {
			held[i].hits.Add(1)
			res[i] = held[i].result(send, left[i])
			res[i].Charged = true
		}
		return held[0].t + send - held[0].recv, nil
	}
	t, err := s.decide(ctx, op, cs, rbuf[:len(cs)], ents[:len(cs)], refill[:len(cs)], send, epoch)
	recv := s.clock()
	admitted := err == nil
	for j := range cs {
		res[idx[j]] = rbuf[j]
		admitted = admitted && rbuf[j].Allowed
	}
	for i := range counters {
		l := held[i]
		if l == nil {
			continue
		}
		if admitted {
			l.hits.Add(1)
			res[i] = l.result(recv, left[i])
			res[i].Charged = true
			continue
		}
		// Not admitted: the cost goes back, and the figures are before it,
		// as a rejected check's.
		s.putBack(counters[i].Name, l, counters[i].Cost)
		res[i] = l.result(recv, left[i]+counters[i].Cost)
	}
	return t, err
}

// decide sends cs to the wrapped store, asking for leases and giving back
// expiring ones (see miss), and records the reply in the counters'
// entries (ents, refill: per counter of cs, filled in here).
func (s *Store) decide(ctx context.Context, op guard.Op, cs []guard.Counter, res []guard.CounterResult, ents []*entry, refill []bool, send int64, epoch uint64) (int64, error) {
	for i := range cs {
		c := &cs[i]
		e, evicted := s.tab.getOrCreate(c.Name, send)
		if evicted != nil {
			s.retire(evicted)
		}
		ents[i] = e
		if e == nil {
			continue
		}
		e.misses.Add(1)
		if op != guard.OpCheck || !leasable(c.Algorithm) || !e.refilling.CompareAndSwap(false, true) {
			continue
		}
		refill[i] = true
		used := e.swept.Swap(0)
		if l := e.lease.Load(); l != nil {
			left := l.close()
			used += l.granted - left
			if left > 0 {
				c.Token, c.Return = l.token, left
			}
		}
		c.Lease = s.want(e, c, send, used)
	}

	clear(res) // Returned is read after an error
	t, err := s.inner.Do(ctx, op, 0, cs, res)
	recv := s.clock()
	if err != nil {
		for i := range cs {
			if refill[i] {
				// A store deciding in parts may have given back some
				// returns before it failed: never give those twice.
				if cs[i].Return > 0 {
					s.afterFailedReturn(cs[i], res[i].Returned, err)
				}
				ents[i].refilling.Store(false)
			}
		}
		return t, err
	}
	for i := range cs {
		e := ents[i]
		if e == nil {
			continue
		}
		c, r := &cs[i], &res[i]
		if c.Return > 0 {
			s.returned.Add(c.Return)
		}
		if refill[i] {
			s.install(e, c, r, epoch, t, send, recv)
			e.refilling.Store(false)
		}
		// The caller sees what Redis would have answered without the
		// lease: its units as available.
		r.Remaining += r.Leased
		r.Leased = 0
		sn := &snap{
			alg: c.Algorithm, params: c.Params, epoch: epoch,
			rem: r.Remaining, resetAt: recv + r.ResetAfter, nextAt: recv + r.NextAfter,
			t: t, recv: recv,
		}
		if !r.Allowed {
			sn.rejected, sn.cost, sn.until = true, c.Cost, recv+r.RetryAfter
		}
		e.last.Store(sn)
	}
	return t, nil
}

// install makes the lease a reply granted the counter's current one.
// send and recv are the local times the call left and its reply came
// back; t is the Redis time it was decided at.
func (s *Store) install(e *entry, c *guard.Counter, r *guard.CounterResult, epoch uint64, t, send, recv int64) {
	if !r.Charged || r.Leased <= 0 {
		if old := e.lease.Swap(nil); old != nil {
			e.leaseHits.Add(old.hits.Load())
		}
		return
	}
	s.granted.Add(r.Leased)
	until := min(recv+e.life, s.windowEnd(c, t, send))
	e.leased = true
	l := &lease{
		alg: c.Algorithm, params: c.Params, ledger: c.Ledger, epoch: epoch,
		until: until, granted: r.Leased, token: r.Token,
		rem: r.Remaining, resetAt: recv + r.ResetAfter, nextAt: recv + r.NextAfter,
		t: t, recv: recv,
	}
	l.units.Store(r.Leased)
	old := e.lease.Swap(l)
	s.schedule(e, until)
	if old != nil {
		e.leaseHits.Add(old.hits.Load())
		if left := old.close(); left > 0 {
			s.giveBackLater(returnOf(e.name, old, left))
		}
	}
	if e.dead.Load() {
		// Evicted meanwhile: nobody will find this lease.
		if left := l.close(); left > 0 {
			s.giveBackLater(returnOf(e.name, l, left))
		}
	}
}

// want sizes the lease asked for with a miss: the counter's rate here
// (units used from the last lease — whether the miss or the sweep closed
// it — and calls that missed, over the time since the last refill) times
// the time the lease will live: its lifetime (spread, kept in e.life for
// install), and for a window no more than what is left of the window as
// the last reply's Redis time tells (units leased for after the window's
// end would be charged to a window that is over, never used). It is 0 for
// a counter seen for the first time, and when fewer than minWant units
// would be used.
func (s *Store) want(e *entry, c *guard.Counter, now, used int64) int64 {
	life := spread(s.lifetime(c), !e.leased)
	e.life = life
	if sn := e.last.Load(); sn != nil && sn.alg == c.Algorithm && sn.params == c.Params {
		if left := s.windowEnd(c, sn.t+now-sn.recv, now) - now; left < life {
			life = left
		}
	}
	e.mu.Lock()
	elapsed := now - e.since
	e.since = now
	e.mu.Unlock()
	calls := e.misses.Swap(0)
	if elapsed <= 0 {
		return 0
	}
	units := used + calls*max(c.Cost, 1)
	w := float64(units) / float64(elapsed) * float64(life)
	if w < minWant {
		return 0
	}
	return int64(min(w, float64(c.Params.Limit)))
}

// spread is the lifetime of a lease that may live life: a counter's
// first lease lives a random part of it, from a quarter to the whole,
// and its renewals life less a random part of up to a quarter. Counters
// first leased together (a gateway's start, a burst of new keys) would
// otherwise all renew together, a wave of Redis calls a lifetime after
// the start (a renewal of every hot counter within a quarter of the
// lifetime: at 10 000 keys, a tenth of the decisions of that stretch
// went to Redis, against a fortieth spread out); spread over the whole
// lifetime from the first lease on, they stay apart. A lease is sized on
// the lifetime it will have (want), so a shorter one takes fewer units.
func spread(life int64, first bool) int64 {
	switch {
	case life <= 4:
		return life
	case first:
		return life - rand.Int64N(life-life/4)
	}
	return life - rand.Int64N(life/4)
}

// lifetime is the longest a lease of c may live, in µs (windows: before
// the end of the window, windowEnd).
func (s *Store) lifetime(c *guard.Counter) int64 {
	if !c.Algorithm.Bucket() {
		return s.windowTTL
	}
	ttl := s.maxTTL
	if c.Params.FullDen > 0 {
		full := float64(c.Params.FullNum) / float64(c.Params.FullDen)
		ttl = min(ttl, int64(full*BucketShare))
	}
	return ttl
}

// windowEnd is the local time before which a lease of c charged at Redis
// time t must end: the end of the window (fixed_window) or sub-window
// (sliding_window_counter) its units were counted in, less a margin;
// send is the local time the call left, so the end is never later than
// the window's whatever the reply's delay.
func (s *Store) windowEnd(c *guard.Counter, t, send int64) int64 {
	var w int64
	switch c.Algorithm {
	case rules.FixedWindow:
		w = c.Params.Window
	case rules.SlidingWindowCounter:
		sw, q := guard.WindowScale(c.Params)
		w = sw * q
	default:
		return math.MaxInt64
	}
	if w <= 0 {
		return math.MinInt64
	}
	end := (t/w + 1) * w
	return send + (end - t) - windowMargin
}

// forget drops local state after a reset (the counters' leases vanished
// with them in Redis) or a quota grant (the negative cache no longer
// holds; leases are given back).
func (s *Store) forget(op guard.Op, counters []guard.Counter) {
	for i := range counters {
		s.forgetName(op == guard.OpReset, counters[i].Name)
	}
}

// Forget implements guard.Forgetter: the named counters were reset (their
// leases are dropped, their units not given back: they would come off the
// fresh counter) or granted quota, or a global counter's share grew (their
// negative cache is dropped, and their leases, whose unused units are
// given back in the background) by another process.
func (s *Store) Forget(reset bool, names []string) {
	for _, name := range names {
		s.forgetName(reset, name)
	}
}

func (s *Store) forgetName(reset bool, name string) {
	e := s.tab.get(name)
	if e == nil {
		return
	}
	e.last.Store(nil)
	l := e.lease.Swap(nil)
	if l == nil {
		return
	}
	e.leaseHits.Add(l.hits.Load())
	// After a reset the lease's units vanished with the counter; after a
	// grant (or a global counter's share grown by a loan) they are still
	// charged, and what is unused goes back, so that the next request is
	// decided by the store against the counter as it is now.
	if left := l.close(); left > 0 && !reset {
		s.giveBackLater(returnOf(e.name, l, left))
	}
}

// retire settles an evicted counter: its counts go to the totals, the
// rest of its lease is given back.
func (s *Store) retire(e *entry) {
	s.retiredNg.Add(e.negHits.Load())
	s.retiredLease.Add(e.leaseHits.Load())
	if l := e.lease.Swap(nil); l != nil {
		s.retiredLease.Add(l.hits.Load())
		if left := l.close(); left > 0 {
			s.giveBackLater(returnOf(e.name, l, left))
		}
	}
}

// returnOf is the counter that gives back units of lease l.
func returnOf(name string, l *lease, units int64) guard.Counter {
	return guard.Counter{Name: name, Algorithm: l.alg, Params: l.params, Ledger: l.ledger, Token: l.token, Return: units}
}

// giveBackLater queues a return for the sweep.
func (s *Store) giveBackLater(c guard.Counter) {
	s.mu.Lock()
	s.pending = append(s.pending, c)
	s.mu.Unlock()
}

// sweeper gives back expired leases every interval until Close.
func (s *Store) sweeper() {
	defer s.wg.Done()
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		select {
		case <-s.quit:
			return
		case <-t.C:
			s.sweep(false)
		}
	}
}

// schedule lists e among the counters whose lease ends at until.
func (s *Store) schedule(e *entry, until int64) {
	iv := max(s.interval.Microseconds(), 1)
	tick := (until + iv - 1) / iv * iv
	s.mu.Lock()
	if s.due == nil {
		s.due = map[int64][]*entry{}
	}
	s.due[tick] = append(s.due[tick], e)
	s.mu.Unlock()
}

// sweep closes every lease that expired or belongs to an older ruleset
// (every lease when all is set) and gives back the units they did not
// use, with the returns that failed before.
func (s *Store) sweep(all bool) {
	now := s.clock()
	epoch := s.epoch.Load()
	s.mu.Lock()
	batch := s.pending
	s.pending = nil
	full := all || epoch != s.sweptEpoch
	s.sweptEpoch = epoch
	var ended [][]*entry
	for tick, es := range s.due {
		if tick <= now || all {
			ended = append(ended, es)
			delete(s.due, tick)
		}
	}
	s.mu.Unlock()
	end := func(e *entry) {
		l := e.lease.Load()
		if l == nil || !all && now < l.until && l.epoch == epoch {
			return
		}
		if !e.lease.CompareAndSwap(l, nil) {
			return
		}
		e.leaseHits.Add(l.hits.Load())
		left := l.close()
		e.swept.Add(l.granted - left)
		if left > 0 {
			batch = append(batch, returnOf(e.name, l, left))
		}
	}
	if full {
		// Leases of older epochs end whenever they were due: find them all.
		s.scans.Add(1)
		s.tab.each(end)
	} else {
		for _, es := range ended {
			for _, e := range es {
				end(e)
			}
		}
	}
	for len(batch) > 0 {
		var call []guard.Counter
		call, batch = nextReturns(batch)
		s.giveBack(call)
	}
}

// nextReturns splits off the returns of one call: at most returnBatch
// counters, each name once — a script that reads every counter before it
// writes them would lose all but one update of a name that came twice —
// with the returns of one lease (same name and token) added up. rest is
// what is left for the next calls, in order.
func nextReturns(batch []guard.Counter) (call, rest []guard.Counter) {
next:
	for _, c := range batch {
		for j := range call {
			if call[j].Name != c.Name {
				continue
			}
			if call[j].Token == c.Token {
				call[j].Return += c.Return
				continue next
			}
			rest = append(rest, c)
			continue next
		}
		if len(call) == returnBatch {
			rest = append(rest, c)
			continue
		}
		call = append(call, c)
	}
	return call, rest
}

// giveBack sends one return call; the returns that did not run (all of
// them when the call failed, unless the store says which ran: Returned)
// are sent again at the next sweep unless the store is closing.
func (s *Store) giveBack(cs []guard.Counter) {
	ctx, cancel := context.WithTimeout(context.Background(), returnTimeout)
	defer cancel()
	res := make([]guard.CounterResult, len(cs))
	_, err := s.inner.Do(ctx, guard.OpReturn, 0, cs, res)
	failed := 0
	for i := range cs {
		if err == nil {
			s.returned.Add(cs[i].Return)
			continue
		}
		if !res[i].Returned {
			failed++
		}
		s.afterFailedReturn(cs[i], res[i].Returned, err)
	}
	if err != nil {
		s.log.Warn("giving back unused lease units failed", "counters", failed, "of", len(cs), "error", err)
	}
}

// afterFailedReturn settles a return carried by a call that failed with
// err: counted when the store says it ran (a store deciding in parts,
// Cluster slots, may have run it before failing), sent again at the next
// sweep only when the call surely never reached the store
// (guard.ErrNotSent) and the store is not closing. After any other error
// the return may have run: sending it again could give its units back
// twice, and the fleet admit more than Redis granted, so it is dropped and
// its units stay charged until their window passes or the bucket refills
// (Stats.Dropped).
func (s *Store) afterFailedReturn(c guard.Counter, ran bool, err error) {
	switch {
	case ran:
		s.returned.Add(c.Return)
	case errors.Is(err, guard.ErrNotSent) && !s.closed.Load():
		s.giveBackLater(c)
	default:
		s.dropped.Add(c.Return)
	}
}
