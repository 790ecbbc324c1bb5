package redisstore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tollgate/tollgate/compose/redisserver"
	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/internal/testwait"
)

// TestCallDeadlineIsItsOwnNotABatchMates: each call's deadline is its own
// (the deadline holds whatever Redis does), not the earliest of its batch's. A paused Redis holds call Z
// on the only batching goroutine while A (its caller gives up after 1 s)
// and B (the store's 5 s) queue behind it, so A and B leave as one batch.
// A fails at its own deadline; Redis is resumed only then, and B, well
// within its 5 s, is decided. Sequenced by events (Z sent, A and B queued,
// A answered), not by sleeps.
func TestCallDeadlineIsItsOwnNotABatchMates(t *testing.T) {
	t.Parallel()
	r := newPausedRig(t)
	base := r.store.Calls()
	zDone := r.check(500*time.Millisecond, "tg{z}")
	r.waitSent(base + 1)
	aDone := r.check(time.Second, "tg{a}")
	bDone := r.check(0, "tg{b}")
	testwait.Eventually(t, 5*time.Second, func() error {
		if n := len(r.store.pq); n != 2 {
			return fmt.Errorf("%d calls queued, want A and B behind Z", n)
		}
		return nil
	})
	if err := <-zDone; err == nil {
		t.Fatal("Z decided by a paused Redis")
	}
	r.waitSent(base + 3)
	if err := <-aDone; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("A: %v, want its own deadline", err)
	}
	select {
	case err := <-bDone:
		t.Fatalf("B answered at A's deadline (%v): a batch-mate's deadline failed it", err)
	default:
	}
	if err := r.srv.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := <-bDone; err != nil {
		t.Fatalf("B (5 s of its own, Redis back after about 1.5 s): %v", err)
	}
}

// TestCallAbandonedInQueueIsNotSent: a call whose caller gives up while it
// still waits in the queue (behind Z, held by a paused Redis) is answered
// with guard.ErrNotSent and is never sent (Redis never sees its counter),
// so a caller may safely send it again; Z, which was sent, is not.
func TestCallAbandonedInQueueIsNotSent(t *testing.T) {
	t.Parallel()
	r := newPausedRig(t)
	base := r.store.Calls()
	zDone := r.check(time.Second, "tg{z}")
	r.waitSent(base + 1)
	qDone := r.check(100*time.Millisecond, "tg{q}")
	if err := <-qDone; !errors.Is(err, guard.ErrNotSent) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Q, abandoned in the queue: %v, want a deadline error that says it was not sent", err)
	}
	if err := <-zDone; err == nil || errors.Is(err, guard.ErrNotSent) {
		t.Fatalf("Z, sent to a paused Redis: %v, want an error that does not say it was not sent", err)
	}
	if err := r.srv.Resume(); err != nil {
		t.Fatal(err)
	}
	// The queue is empty once a later call is decided.
	if _, err := r.store.Do(context.Background(), guard.OpCheck, 0, oneCounter("tg{r}"), make([]guard.CounterResult, 1)); err != nil {
		t.Fatal(err)
	}
	if n, err := r.admin.Exists(context.Background(), "tg{q}").Result(); err != nil || n != 0 {
		t.Fatalf("Q's counter exists (%d, %v): an abandoned call was sent", n, err)
	}
	if calls := r.store.Calls() - base; calls != 2 {
		t.Fatalf("%d calls sent after the warm-up, want Z and R", calls)
	}
}

// pausedRig is a lean store with one batching goroutine on a redis-server
// that is paused once the store is warm (its script loaded), with an
// asynchronous check and a wait for the calls sent.
type pausedRig struct {
	t     *testing.T
	srv   *redisserver.Server
	store *Store
	admin redis.UniversalClient
}

func newPausedRig(t *testing.T) *pausedRig {
	t.Helper()
	srv := redistest.StartTB(t)
	store, admin := leanStore(t, srv.Addr(), 5*time.Second, WithBatch(64, 1))
	peekRemaining(t, store, oneCounter("tg{warm}"))
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Resume() })
	return &pausedRig{t: t, srv: srv, store: store, admin: admin}
}

// check checks the counter name on a goroutine of its own, its caller
// giving up after timeout (0: never; the store's 5 s apply).
func (r *pausedRig) check(timeout time.Duration, name string) <-chan error {
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.Background(), context.CancelFunc(func() {})
		if timeout > 0 {
			ctx, cancel = context.WithTimeout(ctx, timeout)
		}
		defer cancel()
		_, err := r.store.Do(ctx, guard.OpCheck, 0, oneCounter(name), make([]guard.CounterResult, 1))
		done <- err
	}()
	return done
}

// waitSent waits until the store has sent n calls in all.
func (r *pausedRig) waitSent(n int64) {
	r.t.Helper()
	testwait.Eventually(r.t, 5*time.Second, func() error {
		if got := r.store.Calls(); got != n {
			return fmt.Errorf("%d calls sent, want %d", got, n)
		}
		return nil
	})
}
