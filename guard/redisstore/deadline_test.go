package redisstore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/internal/testwait"
)

// TestCallDeadlineIsItsOwnNotABatchMates: each call's deadline is its own
// (SPEC §7), not the earliest of its batch's. A paused Redis holds call Z
// on the only batching goroutine while A (its caller gives up after 1 s)
// and B (the store's 5 s) queue behind it, so A and B leave as one batch.
// A fails at its own deadline; Redis is resumed only then, and B, well
// within its 5 s, is decided. Sequenced by events (Z sent, A and B queued,
// A answered), not by sleeps.
func TestCallDeadlineIsItsOwnNotABatchMates(t *testing.T) {
	t.Parallel()
	srv := redistest.StartTB(t)
	store, _ := leanStore(t, srv.Addr(), 5*time.Second, WithBatch(64, 1))
	peekRemaining(t, store, oneCounter("tg{warm}"))
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	defer srv.Resume()
	do := func(timeout time.Duration, name string) <-chan error {
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if timeout > 0 {
				ctx, cancel = context.WithTimeout(ctx, timeout)
			}
			defer cancel()
			_, err := store.Do(ctx, guard.OpCheck, 0, oneCounter(name), make([]guard.CounterResult, 1))
			done <- err
		}()
		return done
	}
	sent := func(n int64) func() error {
		return func() error {
			if got := store.Calls(); got != n {
				return fmt.Errorf("%d calls sent, want %d", got, n)
			}
			return nil
		}
	}
	base := store.Calls()
	zDone := do(500*time.Millisecond, "tg{z}")
	testwait.Eventually(t, 5*time.Second, sent(base+1))
	aDone := do(time.Second, "tg{a}")
	bDone := do(0, "tg{b}")
	testwait.Eventually(t, 5*time.Second, func() error {
		if n := len(store.pq); n != 2 {
			return fmt.Errorf("%d calls queued, want A and B behind Z", n)
		}
		return nil
	})
	if err := <-zDone; err == nil {
		t.Fatal("Z decided by a paused Redis")
	}
	testwait.Eventually(t, 5*time.Second, sent(base+3))
	if err := <-aDone; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("A: %v, want its own deadline", err)
	}
	select {
	case err := <-bDone:
		t.Fatalf("B answered at A's deadline (%v): a batch-mate's deadline failed it", err)
	default:
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := <-bDone; err != nil {
		t.Fatalf("B (5 s of its own, Redis back after about 1.5 s): %v", err)
	}
}
