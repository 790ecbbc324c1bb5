// Package memstore holds Tollgate's algorithms in exact in-memory form.
//
// It is two things at once. It is the reference model the Redis scripts are
// checked against: every algorithm is written here a second time, in plain
// int64 arithmetic with an injected clock, and property tests require the
// scripts and this package to agree on every decision, remaining count,
// reset, `t` and retry time. And it is the local limiter that decides
// `on_failure: closed` rules while Redis is unavailable.
//
// A Store is safe for concurrent use. Counters that are full again are
// dropped, and the number of counters is bounded (WithMaxCounters): when the
// bound is reached, a new counter evicts, among a random sample of 32, the
// ones that are full again or else the one nearest to being full, so memory
// stays bounded and a flood of distinct keys costs constant work per key.
package memstore

import (
	"context"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/rules"
)

// DefaultMaxCounters is the default bound on the counters a Store keeps:
// about 200 MB at most for fixed-window or bucket counters under 50-byte
// names, the most a gateway's fail-closed fallback can hold whatever keys
// arrive during an outage.
const DefaultMaxCounters = 1_000_000

// Store is an in-memory guard.Store.
type Store struct {
	clock func() int64
	max   int

	mu       sync.Mutex
	counters map[string]*state
}

var _ guard.Store = (*Store)(nil)

// Option configures a Store.
type Option func(*Store)

// WithClock sets the clock used when Do is called with now == 0 (Unix
// microseconds). The default is the system clock.
func WithClock(now func() int64) Option { return func(s *Store) { s.clock = now } }

// WithMaxCounters bounds the number of counters kept (default
// DefaultMaxCounters). Evicting a counter that is not yet full forgets its
// usage: the key starts full again, as after a Redis restart.
func WithMaxCounters(n int) Option { return func(s *Store) { s.max = n } }

// New returns an empty Store.
func New(opts ...Option) *Store {
	s := &Store{
		clock:    func() int64 { return time.Now().UnixMicro() },
		max:      DefaultMaxCounters,
		counters: make(map[string]*state),
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Len returns the number of counters held.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.counters)
}

// state is one counter's persisted state, the same fields the Redis scripts
// keep (see guard/redisstore/lua).
type state struct {
	alg rules.Algorithm
	// expires is when the counter is full again (Unix µs). A full counter
	// equals a missing one, so expired counters are dropped when space is
	// needed.
	expires int64

	// token_bucket: debt, last refill, scale. gcra: tat.
	z, ts, s, tat int64
	// fixed_window
	ws, n int64
	// sliding_window_counter: sub-window index -> units
	cnt map[int64]int64
	// sliding_window_log: entries in Redis order (time, then member bytes)
	log []entry
}

type entry struct {
	ts, seq, n int64
	m          string
}

// work is a counter during one call: its parameters and loaded state.
type work struct {
	c    *guard.Counter
	alg  algorithm
	name string
	L    int64

	// bucket
	a, b, k, z, ts int64
	// fixed window
	ws, n int64
	// sliding counter
	sw, q, P, t, i int64
	cnt            map[int64]int64
	// sliding log
	w   int64
	log []entry
	u   int64
}

type algorithm interface {
	load(w *work, st *state, now int64)
	fits(w *work, cost int64) bool
	add(w *work, cost int64, capped bool, now int64) string
	sub(w *work, n int64)
	// refund gives back the charge named by token, at most lim units of
	// it when lim > 0.
	refund(w *work, token string, lim int64)
	// free is the whole units available now (0 for a log: no leases).
	free(w *work) int64
	save(w *work, now int64) *state // nil: delete
	stats(w *work, now, cost int64) (rem, reset, next, retry int64)
}

// leaseShare: a lease takes at most 1/leaseShare of the units free after
// the request's cost (lua/decide.lua's LEASE_SHARE).
const leaseShare = 4

func algorithmOf(a rules.Algorithm) algorithm {
	switch a {
	case rules.GCRA:
		return gcraAlg{}
	case rules.FixedWindow:
		return fixedWindow{}
	case rules.SlidingWindowCounter:
		return slidingCounter{}
	case rules.SlidingWindowLog:
		return slidingLog{}
	default:
		return tokenBucket{}
	}
}

