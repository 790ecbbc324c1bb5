// Package breaker is a circuit breaker for calls to one backend (a Redis
// node): it counts outcomes over a sliding window and, once the backend
// looks down, refuses calls at once instead of letting each wait for its
// deadline.
//
// A Breaker is closed (calls go through) until, within Window, at least
// MinRequests calls were recorded and at least FailureRatio of them failed,
// or ConsecutiveFailures calls in a row failed. It then opens: Allow
// answers false for OpenFor. The first Allow after that half-opens it and
// lets up to Probes calls through; the first probe to succeed closes the
// breaker (with an empty window), the first to fail opens it again for
// another OpenFor. A probe whose outcome is never recorded (its caller gave
// up) does not wedge the breaker: after OpenFor in half-open, Allow admits
// new probes.
//
// Allow and Record are safe for concurrent use, take no lock and allocate
// nothing while the breaker is closed, and take a mutex only to change
// state. Time comes from Config.Clock, so tests drive the breaker without
// sleeping. The window's counts are kept in buckets of Window/10 updated
// with atomics; a call recorded exactly while its bucket is being recycled
// may be lost, which only makes the error rate approximate by that call.
package breaker

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// State is a breaker's state.
type State int32

// States.
const (
	// Closed: calls go through and their outcomes are counted.
	Closed State = iota
	// Open: calls are refused until OpenFor has passed.
	Open
	// HalfOpen: up to Probes calls go through to test the backend.
	HalfOpen
)

func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case Open:
		return "open"
	case HalfOpen:
		return "half_open"
	}
	return "unknown"
}

// Defaults of Config (SetDefaults).
const (
	DefaultWindow              = time.Second
	DefaultMinRequests         = 20
	DefaultFailureRatio        = 0.5
	DefaultConsecutiveFailures = 5
	DefaultOpenFor             = 500 * time.Millisecond
	DefaultProbes              = 1
)

// buckets is the number of slices the window is counted in.
const buckets = 10

// Config configures a Breaker. The zero value means every default.
type Config struct {
	// Window is the span over which the error rate is measured (default
	// 1s), counted in ten buckets: calls leave it a tenth at a time.
	Window time.Duration
	// MinRequests is the fewest calls within Window for the error rate to
	// count (default 20): a single failure of a quiet backend does not
	// open the breaker.
	MinRequests int
	// FailureRatio is the share of failed calls within Window, in (0, 1],
	// that opens the breaker (default 0.5).
	FailureRatio float64
	// ConsecutiveFailures opens the breaker after that many failures in a
	// row, whatever the window says (default 5; -1 disables), so a quiet
	// backend that went away is detected after a few calls.
	ConsecutiveFailures int
	// OpenFor is how long the breaker stays open before it half-opens
	// (default 500ms).
	OpenFor time.Duration
	// Probes is the most calls let through at once while half-open
	// (default 1).
	Probes int
	// Clock returns monotonic time in nanoseconds (any origin). Default:
	// the time since the package was initialised, monotonic.
	Clock func() int64
	// OnStateChange, if set, is called on every change of state, from the
	// goroutine that caused it, with the breaker's transition lock held:
	// it must be quick and must not call the breaker. Use it to count
	// transitions and log them.
	OnStateChange func(from, to State)
}

var epoch = time.Now()

func monotonic() int64 { return int64(time.Since(epoch)) }

// SetDefaults fills the zero fields with their defaults.
func (c *Config) SetDefaults() {
	c.Window = cmp.Or(c.Window, DefaultWindow)
	c.MinRequests = cmp.Or(c.MinRequests, DefaultMinRequests)
	c.FailureRatio = cmp.Or(c.FailureRatio, DefaultFailureRatio)
	c.ConsecutiveFailures = cmp.Or(c.ConsecutiveFailures, DefaultConsecutiveFailures)
	c.OpenFor = cmp.Or(c.OpenFor, DefaultOpenFor)
	c.Probes = cmp.Or(c.Probes, DefaultProbes)
	if c.Clock == nil {
		c.Clock = monotonic
	}
}

