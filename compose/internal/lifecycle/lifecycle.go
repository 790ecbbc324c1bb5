// Package lifecycle is the one lifecycle of the starters of real servers
// (compose/redisserver, compose/natsserver, compose/kafkabroker): the
// options they share (a logger and a start timeout), a Guard that
// serializes their lifecycle operations and makes Stop idempotent, the
// poll that retries a start while a port is still taken, the data
// directory a starter may own, and StartTB, the test helper that stops
// what it started at the test's cleanup. Each starter keeps its own
// exported API; this package only holds what they would otherwise write
// three times.
package lifecycle

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// DefaultStartTimeout bounds a start when the caller sets none.
const DefaultStartTimeout = 15 * time.Second

// Option configures a starter whose settings are C. Only OptionFunc makes
// one, so a starter's options are the ones it declares.
type Option[C any] interface {
	apply(*C)
}

type optionFunc[C any] func(*C)

func (f optionFunc[C]) apply(c *C) { f(c) }

// OptionFunc returns the Option that calls f on the settings.
func OptionFunc[C any](f func(*C)) Option[C] { return optionFunc[C](f) }

// Common holds the settings every starter has; a starter's settings embed
// it.
type Common struct {
	// Log receives the lifecycle events; never nil after Apply.
	Log *slog.Logger
	// StartTimeout bounds a start; DefaultStartTimeout after Apply unless
	// an option set it.
	StartTimeout time.Duration
}

func (c *Common) common() *Common { return c }

// settings is a pointer to a starter's settings, which embed Common.
type settings[C any] interface {
	*C
	common() *Common
}

// Apply applies opts in order to c, the starter's defaults, skipping nil
// options, then fills what is still unset in Common: a logger that
// discards, and DefaultStartTimeout.
func Apply[C any, P settings[C]](c C, opts []Option[C]) C {
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	cm := P(&c).common()
	if cm.Log == nil {
		cm.Log = slog.New(slog.DiscardHandler)
	}
	if cm.StartTimeout <= 0 {
		cm.StartTimeout = DefaultStartTimeout
	}
	return c
}

// WithLogger returns the Option that sets Common.Log; nil discards.
func WithLogger[C any, P settings[C]](log *slog.Logger) Option[C] {
	return optionFunc[C](func(c *C) { P(c).common().Log = log })
}

// WithStartTimeout returns the Option that sets Common.StartTimeout;
// values of 0 or less are ignored.
func WithStartTimeout[C any, P settings[C]](d time.Duration) Option[C] {
	return optionFunc[C](func(c *C) {
		if d > 0 {
			P(c).common().StartTimeout = d
		}
	})
}

// Guard serializes a starter's lifecycle operations (down, up, kill,
// restart, stop) so that they never interleave, and ends them at Stop. The
// zero value with Name and ErrStopped set is ready to use.
type Guard struct {
	// Name prefixes the errors Guard returns, as the starter's package
	// name ("natsserver").
	Name string
	// ErrStopped is the starter's sentinel for an operation after Stop.
	ErrStopped error

	mu      sync.Mutex
	stopped bool
	once    Once
}

// Do runs fn, the operation op, holding the lock. After Stop it does not
// call fn and returns an error that matches ErrStopped.
func (g *Guard) Do(op string, fn func() error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return fmt.Errorf("%s: %s: %w", g.Name, op, g.ErrStopped)
	}
	return fn()
}

// Lock takes the lock Do and Stop hold, for a start or a read of the
// starter's state.
func (g *Guard) Lock() { g.mu.Lock() }

// Unlock releases the lock Lock took.
func (g *Guard) Unlock() { g.mu.Unlock() }

// Stop marks the guard stopped and runs fn once, holding the lock. It is
// idempotent and safe from many goroutines: every call returns after the
// first has finished, with its result.
func (g *Guard) Stop(fn func() error) error {
	return g.once.Do(func() error {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.stopped = true
		return fn()
	})
}

// Once runs a stop function once and gives every caller its result, for
// a topology of servers (a Redis Cluster, a Sentinel set) whose parts
// have their own Guard.
type Once struct {
	once sync.Once
	err  error
}

// Do runs fn on the first call; every call returns after it has
// finished, with its result.
func (o *Once) Do(fn func() error) error {
	o.once.Do(func() { o.err = fn() })
	return o.err
}

// Dir is a starter's data directory: one the caller gave, which Remove
// leaves in place, or a new temporary one the starter owns and Remove
// deletes.
type Dir struct {
	// Path is the directory.
	Path  string
	owned bool
}

// MakeDir returns given as a Dir the starter does not own, or, when given
// is empty, a new temporary directory named after pattern (see
// os.MkdirTemp) that it owns.
func MakeDir(given, pattern string) (Dir, error) {
	if given != "" {
		return Dir{Path: given}, nil
	}
	p, err := os.MkdirTemp("", pattern)
	if err != nil {
		return Dir{}, fmt.Errorf("temp dir: %w", err)
	}
	return Dir{Path: p, owned: true}, nil
}

// Remove deletes the directory if the starter owns it.
func (d Dir) Remove() error {
	if !d.owned {
		return nil
	}
	return os.RemoveAll(d.Path)
}

// TB is the part of testing.TB that StartTB uses; this package does not
// import "testing", so binaries that use the starters do not link it.
type TB interface {
	Helper()
	Context() context.Context
	Cleanup(func())
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// StartTB calls start, bounded by tb.Context, and registers the started
// server's Stop with tb.Cleanup; what names the server in the messages
// ("nats server"). Any error fails the test at once.
func StartTB[S interface{ Stop() error }](tb TB, what string, start func(context.Context) (S, error)) S {
	tb.Helper()
	s, err := start(tb.Context())
	if err != nil {
		tb.Fatalf("start %s: %v", what, err)
		return s
	}
	tb.Cleanup(func() {
		if err := s.Stop(); err != nil {
			tb.Errorf("stop %s: %v", what, err)
		}
	})
	return s
}
