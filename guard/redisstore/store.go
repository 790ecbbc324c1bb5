// Package redisstore decides guard counters in Redis: one Lua script (see
// lua/), run with EVALSHA and loaded on NOSCRIPT, deciding every counter of
// a request that shares a Cluster hash tag in one atomic call, with time
// from Redis TIME.
//
// Concurrent calls share pipelines: calls arriving together are written to
// Redis as one pipeline per connection, bounded in size (WithBatch), adding
// no delay when Redis keeps up (a batch is whatever queued while the previous
// one was in flight). On standalone and Sentinel the store speaks RESP
// itself over connections of its own (conn.go: one deadline per batch,
// calls serialised by their callers, replies parsed straight into
// CounterResults; connections dialled through the go-redis client's
// dialer, which on Sentinel asks the sentinels for the primary); on
// Cluster it sends through the go-redis client, which follows MOVED and
// ASK. A call that timed out is never sent again: Redis may
// have run it, and a retry would charge twice. Only errors where the script
// surely did not run are retried: NOSCRIPT and TRYAGAIN (MOVED and ASK are
// followed by the Cluster client). A failed dial is not retried at once
// either, though it would be safe: a refused port refuses again a
// microsecond later, and every failed dial counts towards go-redis's own
// pool breaker, which after PoolSize of them fails dials without trying and
// retries only once a second, delaying recovery by up to that second; the
// call is answered degraded and the node's breaker probes again.
//
// Every node (the server, the Sentinel-managed primary, or each Cluster
// primary) has a circuit breaker (package breaker, WithBreaker): once a
// node's calls time out or fail often enough, calls for its slots fail at
// once with ErrBreakerOpen, without touching Redis, so the guard answers
// degraded in microseconds; probes let through after OpenFor close it
// again when the node answers. A script error (a bad argument) shows a live
// node and never opens a breaker. On Cluster only the slots of the failing
// primary are affected, and pipelines are split by primary so a hung node
// never holds the calls of the others.
//
// A call holding a counter of a `regions: global` rule decided against
// the region's share ledger (guard.Counter.Ledger) goes to the region
// script instead (RegionScript: the same script with the ledger's files
// and lua/gate.lua), so that calls without one run exactly as without
// regions.
//
// A Redis that restarts empty, or a replica promoted before it had every
// write, has lost counters: a missing counter is a full one, so those keys
// start with their whole limit again. Scripts are reloaded on NOSCRIPT.
//
// On Redis Cluster, counters in other slots than the request's own (IP and
// global rules) are decided first, slot by slot; when a later slot rejects,
// what the earlier slots charged is refunded with the tokens their scripts
// returned (a rejected peek reads them again), and the slots not decided
// give back the lease units their counters return before they are read, so
// the answer is the one a single script would give. Lease returns (OpReturn)
// are given back slot by slot, independently, and CounterResult.Returned
// says which ran. Between the charge and the refund (one round trip) other
// requests see those units as consumed: the refund bound is that concurrent
// requests may be rejected by up to one request's cost per in-flight
// multi-slot rejection; the fleet never admits more than the limits. A
// check that fails in a later slot (its primary down) is taken back from
// the slots before it the same way, since the guard decides it degraded
// and degraded decisions are not charged; one whose primary's breaker is
// open fails before any call.
package redisstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/breaker"
	"github.com/tollgate/tollgate/guard/redisstore/internal/scriptargs"
)

// Errors.
var (
	// ErrClosed is returned by Do after Close.
	ErrClosed = errors.New("redisstore: closed")
	// ErrReply is returned when the script's reply cannot be read.
	ErrReply = errors.New("redisstore: malformed script reply")
	// ErrBreakerOpen is returned at once, without a Redis call, for a call
	// to a node whose circuit breaker is open. It wraps
	// guard.ErrUnavailable.
	ErrBreakerOpen error = unsent{fmt.Errorf("redisstore: circuit breaker open: %w", guard.ErrUnavailable)}
)

