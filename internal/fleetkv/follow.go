package fleetkv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// Follow's timings.
const (
	// opTimeout bounds one JetStream request (opening a bucket, creating a
	// watcher): a lost request costs this much before the retry.
	opTimeout = time.Second
	// initialTimeout bounds the delivery of the buckets' current content
	// at the start of a session.
	initialTimeout = 10 * time.Second
	// maxRetryWait is the longest pause between two failed sessions.
	maxRetryWait = 2 * time.Second
	// stopTimeout bounds the wait for a stopped watcher's delivery to end.
	stopTimeout = 2 * time.Second
)

// errResync ends a session so that the next one reads everything afresh:
// the connection came back.
var errResync = errors.New("fleetkv: reconnected")

// Handler receives what Follow reads, on Follow's goroutine.
type Handler interface {
	// Sync receives the buckets' whole content, read afresh at the start
	// of every session: the first one, and after every reconnect (a key
	// deleted meanwhile is simply not in it).
	Sync(ctx context.Context, s *Snapshot)
	// Change receives every change after Sync, one entry at a time.
	Change(c Change)
	// Flush follows one or more Change calls: the changes that were
	// waiting together (a burst, up to maxBurst), so that a handler can
	// publish them at once, with one copy of what it publishes.
	Flush()
	// Tick is called every tick (Follow's argument) while a session
	// follows the buckets.
	Tick(now time.Time)
}

// Snapshot is the buckets' whole content, as Handler.Sync receives it.
type Snapshot struct {
	// Rules is the active ruleset's entry (decoded, or corrupt); nil when
	// the bucket holds none.
	Rules *Change
	// Entries are the blocklist and overrides buckets' entries.
	Entries Entries
	rules   jetstream.KeyValue
}

// RulesVersions returns the rulesets the rules bucket's history holds,
// oldest first, corrupt ones included (KV.RulesVersions).
func (s *Snapshot) RulesVersions(ctx context.Context) ([]RulesVersion, error) {
	return rulesVersions(ctx, s.rules)
}

// follower is one Follow's state, owned by its goroutine.
type follower struct {
	c       *Conn
	h       Handler
	tick    time.Duration
	failing string // the session problem last logged
}

// Follow watches every key of the three buckets and hands what it reads
// to h, on the calling goroutine, until ctx is done; then it returns nil.
//
// A session reads the buckets whole (h.Sync), then hands over each change
// (h.Change). A KV watcher kept across a NATS outage goes blind for
// 10–20 s after the server returns, so every (re)connect ends the session
// and starts a new one, which reads everything afresh. While NATS is
// unreachable, or until the buckets exist (the aggregator creates them),
// h hears nothing and Follow retries, from the connection's ReconnectWait
// doubling up to 2 s, logging each distinct problem once.
//
// Stopping a session's watchers can take seconds right after a server
// restart, so it runs on a goroutine of its own, which Close waits for.
// Call Follow once per connection.
func (c *Conn) Follow(ctx context.Context, h Handler, tick time.Duration) error {
	f := &follower{c: c, h: h, tick: tick}
	wait := c.reconnectWait
	retry := time.NewTimer(0)
	defer retry.Stop()
	for {
		err := f.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, errResync) {
			wait = c.reconnectWait
			continue
		}
		if msg := err.Error(); msg != f.failing {
			f.failing = msg
			c.log.Warn("control plane unavailable; the rules and controls in force stay", slog.String("error", msg))
		}
		retry.Reset(wait)
		select {
		case <-ctx.Done():
			return nil
		case <-c.up: // connected: try at once
		case <-retry.C:
		}
		wait = min(2*wait, maxRetryWait)
	}
}

// watchers are one session's watchers, by bucket (as in buckets), and the
// rules bucket (for its history).
type watchers struct {
	kw    [3]jetstream.KeyWatcher
	rules jetstream.KeyValue
}

// session reads the three buckets whole and hands them over, then hands
// over their changes until ctx is done, the connection comes back from an
// outage (errResync) or a watcher fails.
func (f *follower) session(ctx context.Context) error {
	select {
	case <-f.c.up: // this session reads everything: that is the resync
	default:
	}
	if !f.c.IsConnected() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-f.c.up:
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := f.watch(ctx)
	if err != nil {
		return err
	}
	defer f.c.retire(w.kw[:]...)
	snap, err := f.initial(ctx, w)
	if err != nil {
		return err
	}
	f.h.Sync(ctx, snap)
	if f.failing != "" {
		f.failing = ""
		f.c.log.Info("control plane reachable again")
	}

	var ticks <-chan time.Time
	if f.tick > 0 {
		t := time.NewTicker(f.tick)
		defer t.Stop()
		ticks = t.C
	}
	for {
		var e jetstream.KeyValueEntry
		ok := true
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-f.c.up:
			return errResync
		case now := <-ticks:
			f.h.Tick(now)
			continue
		case e, ok = <-w.kw[0].Updates():
		case e, ok = <-w.kw[1].Updates():
		case e, ok = <-w.kw[2].Updates():
		}
		if !ok {
			return errors.New("fleetkv: a watcher stopped")
		}
		if e != nil {
			f.h.Change(decodeEntry(e))
		}
		if err := f.burst(w); err != nil {
			return err
		}
		f.h.Flush()
	}
}

