// Package service is the scaffold every Tollgate process shares: a Group of
// goroutines that stops at the first error and waits for all, and a
// Lifecycle that lets Run be called once and Close any number of times,
// from any goroutine, returning only when everything Run started has
// stopped (STYLE: every goroutine has an owner that waits for it); and
// Every, the loop of a goroutine that works at an interval, with Wait for
// the loops that pace themselves with a timer; and Poll, the loop that
// waits for a condition (a process ready, a link up).
package service

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Errors of Lifecycle.
var (
	// ErrRunning is returned by a second call of Run.
	ErrRunning = errors.New("service: Run called more than once")
	// ErrClosed is returned by Run after Close.
	ErrClosed = errors.New("service: closed")
)

// Group runs goroutines, cancels its context at the first error and waits
// for all (golang.org/x/sync/errgroup, without the dependency).
type Group struct {
	wg     sync.WaitGroup
	once   sync.Once
	err    error
	cancel context.CancelFunc
}

// NewGroup returns a group and a context canceled at its first error or
// when ctx is done.
func NewGroup(ctx context.Context) (*Group, context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	return &Group{cancel: cancel}, ctx
}

// Go runs f on a new goroutine.
func (g *Group) Go(f func() error) {
	g.wg.Go(func() {
		if err := f(); err != nil {
			g.once.Do(func() {
				g.err = err
				g.cancel()
			})
		}
	})
}

// Wait waits for every goroutine and returns the first error.
func (g *Group) Wait() error {
	g.wg.Wait()
	g.cancel()
	return g.err
}

// Lifecycle is the Run-once / Close-many state machine of a process.
type Lifecycle struct {
	mu     sync.Mutex
	state  int
	cancel context.CancelFunc
	done   chan struct{}
}

const (
	stateNew = iota
	stateRunning
	stateClosed
)

// Start marks the lifecycle running and returns the context Run must use,
// canceled by Close; call the returned finish when Run returns. It returns
// ErrRunning or ErrClosed when Run may not proceed.
func (l *Lifecycle) Start(ctx context.Context) (context.Context, func(), error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.init()
	switch l.state {
	case stateRunning:
		return nil, nil, ErrRunning
	case stateClosed:
		return nil, nil, ErrClosed
	}
	l.state = stateRunning
	ctx, l.cancel = context.WithCancel(ctx)
	cancel := l.cancel
	return ctx, func() {
		cancel()
		l.mu.Lock()
		l.state = stateClosed
		l.mu.Unlock()
		close(l.done)
	}, nil
}

func (l *Lifecycle) init() {
	if l.done == nil {
		l.done = make(chan struct{})
	}
}

// Close stops a running process and waits for Run to return. For a
// process never run, it calls release (which frees what New acquired) and
// returns. It is idempotent and safe from many goroutines.
func (l *Lifecycle) Close(release func()) {
	l.mu.Lock()
	l.init()
	switch l.state {
	case stateNew:
		l.state = stateClosed
		close(l.done)
		l.mu.Unlock()
		if release != nil {
			release()
		}
		return
	case stateRunning:
		l.cancel()
	}
	done := l.done
	l.mu.Unlock()
	<-done
}

// Task is one goroutine's result, which many may wait for.
type Task struct {
	done chan struct{}
	err  error
}

// Go runs f on a new goroutine; the caller owns it and must Wait.
func Go(f func() error) *Task {
	t := &Task{done: make(chan struct{})}
	go func() {
		t.err = f()
		close(t.done)
	}()
	return t
}

// Done is closed once f has returned.
func (t *Task) Done() <-chan struct{} { return t.done }

// Exited reports whether f has returned.
func (t *Task) Exited() bool {
	select {
	case <-t.done:
		return true
	default:
		return false
	}
}

// Wait waits for f and returns its error.
func (t *Task) Wait() error {
	<-t.done
	return t.err
}

// Every calls fn with the tick's time every interval, the first time one
// interval after the call, until ctx is done; it returns then. A call of
// fn that outlasts the interval delays the next one (ticks are dropped,
// not queued).
func Every(ctx context.Context, interval time.Duration, fn func(now time.Time)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			fn(now)
		}
	}
}

// Wait waits for c (a timer's or a ticker's channel) to deliver, or for
// ctx to be done; it reports whether c delivered. It is the head of a loop
// that paces itself, resetting its timer for the next round:
//
//	for service.Wait(ctx, t.C) { …; t.Reset(next) }
func Wait(ctx context.Context, c <-chan time.Time) bool {
	select {
	case <-ctx.Done():
		return false
	case <-c:
		return true
	}
}

// Poll calls fn at interval, the first time at once, until it reports
// done or ctx ends. It returns fn's error when done, else ctx's error
// joined with fn's last error (a call cut short by ctx's deadline says
// less than the one before, so that one is kept).
func Poll(ctx context.Context, interval time.Duration, fn func() (done bool, err error)) error {
	t := time.NewTimer(0)
	defer t.Stop()
	var last error
	for {
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("%w (last: %w)", ctx.Err(), last)
			}
			return ctx.Err()
		case <-t.C:
		}
		done, err := fn()
		if done {
			return err
		}
		if last == nil || ctx.Err() == nil {
			last = err
		}
		t.Reset(interval)
	}
}