// Store is a guard.Store backed by Redis. Create it with New; it is safe for
// concurrent use. New starts the batching goroutines (WithBatch); on
// standalone and Sentinel each owns one connection, which it closes when
// it exits; on Cluster each of them sends the pipelines of a batch's
// primaries on goroutines of its own and waits for them before taking the
// next batch. Close stops them and waits for them.
type Store struct {
	client  redis.UniversalClient
	prefix  string
	script  Script
	region  Script // calls holding a ledger counter (RegionScript)
	cluster bool
	cc      *redis.ClusterClient // when cluster
	nodes   nodes
	timeout time.Duration
	margin  int64
	log     *slog.Logger

	batch   int
	workers int
	queue   chan *call // the go-redis path (Cluster)
	wire    *wire      // the lean path (conn.go): standalone and Sentinel
	pq      chan *pcall
	gen     atomic.Uint64 // bumped when a lean connection fails (conn.go)
	idle    time.Duration // idleCheck; tests set 0 to check before every batch
	quit    chan struct{}
	wg      sync.WaitGroup
	closed  atomic.Bool
	once    sync.Once

	calls atomic.Int64 // scripts sent, for tests and metrics
}

var _ guard.Store = (*Store)(nil)

// Option configures a Store.
type Option func(*Store)

// WithKeyPrefix sets the prefix of every counter's key (default "tg";
// redis.key_prefix), which must not hold '{' or '}'.
func WithKeyPrefix(p string) Option { return func(s *Store) { s.prefix = p } }

// WithTimeout sets the deadline of one Redis call (default 50 ms). It holds
// when Redis hangs as well as when it refuses.
func WithTimeout(d time.Duration) Option { return func(s *Store) { s.timeout = d } }

// WithTTLMargin sets how long, beyond the time a counter is full again, its
// key is kept (default 1 s). Tests that drive an explicit clock set it high.
func WithTTLMargin(d time.Duration) Option {
	return func(s *Store) { s.margin = d.Milliseconds() }
}

// WithBatch sets the most calls written in one pipeline (default 64) and the
// number of pipelines in flight at once (default 8; on standalone and
// Sentinel, the number of connections, each owned by one batching
// goroutine, at least 1). A batch of 1 disables batching: every call is
// its own round trip.
func WithBatch(size, inflight int) Option {
	return func(s *Store) { s.batch, s.workers = size, inflight }
}

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option { return func(s *Store) { s.log = l } }

// WithBreaker sets the configuration of every node's circuit breaker
// (default: breaker's defaults: open after at least half of at least 20
// calls within 1s failed, or 5 in a row; open for 500ms; 1 probe). Zero
// fields take the defaults; an invalid configuration is logged as an error
// by New, which then uses the defaults. cfg.OnStateChange is called for
// every node; WithOnBreakerChange also says which.
func WithBreaker(cfg breaker.Config) Option { return func(s *Store) { s.nodes.cfg = cfg } }

// WithOnBreakerChange sets a function called whenever a node's circuit
// breaker changes state (default: none), with the node's address, for
// metrics. It is called on the goroutine of the call that caused the
// change and must not block. Changes are also logged: opening at warn,
// closing at info, the half-open steps in between at debug.
func WithOnBreakerChange(fn func(node string, from, to breaker.State)) Option {
	return func(s *Store) { s.nodes.onChange = fn }
}