// Validate reports every problem with c at once (after SetDefaults).
func (c *Config) Validate() error {
	var errs []error
	if c.Window < buckets {
		errs = append(errs, fmt.Errorf("breaker: window %v: must be at least %dns", c.Window, buckets))
	}
	if c.MinRequests < 1 {
		errs = append(errs, fmt.Errorf("breaker: min requests %d: must be positive", c.MinRequests))
	}
	if !(c.FailureRatio > 0 && c.FailureRatio <= 1) {
		errs = append(errs, fmt.Errorf("breaker: failure ratio %v: must be in (0, 1]", c.FailureRatio))
	}
	if c.ConsecutiveFailures < -1 {
		errs = append(errs, fmt.Errorf("breaker: consecutive failures %d: must be positive or -1", c.ConsecutiveFailures))
	}
	if c.OpenFor <= 0 {
		errs = append(errs, fmt.Errorf("breaker: open for %v: must be positive", c.OpenFor))
	}
	if c.Probes < 1 || c.Probes > math.MaxInt32 {
		errs = append(errs, fmt.Errorf("breaker: probes %d: must be positive", c.Probes))
	}
	return errors.Join(errs...)
}

// Breaker is a circuit breaker. Create it with New; it is safe for
// concurrent use and starts no goroutines.
type Breaker struct {
	cfg    Config
	width  int64 // bucket width, ns
	open   int64 // OpenFor, ns
	probes int32

	state atomic.Int32 // a State
	// until is the end of the open period (Open) or the time after which
	// unanswered probes are given up on (HalfOpen). Written before state.
	until  atomic.Int64
	issued atomic.Int32 // probes let through in this half-open period
	consec atomic.Int64 // failures in a row
	bucket [buckets]bucket

	mu sync.Mutex // held to change state
}

// bucket counts the calls of one slice of the window.
type bucket struct {
	slot  atomic.Int64 // index of the slice of time counted, plus one; 0: unused
	total atomic.Int64
	fails atomic.Int64
	_     [40]byte // keep buckets on their own cache lines
}

// New returns a closed Breaker. cfg's zero fields take their defaults; an
// invalid cfg is an error.
func New(cfg Config) (*Breaker, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Breaker{
		cfg:    cfg,
		width:  int64(cfg.Window) / buckets,
		open:   int64(cfg.OpenFor),
		probes: int32(cfg.Probes),
	}, nil
}

// Config returns the breaker's configuration, defaults filled in.
func (b *Breaker) Config() Config { return b.cfg }

// State returns the current state. An open breaker whose OpenFor has
// passed reports Open until the next Allow half-opens it.
func (b *Breaker) State() State { return b.load() }

// Refusing reports whether Allow would refuse a call now — the breaker is
// open and its OpenFor has not passed, or half-open with every probe out
// and their time not up — without changing its state or using up a
// half-open probe. A caller about to make several calls that must all
// succeed asks it of each backend before making the first.
func (b *Breaker) Refusing() bool {
	switch b.load() {
	case Open:
		return b.cfg.Clock() < b.until.Load()
	case HalfOpen:
		return b.issued.Load() >= b.probes && b.cfg.Clock() < b.until.Load()
	}
	return false
}

// Allow reports whether a call may go to the backend now. Every call
// allowed should have its outcome given to Record; a call that is
// abandoned without one (its caller went away) is simply not recorded.
func (b *Breaker) Allow() bool {
	switch b.load() {
	case Closed:
		return true
	case Open:
		now := b.cfg.Clock()
		if now < b.until.Load() {
			return false
		}
		b.mu.Lock()
		if b.load() == Open && now >= b.until.Load() {
			b.halfOpen(now)
		}
		b.mu.Unlock()
		return b.Allow()
	default: // HalfOpen
		if b.issued.Load() < b.probes && b.issued.Add(1) <= b.probes {
			return true
		}
		now := b.cfg.Clock()
		if now < b.until.Load() {
			return false
		}
		// The probes let through gave no answer within OpenFor: try again.
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.load() != HalfOpen || now < b.until.Load() {
			return b.load() == Closed
		}
		b.until.Store(now + b.open)
		b.issued.Store(1)
		return true
	}
}