// Do implements guard.Store with the semantics of the Redis script
// (guard/redisstore/lua/decide.lua).
func (s *Store) Do(_ context.Context, op guard.Op, now int64, counters []guard.Counter, res []guard.CounterResult) (int64, error) {
	if now == 0 {
		now = s.clock()
	}
	s.mu.Lock()
	defer s.mu.Unlock()

	ws := make([]work, len(counters))
	for i := range counters {
		c := &counters[i]
		w := &ws[i]
		w.c, w.name, w.alg, w.L = c, c.Name, algorithmOf(c.Algorithm), c.Params.Limit
		setParams(w, c)
		if op == guard.OpReset {
			delete(s.counters, c.Name)
		}
		st := s.counters[c.Name]
		if st != nil && st.alg != c.Algorithm {
			st = nil
		}
		w.alg.load(w, st, now)
		res[i] = guard.CounterResult{}
	}

	dirty := make([]bool, len(ws))
	if op == guard.OpCheck || op == guard.OpReturn {
		for i := range ws {
			if c := ws[i].c; c.Return > 0 && c.Token != "" {
				ws[i].alg.refund(&ws[i], c.Token, c.Return)
				dirty[i] = true
				res[i].Returned = true
			}
		}
	}

	admitted := true
	switch op {
	case guard.OpCheck, guard.OpPeek:
		for i := range ws {
			res[i].Allowed = ws[i].alg.fits(&ws[i], ws[i].c.Cost)
			if !ws[i].c.Shadow && !res[i].Allowed {
				admitted = false
			}
		}
		if admitted {
			for i := range ws {
				if res[i].Allowed {
					w := &ws[i]
					n := w.c.Cost
					if op == guard.OpCheck && w.c.Lease > 0 && !w.c.Shadow {
						if g := min(fdiv(w.alg.free(w)-w.c.Cost, leaseShare), w.c.Lease); g > 0 {
							res[i].Leased = g
							n += g
						}
					}
					res[i].Token = w.alg.add(w, n, false, now)
					res[i].Charged = op == guard.OpCheck
				}
			}
		}
	case guard.OpReport:
		for i := range ws {
			res[i].Allowed, res[i].Charged = true, true
			res[i].Token = ws[i].alg.add(&ws[i], ws[i].c.Cost, true, now)
		}
	case guard.OpAddQuota:
		for i := range ws {
			res[i].Allowed, res[i].Charged = true, true
			ws[i].alg.sub(&ws[i], ws[i].c.Cost)
		}
	case guard.OpRefund:
		for i := range ws {
			res[i].Allowed, res[i].Charged = true, true
			ws[i].alg.refund(&ws[i], ws[i].c.Token, 0)
		}
	case guard.OpReturn:
		for i := range ws {
			res[i].Allowed, res[i].Charged = true, true
		}
	case guard.OpState:
		for i := range ws {
			res[i].Allowed = ws[i].alg.fits(&ws[i], ws[i].c.Cost)
		}
	case guard.OpReset:
		for i := range ws {
			res[i].Allowed = true
		}
	}

	for i := range ws {
		w := &ws[i]
		if res[i].Charged || dirty[i] {
			if st := w.alg.save(w, now); st != nil {
				st.alg = w.c.Algorithm
				s.put(w.name, st, now)
			} else {
				delete(s.counters, w.name)
			}
		}
		r := &res[i]
		r.Remaining, r.ResetAfter, r.NextAfter, r.RetryAfter = w.alg.stats(w, now, w.c.Cost)
		if !r.Charged {
			r.Token = ""
		}
	}
	return now, nil
}

func (s *Store) put(name string, st *state, now int64) {
	if _, ok := s.counters[name]; !ok && len(s.counters) >= s.max {
		s.evict(now)
	}
	s.counters[name] = st
}

// evictSample is how many counters evict looks at to make room for one.
const evictSample = 32

// evict makes room for one new counter: among up to evictSample counters
// (map iteration starts at a random place) it drops those that are full
// again, or if none is, the one nearest to being full. The work per new
// counter is bounded, so a flood of distinct keys never stalls the store:
// sorting all counters instead takes about 0.4 s for a million, under the
// lock every decision needs.
func (s *Store) evict(now int64) {
	var victim string
	best := int64(math.MaxInt64)
	seen, dropped := 0, 0
	for k, st := range s.counters {
		if st.expires <= now {
			delete(s.counters, k)
			dropped++
		} else if st.expires < best {
			victim, best = k, st.expires
		}
		if seen++; seen == evictSample {
			break
		}
	}
	if dropped == 0 && seen > 0 {
		delete(s.counters, victim)
	}
}

func setParams(w *work, c *guard.Counter) {
	p := c.Params
	switch c.Algorithm {
	case rules.FixedWindow, rules.SlidingWindowLog:
		w.w = p.Window
	case rules.SlidingWindowCounter:
		w.sw, w.q = guard.WindowScale(p)
		w.P = max(p.Precision, 1)
	default:
		w.a, w.b, w.k = guard.BucketScale(p)
	}
}

// Exact integer helpers (the scripts' fdiv and cdiv, and ms).

func fdiv(x, y int64) int64 {
	q := x / y
	if (x%y != 0) && ((x < 0) != (y < 0)) {
		q--
	}
	return q
}

func cdiv(x, y int64) int64 { return -fdiv(-x, y) }

func itoa(x int64) string { return strconv.FormatInt(x, 10) }