// New returns a Store using client. A *redis.ClusterClient enables Cluster
// slot handling and sends through go-redis; a *redis.Client (standalone,
// or NewFailoverClient's) gives the store connections of its own, dialled
// with the client's dialer, username, password and database (a client
// with a credentials provider, OnConnect hook or Limiter sends through
// go-redis instead). The client should be built with NewClient (or the
// same settings: no automatic retries, context deadlines honoured); the
// store still uses it to load the script (Load).
func New(client redis.UniversalClient, opts ...Option) *Store {
	s := &Store{
		client:  client,
		prefix:  "tg",
		script:  decideScript,
		region:  regionScript,
		timeout: 50 * time.Millisecond,
		margin:  1000,
		idle:    idleCheck,
		batch:   64,
		workers: 8,
		quit:    make(chan struct{}),
	}
	s.cc, s.cluster = client.(*redis.ClusterClient)
	for _, o := range opts {
		o(s)
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	check := s.nodes.cfg
	check.SetDefaults()
	if err := check.Validate(); err != nil {
		s.log.Error("invalid circuit breaker configuration: using the defaults", "error", err)
		s.nodes.cfg = breaker.Config{OnStateChange: s.nodes.cfg.OnStateChange}
	}
	s.nodes.log = s.log
	s.nodes.init(client)
	if w, ok := leanWire(client); ok {
		s.wire = w
		s.batch, s.workers = max(s.batch, 1), max(s.workers, 1)
		s.pq = make(chan *pcall, s.batch*s.workers)
		for range s.workers {
			s.wg.Add(1)
			go s.pipeWorker()
		}
	} else if s.batch > 1 && s.workers > 0 {
		s.queue = make(chan *call, s.batch*s.workers)
		for range s.workers {
			s.wg.Add(1)
			go s.worker()
		}
	}
	return s
}

var (
	decideScript = DecideScript()
	regionScript = RegionScript()
)

// scriptFor is the script deciding counters.
func (s *Store) scriptFor(counters []guard.Counter) *Script {
	if scriptargs.Ledger(counters) != nil {
		return &s.region
	}
	return &s.script
}

// Close stops the batching goroutines and waits for them. Calls in flight
// finish; later calls get ErrClosed. It does not close the client. Close is
// idempotent and safe from many goroutines.
func (s *Store) Close() error {
	s.once.Do(func() {
		s.closed.Store(true)
		close(s.quit)
	})
	s.wg.Wait()
	if s.pq != nil {
		// A call queued as the goroutines left.
		failQueued(s.pq, failClosed)
	}
	return nil
}

var pcallPool = sync.Pool{New: func() any { return &pcall{done: make(chan struct{}, 1)} }}

// doPipe is Do on the lean path (conn.go): the call is serialised here,
// on the caller's goroutine, queued for a batching goroutine, and answered
// by its batch's deadline, without a timer of its own.
func (s *Store) doPipe(ctx context.Context, op guard.Op, now int64, counters []guard.Counter, res []guard.CounterResult) (int64, error) {
	n := s.nodes.single
	if !n.b.Allow() {
		return 0, ErrBreakerOpen
	}
	c := pcallPool.Get().(*pcall)
	c.ctx, c.err = ctx, nil
	c.state.Store(callQueued)
	c.deadline = time.Now().Add(s.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(c.deadline) {
		c.deadline = d
	}
	c.script = s.scriptFor(counters)
	c.cmd, c.tail = appendScriptCall(c.cmd[:0], c.script.SHA, op, now, s.margin, counters)
	if cap(c.out) < len(counters) {
		c.out = make([]guard.CounterResult, len(counters))
	}
	c.out = c.out[:len(counters)]
	if err := s.enqueuePipe(ctx, c); err != nil {
		c.release()
		n.record(err)
		return 0, fmt.Errorf("redisstore: %s: %w", op, err)
	}
	// The batch may wait past c's deadline for a batch-mate's later one
	// (sendPipe): c's caller stops waiting at its own, on ctx when ctx
	// ends it, else on a timer.
	// The call's timer is its own and reused with it (a caller that gives
	// up leaves it with the call to the garbage collector): no allocation.
	var expired <-chan time.Time
	if d, ok := ctx.Deadline(); !ok || d.After(c.deadline) {
		if c.timer == nil {
			c.timer = time.NewTimer(time.Until(c.deadline))
		} else {
			c.timer.Reset(time.Until(c.deadline))
		}
		expired = c.timer.C
	}
	select {
	case <-c.done:
	case <-expired:
		// The batching goroutine still owns c and will signal done into
		// its buffer; c is not reused (left to the garbage collector).
		// Not yet taken for sending: it never will be.
		err := errNoReply
		if c.state.CompareAndSwap(callQueued, callAbandoned) {
			err = errQueued
		}
		n.record(err)
		return 0, fmt.Errorf("redisstore: %s: %w", op, err)
	case <-ctx.Done():
		var err error = ctx.Err()
		if c.state.CompareAndSwap(callQueued, callAbandoned) {
			err = unsent{err}
		}
		n.record(err)
		return 0, fmt.Errorf("redisstore: %s: %w", op, err)
	case <-s.quit:
		// Closing: the goroutines answer the calls they hold; one queued
		// as they left is answered by Close, or never.
		t := time.NewTimer(time.Until(c.deadline))
		select {
		case <-c.done:
			t.Stop()
		case <-t.C:
			return 0, ErrClosed
		}
	}
	err := c.err
	n.record(err)
	if err != nil {
		c.release()
		return 0, fmt.Errorf("redisstore: %s: %w", op, err)
	}
	copy(res, c.out)
	if op == guard.OpCheck || op == guard.OpReturn {
		markReturned(counters, res)
	}
	t := c.now
	clear(c.out)
	c.release()
	return t, nil
}

// release returns an answered call to the pool, its timer stopped (since
// Go 1.23 a stopped timer delivers nothing stale after its next Reset).
func (c *pcall) release() {
	c.ctx = nil
	if c.timer != nil {
		c.timer.Stop()
	}
	pcallPool.Put(c)
}

// enqueuePipe queues c for a batching goroutine. Only when the queue is
// full does it wait, on a timer, at most until c's deadline.
func (s *Store) enqueuePipe(ctx context.Context, c *pcall) error {
	select {
	case s.pq <- c:
		return nil
	default:
	}
	t := time.NewTimer(time.Until(c.deadline))
	defer t.Stop()
	select {
	case s.pq <- c:
		return nil
	case <-t.C:
		return errQueued
	case <-ctx.Done():
		return unsent{ctx.Err()}
	case <-s.quit:
		return ErrClosed
	}
}

// Calls returns the number of script calls sent to Redis so far: calls
// refused by an open circuit breaker are not sent; a call sent again as
// EVAL after NOSCRIPT counts once on standalone and Sentinel.
func (s *Store) Calls() int64 { return s.calls.Load() }

// Outcomes returns how many calls the store's nodes answered (a reply,
// an error reply to the script included) and how many failed because a
// node could not answer (a timeout, a refused or broken connection, a
// loading or read-only node) since New, summed over every node (on
// Cluster, the primaries called so far). Calls refused by an open breaker
// and calls whose caller went away count in neither. A health check
// compares two readings: calls answered and none failed in between show
// the nodes answering without a PING of its own.
func (s *Store) Outcomes() (answered, failed uint64) { return s.nodes.outcomes() }

// BreakerStates returns the state of every node's circuit breaker, sorted
// by node (on Cluster, the primaries called so far), for metrics and
// health endpoints.
func (s *Store) BreakerStates() []BreakerState { return s.nodes.states() }

// Load loads the script into Redis (every primary on Cluster), so the first
// calls need no NOSCRIPT round trip.
func (s *Store) Load(ctx context.Context) error {
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			if err := c.ScriptLoad(ctx, s.script.Source).Err(); err != nil {
				return err
			}
			return c.ScriptLoad(ctx, s.region.Source).Err()
		})
	}
	for _, sc := range []*Script{&s.script, &s.region} {
		if err := s.client.ScriptLoad(ctx, sc.Source).Err(); err != nil {
			return fmt.Errorf("redisstore: script load: %w", err)
		}
	}
	return nil
}