// Record records the outcome of a call that Allow let through: ok false
// for a failure of the backend (a timeout, a refused or broken
// connection), true for anything that shows the backend answering, even
// with an error of the caller's making. While half-open the first outcome
// recorded decides, even that of a call let through before the breaker
// opened (with call deadlines far shorter than OpenFor, in practice always
// a probe's).
func (b *Breaker) Record(ok bool) {
	switch b.load() {
	case Closed:
		now := b.cfg.Clock()
		bk := b.bucketAt(now)
		bk.total.Add(1)
		if ok {
			if b.consec.Load() != 0 {
				b.consec.Store(0)
			}
			return
		}
		bk.fails.Add(1)
		n := b.consec.Add(1)
		if (b.cfg.ConsecutiveFailures > 0 && n >= int64(b.cfg.ConsecutiveFailures)) || b.rateExceeded(now) {
			b.mu.Lock()
			if b.load() == Closed {
				b.trip(Closed, now)
			}
			b.mu.Unlock()
		}
	case HalfOpen:
		now := b.cfg.Clock()
		b.mu.Lock()
		if b.load() == HalfOpen {
			if ok {
				b.close()
			} else {
				b.trip(HalfOpen, now)
			}
		}
		b.mu.Unlock()
	}
	// Open: a late outcome of a call let through before the breaker
	// opened says nothing new.
}

// Stats returns the calls and failures counted in the current window.
func (b *Breaker) Stats() (total, failures int64) {
	cur := b.cfg.Clock()/b.width + 1
	for i := range b.bucket {
		bk := &b.bucket[i]
		if s := bk.slot.Load(); s > cur-buckets && s <= cur {
			total += bk.total.Load()
			failures += bk.fails.Load()
		}
	}
	return total, failures
}

// bucketAt returns the bucket counting time now, recycled if it last
// counted an older slice of time.
func (b *Breaker) bucketAt(now int64) *bucket {
	s := now/b.width + 1
	bk := &b.bucket[uint64(s)%buckets] // any clock origin, negative too
	if old := bk.slot.Load(); old != s && bk.slot.CompareAndSwap(old, s) {
		bk.total.Store(0)
		bk.fails.Store(0)
	}
	return bk
}

func (b *Breaker) rateExceeded(now int64) bool {
	cur := now/b.width + 1
	var total, fails int64
	for i := range b.bucket {
		bk := &b.bucket[i]
		if s := bk.slot.Load(); s > cur-buckets && s <= cur {
			total += bk.total.Load()
			fails += bk.fails.Load()
		}
	}
	return total >= int64(b.cfg.MinRequests) && float64(fails) >= b.cfg.FailureRatio*float64(total)
}

// trip opens the breaker. b.mu is held.
func (b *Breaker) trip(from State, now int64) {
	b.until.Store(now + b.open)
	b.setState(Open)
	b.notify(from, Open)
}

// halfOpen lets probes through. b.mu is held.
func (b *Breaker) halfOpen(now int64) {
	b.issued.Store(0)
	b.until.Store(now + b.open)
	b.setState(HalfOpen)
	b.notify(Open, HalfOpen)
}

// close closes the breaker with an empty window. b.mu is held.
func (b *Breaker) close() {
	for i := range b.bucket {
		b.bucket[i].slot.Store(0)
		b.bucket[i].total.Store(0)
		b.bucket[i].fails.Store(0)
	}
	b.consec.Store(0)
	b.setState(Closed)
	b.notify(HalfOpen, Closed)
}

func (b *Breaker) load() State { return State(b.state.Load()) }

func (b *Breaker) setState(s State) { b.state.Store(int32(s)) }

func (b *Breaker) notify(from, to State) {
	if b.cfg.OnStateChange != nil {
		b.cfg.OnStateChange(from, to)
	}
}