// maxBurst bounds the changes handed over between two Flush calls.
const maxBurst = 1024

// burst hands over the changes already waiting in the watchers, without
// waiting for more, up to maxBurst.
func (f *follower) burst(w *watchers) error {
	for range maxBurst - 1 {
		var e jetstream.KeyValueEntry
		ok := true
		select {
		case e, ok = <-w.kw[0].Updates():
		case e, ok = <-w.kw[1].Updates():
		case e, ok = <-w.kw[2].Updates():
		default:
			return nil
		}
		if !ok {
			return errors.New("fleetkv: a watcher stopped")
		}
		if e != nil {
			f.h.Change(decodeEntry(e))
		}
	}
	return nil
}

// initial reads the buckets' current content: each watcher sends it, then
// nil.
func (f *follower) initial(ctx context.Context, w *watchers) (*Snapshot, error) {
	snap := &Snapshot{Entries: NewEntries(), rules: w.rules}
	timeout := time.NewTimer(initialTimeout)
	defer timeout.Stop()
	for open := len(w.kw); open > 0; {
		var e jetstream.KeyValueEntry
		var ok bool
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-f.c.up:
			return nil, errResync
		case <-timeout.C:
			return nil, fmt.Errorf("fleetkv: the buckets' content did not arrive within %v", initialTimeout)
		case e, ok = <-w.kw[0].Updates():
		case e, ok = <-w.kw[1].Updates():
		case e, ok = <-w.kw[2].Updates():
		}
		switch {
		case !ok:
			return nil, errors.New("fleetkv: a watcher stopped while reading the buckets")
		case e == nil:
			open--
		case e.Bucket() == tollgatev1.BucketRules:
			snap.Rules = nil
			if c := decodeEntry(e); !c.Deleted {
				snap.Rules = &c
			}
		default:
			snap.Entries.Apply(decodeEntry(e))
		}
	}
	return snap, nil
}

// decodeEntry decodes a watched entry.
func decodeEntry(e jetstream.KeyValueEntry) Change {
	if e.Operation() != jetstream.KeyValuePut {
		return Change{Bucket: e.Bucket(), Key: e.Key(), Revision: e.Revision(), Deleted: true}
	}
	return Decode(e.Bucket(), e.Key(), e.Revision(), e.Value())
}

// watch binds the buckets and watches every key of them a gateway reads.
//
// Right after a NATS server restarts, a request to create a watcher's
// consumer may go unanswered, and nats.go would wait 5 s for it. The
// watcher's context is also its lifetime (cancelling it stops the
// watcher), so each creation gets a context of its own, cancelled by a
// timer if the creation takes longer than opTimeout: the session then
// fails fast and the next one retries.
func (f *follower) watch(ctx context.Context) (*watchers, error) {
	w := &watchers{}
	for i, b := range buckets {
		octx, cancel := context.WithTimeout(ctx, opTimeout)
		kv, err := bind(octx, f.c.js, b.name)
		cancel()
		if err == nil {
			if b.name == tollgatev1.BucketRules {
				w.rules = kv
			}
			if w.kw[i], err = f.watchKeys(ctx, kv, b.watch); err != nil {
				err = fmt.Errorf("fleetkv: watch bucket %s: %w", b.name, err)
			}
		}
		if err != nil {
			f.c.retire(w.kw[:]...)
			return nil, err
		}
	}
	return w, nil
}

// watchKeys creates a watcher of keys that lives until ctx is done, giving
// up on its creation after opTimeout. (The timer's function, run by the
// runtime on a goroutine of its own, only cancels a context: nothing to
// wait for.)
func (f *follower) watchKeys(ctx context.Context, kv jetstream.KeyValue, keys string) (jetstream.KeyWatcher, error) {
	wctx, cancel := context.WithCancel(ctx)
	abort := time.AfterFunc(opTimeout, cancel)
	kw, err := kv.Watch(wctx, keys)
	if !abort.Stop() {
		// The timer fired: the creation was aborted, or ended just then
		// with a watcher already stopped by the cancel.
		if err == nil {
			f.c.retire(kw)
		}
		return nil, fmt.Errorf("creating the watcher took more than %v", opTimeout)
	}
	if err != nil {
		cancel()
		return nil, err
	}
	// cancel is called when ctx ends (it is wctx's parent).
	return kw, nil
}

// retire stops watchers (nil ones are skipped) on a goroutine of their
// own, which Close waits for: stopping one deletes its consumer, a request
// that may go unanswered for 5 s right after a NATS server restarts, and
// the next session must not wait for that.
func (c *Conn) retire(kws ...jetstream.KeyWatcher) {
	c.retiring.Go(func() { stopWatchers(kws...) })
}

// stopWatchers stops watchers and then waits, at most stopTimeout in all,
// for their deliveries to end: a delivery blocked on a full Updates
// channel would otherwise hold a nats.go goroutine forever.
func stopWatchers(kws ...jetstream.KeyWatcher) {
	for _, kw := range kws {
		if kw != nil {
			_ = kw.Stop()
		}
	}
	deadline := time.NewTimer(stopTimeout)
	defer deadline.Stop()
	for _, kw := range kws {
		if kw == nil {
			continue
		}
	drain:
		for {
			select {
			case _, ok := <-kw.Updates():
				if !ok {
					break drain
				}
			case <-deadline.C:
				return
			}
		}
	}
}