// Do implements guard.Store.
func (s *Store) Do(ctx context.Context, op guard.Op, now int64, counters []guard.Counter, res []guard.CounterResult) (int64, error) {
	if len(counters) == 0 {
		return now, nil
	}
	if s.closed.Load() {
		return 0, ErrClosed
	}
	if s.wire != nil {
		return s.doPipe(ctx, op, now, counters, res)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if !s.cluster {
		t, _, err := s.eval(ctx, op, now, counters, res)
		return t, err
	}
	return s.doCluster(ctx, op, now, counters, res)
}

// doCluster decides counters slot by slot: other slots (ip and global
// counters) first, the request's own slot (its key and tenant counters,
// see primary) last; a rejection refunds what earlier slots charged (a
// rejected peek reads them again), gives back the lease units the slots
// not decided return, and reads those slots: the result is what one script
// would have answered for the whole request.
func (s *Store) doCluster(ctx context.Context, op guard.Op, now int64, counters []guard.Counter, res []guard.CounterResult) (int64, error) {
	groups := groupBySlot(counters)
	if len(groups) == 1 {
		t, _, err := s.eval(ctx, op, now, counters, res)
		return t, err
	}
	if op == guard.OpReturn {
		return s.returnBySlot(ctx, now, counters, res, groups)
	}
	// A slot whose primary's breaker is open would fail the request after
	// the slots before it were charged: fail before charging any.
	for i := range groups {
		g := &groups[i]
		if g.node = s.nodes.forKey(ctx, s.cc, counters[g.idx[0]].Name); g.node.b.Refusing() {
			return 0, ErrBreakerOpen
		}
	}
	// Decide the request's own slot last.
	own := 0
find:
	for g := range groups {
		for _, i := range groups[g].idx {
			if primary(counters[i].Name) {
				own = g
				break find
			}
		}
	}
	order := make([]slotGroup, 0, len(groups))
	order = append(order, groups[:own]...)
	order = append(order, groups[own+1:]...)
	order = append(order, groups[own])
	var t int64
	done := make([]slotGroup, 0, len(order))
	for gi, g := range order {
		cs, rs := g.gather(counters)
		tt, admitted, err := s.evalOn(ctx, g.node, op, now, cs, rs)
		if err != nil {
			if op == guard.OpCheck {
				s.undo(ctx, now, counters, res, done, order[gi+1:], err)
			}
			return 0, err
		}
		g.scatter(rs, res)
		t = max(t, tt)
		if (op == guard.OpCheck || op == guard.OpPeek) && !admitted {
			if op == guard.OpCheck {
				s.refund(ctx, now, counters, res, done)
			} else if err := s.reread(ctx, now, counters, res, done); err != nil {
				return 0, err
			}
			// Read the slots not decided, so every rule has its state,
			// after giving back the lease units their counters return: a
			// check gives them back whatever it decides, and the caller
			// (guard/lease) has closed those leases.
			for _, rest := range order[gi+1:] {
				cs, rs := rest.gather(counters)
				if err := s.giveBack(ctx, now, cs); err != nil {
					return 0, err
				}
				_, _, err := s.eval(ctx, guard.OpState, now, cs, rs)
				// The returns ran (giveBack), whatever the read does: an
				// error here must not let the caller send them again.
				markReturned(cs, rs)
				rest.scatter(rs, res)
				if err != nil {
					return 0, err
				}
			}
			return t, nil
		}
		done = append(done, g)
	}
	return t, nil
}

// undo takes back what a check charged in the slots decided before one
// failed: the request is then decided degraded, and degraded admissions
// are not charged to the shared counters — nor rejections, nor
// the lease units granted with the charge, which the caller, seeing the
// error, never installs. Left charged, a dead shard would drain the ip
// and global counters of every other key with the requests of its keys.
// The returns that the counters of the slots not reached carry surely
// never left: when failed (the error of the failing slot) says the same
// (guard.ErrNotSent), the caller sends them again itself; otherwise it
// would drop them, so they are given back here, and marked Returned when
// that ran. A give-back that fails is not marked: the caller then drops
// it, right when it may have run, and the stricter side when it did not
// (never twice). Nothing is tried when the caller's time is up: the
// charges then stay, the stricter side, until the window passes.
func (s *Store) undo(ctx context.Context, now int64, counters []guard.Counter, res []guard.CounterResult, done, rest []slotGroup, failed error) {
	if ctx.Err() != nil {
		return
	}
	s.refund(ctx, now, counters, res, done)
	if errors.Is(failed, guard.ErrNotSent) {
		return
	}
	for _, g := range rest {
		cs, rs := g.gather(counters)
		if err := s.giveBack(ctx, now, cs); err != nil {
			continue
		}
		markReturned(cs, rs)
		for j, i := range g.idx {
			res[i].Returned = rs[j].Returned
		}
	}
}

// reread reads again, with OpState, the slots that admitted a peek that a
// later slot rejected: a rejected peek's figures are before its cost, as
// one script answers them (standalone, the reference model), not after it.
func (s *Store) reread(ctx context.Context, now int64, counters []guard.Counter, res []guard.CounterResult, groups []slotGroup) error {
	for _, g := range groups {
		cs, rs := g.gather(counters)
		if _, _, err := s.eval(ctx, guard.OpState, now, cs, rs); err != nil {
			return err
		}
		g.scatter(rs, res)
	}
	return nil
}

// returnBySlot gives back lease units slot by slot. Returns of different
// slots are independent: a slot that fails (its primary down) does not
// stop the others, and the results of those that ran say Returned, so the
// caller sends again only what did not run rather than everything (which
// would give the others' units back a second time). It returns the first
// error.
func (s *Store) returnBySlot(ctx context.Context, now int64, counters []guard.Counter, res []guard.CounterResult, groups []slotGroup) (int64, error) {
	var (
		t     int64
		first error
	)
	for _, g := range groups {
		cs, rs := g.gather(counters)
		tt, _, err := s.eval(ctx, guard.OpReturn, now, cs, rs)
		if err != nil {
			if first == nil {
				first = err
			}
			continue
		}
		g.scatter(rs, res)
		t = max(t, tt)
	}
	return t, first
}

// giveBack sends the returns (Counter.Return with a lease's Token) that
// counters of one slot carry, as one OpReturn; nothing when none does.
func (s *Store) giveBack(ctx context.Context, now int64, counters []guard.Counter) error {
	var cs []guard.Counter
	for _, c := range counters {
		if c.Return > 0 && c.Token != "" {
			cs = append(cs, c)
		}
	}
	if len(cs) == 0 {
		return nil
	}
	_, _, err := s.eval(ctx, guard.OpReturn, now, cs, make([]guard.CounterResult, len(cs)))
	return err
}

func (s *Store) refund(ctx context.Context, now int64, counters []guard.Counter, res []guard.CounterResult, groups []slotGroup) {
	for _, g := range groups {
		var cs []guard.Counter
		var idx []int
		for _, i := range g.idx {
			if res[i].Charged && res[i].Token != "" {
				c := counters[i]
				c.Token = res[i].Token
				cs = append(cs, c)
				idx = append(idx, i)
			}
		}
		if len(cs) == 0 {
			continue
		}
		rs := make([]guard.CounterResult, len(cs))
		if _, _, err := s.eval(ctx, guard.OpRefund, now, cs, rs); err != nil {
			// The charge stays: the key is limited a little more until it
			// refills. Never over-admission.
			s.log.Warn("refund failed", "error", err)
			continue
		}
		for j, i := range idx {
			returned := res[i].Returned
			res[i] = rs[j]
			res[i].Allowed, res[i].Charged, res[i].Token, res[i].Returned = true, false, "", returned
		}
	}
}

type slotGroup struct {
	slot int
	idx  []int
	node *node // its primary, where doCluster looked it up
}

func (g slotGroup) gather(counters []guard.Counter) ([]guard.Counter, []guard.CounterResult) {
	cs := make([]guard.Counter, len(g.idx))
	for j, i := range g.idx {
		cs[j] = counters[i]
	}
	return cs, make([]guard.CounterResult, len(g.idx))
}

func (g slotGroup) scatter(rs, res []guard.CounterResult) {
	for j, i := range g.idx {
		res[i] = rs[j]
	}
}

func groupBySlot(counters []guard.Counter) []slotGroup {
	var groups []slotGroup
outer:
	for i := range counters {
		slot := Slot(counters[i].Name)
		for g := range groups {
			if groups[g].slot == slot {
				groups[g].idx = append(groups[g].idx, i)
				continue outer
			}
		}
		groups = append(groups, slotGroup{slot: slot, idx: []int{i}})
	}
	return groups
}

// eval runs the script once for counters that share a slot, unless the
// circuit breaker of the slot's node is open.
func (s *Store) eval(ctx context.Context, op guard.Op, now int64, counters []guard.Counter, res []guard.CounterResult) (int64, bool, error) {
	return s.evalOn(ctx, s.nodes.forKey(ctx, s.cc, counters[0].Name), op, now, counters, res)
}

// evalOn is eval on n, the node that holds counters.
func (s *Store) evalOn(ctx context.Context, n *node, op guard.Op, now int64, counters []guard.Counter, res []guard.CounterResult) (int64, bool, error) {
	if !n.b.Allow() {
		return 0, false, ErrBreakerOpen
	}
	keys, args := scriptargs.Build(op, now, s.margin, counters)
	sc := s.scriptFor(counters)
	var reply any
	var err error
	if s.queue != nil {
		reply, err = s.enqueue(ctx, n, sc, keys, args)
	} else {
		reply, err = s.run(ctx, sc, keys, args)
	}
	n.record(err)
	if err != nil {
		return 0, false, fmt.Errorf("redisstore: %s: %w", op, err)
	}
	t, admitted, err := parseReply(reply, res)
	if err != nil {
		return 0, false, err
	}
	if op == guard.OpCheck || op == guard.OpReturn {
		markReturned(counters, res)
	}
	return t, admitted, nil
}

// markReturned sets Returned for the counters whose Return the script
// gave back (it does for OpCheck and OpReturn whatever it decides).
func markReturned(counters []guard.Counter, res []guard.CounterResult) {
	for i := range counters {
		if counters[i].Return > 0 && counters[i].Token != "" {
			res[i].Returned = true
		}
	}
}

// run sends one script call, retrying only where it surely did not run.
func (s *Store) run(ctx context.Context, sc *Script, keys []string, args []any) (any, error) {
	s.calls.Add(1)
	v, err := s.process(ctx, s.client, "evalsha", sc.SHA, keys, args)
	for attempt := 0; err != nil && attempt < 2 && retriable(err); attempt++ {
		if isNoScript(err) {
			v, err = s.process(ctx, s.client, "eval", sc.Source, keys, args)
			continue
		}
		v, err = s.process(ctx, s.client, "evalsha", sc.SHA, keys, args)
	}
	return v, err
}

// process sends one EVAL or EVALSHA through p (the client or a pipeline)
// and returns its result (a pipeline's once executed).
func (s *Store) process(ctx context.Context, p processor, name, script string, keys []string, args []any) (any, error) {
	cmd := scriptCmd(ctx, name, script, keys, args)
	_ = p.Process(ctx, cmd)
	return cmd.Result()
}

// processor is a client or a pipeline.
type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// noRetryCmd is a script call go-redis must never send twice: the Cluster
// client retries commands after timeouts and broken connections whatever
// MaxRetries says, and a script whose reply was lost may have run.
type noRetryCmd struct{ *redis.Cmd }

// NoRetry tells go-redis not to retry the command on a transient error
// (MOVED and ASK are still followed: the script did not run).
func (noRetryCmd) NoRetry() bool { return true }

// scriptCmd builds EVAL or EVALSHA as go-redis's EvalSha does, marked
// never to be retried by go-redis.
func scriptCmd(ctx context.Context, name, script string, keys []string, args []any) noRetryCmd {
	a := make([]any, 3+len(keys), 3+len(keys)+len(args))
	a[0], a[1], a[2] = name, script, len(keys)
	for i, k := range keys {
		a[3+i] = k
	}
	a = append(a, args...)
	cmd := redis.NewCmd(ctx, a...)
	if len(keys) > 0 {
		cmd.SetFirstKeyPos(3)
	}
	return noRetryCmd{cmd}
}

// call is one queued script call.
type call struct {
	ctx   context.Context
	node  *node
	sc    *Script
	keys  []string
	args  []any
	reply any
	err   error
	done  chan struct{}
}

var callPool = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

func (s *Store) enqueue(ctx context.Context, n *node, sc *Script, keys []string, args []any) (any, error) {
	c := callPool.Get().(*call)
	c.ctx, c.node, c.sc, c.keys, c.args, c.reply, c.err = ctx, n, sc, keys, args, nil, nil
	select {
	case s.queue <- c:
	case <-ctx.Done():
		callPool.Put(c)
		return nil, ctx.Err()
	case <-s.quit:
		callPool.Put(c)
		return nil, ErrClosed
	}
	select {
	case <-c.done:
		reply, err := c.reply, c.err
		c.ctx, c.node, c.keys, c.args, c.reply = nil, nil, nil, nil, nil
		callPool.Put(c)
		return reply, err
	case <-ctx.Done():
		// The worker still owns c and will signal done into its buffer;
		// c is not reused (left to the garbage collector).
		return nil, ctx.Err()
	}
}

// worker takes a call, adds whatever else is queued (up to the batch size),
// and sends them as one pipeline.
func (s *Store) worker() {
	defer s.wg.Done()
	serveBatches(s.quit, s.queue, s.batch, s.flush, func(c *call) {
		c.err = ErrClosed
		c.done <- struct{}{}
	})
}

// serveBatches hands send the calls of q in batches of up to size
// (nextBatch) until quit is closed, then fails what is still queued with
// fail. Both batching paths, go-redis's and the lean one, serve so.
func serveBatches[T any](quit <-chan struct{}, q <-chan T, size int, send func([]T), fail func(T)) {
	batch := make([]T, 0, size)
	for {
		var ok bool
		if batch, ok = nextBatch(quit, q, batch); !ok {
			break
		}
		send(batch)
		clear(batch)
	}
	failQueued(q, fail)
}

// failQueued answers the calls still queued on q with fail.
func failQueued[T any](q <-chan T, fail func(T)) {
	for {
		select {
		case c := <-q:
			fail(c)
		default:
			return
		}
	}
}

// nextBatch waits for a call on q, then adds whatever else is queued, up
// to cap(batch), into batch (emptied first); ok is false once quit is
// closed.
func nextBatch[T any](quit <-chan struct{}, q <-chan T, batch []T) (_ []T, ok bool) {
	select {
	case <-quit:
		return batch[:0], false
	case c := <-q:
		batch = append(batch[:0], c)
	}
	for len(batch) < cap(batch) {
		select {
		case c := <-q:
			batch = append(batch, c)
		default:
			return batch, true
		}
	}
	return batch, true
}

func (s *Store) flush(batch []*call) {
	// Skip calls whose caller already gave up: never send work nobody waits
	// for.
	live := batch[:0]
	for _, c := range batch {
		if c.ctx.Err() != nil {
			c.err = c.ctx.Err()
			c.done <- struct{}{}
			continue
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	if s.cluster && len(live) > 1 {
		s.sendByNode(live)
		return
	}
	s.send(live)
}

// sendByNode sends one pipeline per Cluster primary, concurrently, so that
// the callers of a node that answers are not held by one that hangs: each
// group's callers are answered as soon as their own pipeline returns.
func (s *Store) sendByNode(live []*call) {
	sort.SliceStable(live, func(i, j int) bool { return live[i].node.name < live[j].node.name })
	var groups [][]*call
	for i := 0; i < len(live); {
		j := i + 1
		for j < len(live) && live[j].node == live[i].node {
			j++
		}
		groups = append(groups, live[i:j])
		i = j
	}
	var wg sync.WaitGroup
	for _, g := range groups[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.send(g)
		}()
	}
	s.send(groups[0])
	wg.Wait()
}

// send sends live as one pipeline (or one call) and answers their callers.
func (s *Store) send(live []*call) {
	if len(live) == 1 {
		c := live[0]
		c.reply, c.err = s.run(c.ctx, c.sc, c.keys, c.args)
		c.done <- struct{}{}
		return
	}
	// The pipeline's deadline is the latest of its callers': each caller
	// still stops waiting at its own.
	deadline := time.Now().Add(s.timeout)
	for _, c := range live {
		if d, ok := c.ctx.Deadline(); ok && d.After(deadline) {
			deadline = d
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	s.calls.Add(int64(len(live)))
	pipe := s.client.Pipeline()
	cmds := make([]noRetryCmd, len(live))
	for i, c := range live {
		cmds[i] = scriptCmd(ctx, "evalsha", c.sc.SHA, c.keys, c.args)
		_ = pipe.Process(ctx, cmds[i])
	}
	_, _ = pipe.Exec(ctx)
	for i, c := range live {
		c.reply, c.err = cmds[i].Result()
		if c.err != nil && retriable(c.err) {
			c.reply, c.err = s.run(ctx, c.sc, c.keys, c.args)
		}
		c.done <- struct{}{}
	}
}

// retriable reports whether err says the script surely did not run and is
// worth sending again at once.
func retriable(err error) bool {
	return err != nil && (isNoScript(err) || strings.HasPrefix(err.Error(), "TRYAGAIN"))
}

func isNoScript(err error) bool { return strings.HasPrefix(err.Error(), "NOSCRIPT") }

func parseReply(v any, res []guard.CounterResult) (int64, bool, error) {
	arr, ok := v.([]any)
	if !ok || len(arr) != 2+8*len(res) {
		return 0, false, ErrReply
	}
	now, ok1 := arr[0].(int64)
	adm, ok2 := arr[1].(int64)
	if !ok1 || !ok2 {
		return 0, false, ErrReply
	}
	for i := range res {
		b := 2 + 8*i
		var n [6]int64
		for j := range n {
			x, ok := arr[b+j].(int64)
			if !ok {
				return 0, false, ErrReply
			}
			n[j] = x
		}
		tok, _ := arr[b+6].(string)
		leased, ok := arr[b+7].(int64)
		if !ok {
			return 0, false, ErrReply
		}
		res[i] = guard.CounterResult{
			Allowed: n[0] == 1, Charged: n[1] == 1, Remaining: n[2],
			ResetAfter: n[3], NextAfter: n[4], RetryAfter: n[5], Token: tok,
			Leased: leased,
		}
	}
	return now, adm == 1, nil
}
