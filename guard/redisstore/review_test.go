package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/guard"
)

// TestReviewBatchDeadlineIsAnotherCallers: a call with a generous deadline
// (the store's 2 s) batched with a caller whose context expires sooner is
// failed at the other caller's deadline, although Redis answers well within
// its own.
func TestReviewBatchDeadlineIsAnotherCallers(t *testing.T) {
	srv := redistest.StartTB(t)
	store, _ := leanStore(t, srv.Addr(), 2*time.Second, WithBatch(64, 1))
	peekRemaining(t, store, oneCounter("tg{warm}"))
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	defer srv.Resume()
	start := time.Now()
	// Z occupies the only batching goroutine until its 150 ms deadline.
	zDone := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
		defer cancel()
		_, err := store.Do(ctx, guard.OpCheck, 0, oneCounter("tg{z}"), make([]guard.CounterResult, 1))
		zDone <- err
	}()
	for len(store.pq) != 0 || time.Since(start) < 20*time.Millisecond {
		time.Sleep(time.Millisecond)
	}
	// A: an impatient caller (400 ms); B: the store's own 2 s.
	aDone, bDone := make(chan error, 1), make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
		defer cancel()
		_, err := store.Do(ctx, guard.OpCheck, 0, oneCounter("tg{a}"), make([]guard.CounterResult, 1))
		aDone <- err
	}()
	var bTook time.Duration
	go func() {
		t0 := time.Now()
		_, err := store.Do(context.Background(), guard.OpCheck, 0, oneCounter("tg{b}"), make([]guard.CounterResult, 1))
		bTook = time.Since(t0)
		bDone <- err
	}()
	for len(store.pq) != 2 {
		time.Sleep(time.Millisecond)
	}
	t.Logf("Z: %v", <-zDone)
	// Redis comes back 700 ms in: past A's deadline, long before B's.
	time.Sleep(700*time.Millisecond - time.Since(start))
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	t.Logf("A: %v", <-aDone)
	if err := <-bDone; err != nil {
		t.Fatalf("B (deadline 2 s, Redis answering after 0.7 s) failed after %v: %v", bTook, err)
	}
}

// TestReviewQueuedCallShortensBatch: no caller sets a deadline of its own
// (every call has the store's 300 ms). A call that waited in the queue
// behind a hung batch is sent with one that just arrived; the batch gets
// the older call's nearly spent deadline, and the fresh call fails
// although Redis answers well within its 300 ms.
func TestReviewQueuedCallShortensBatch(t *testing.T) {
	srv := redistest.StartTB(t)
	store, _ := leanStore(t, srv.Addr(), 300*time.Millisecond, WithBatch(64, 1))
	peekRemaining(t, store, oneCounter("tg{warm}"))
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	defer srv.Resume()
	do := func(name string, took *time.Duration, done chan<- error) {
		t0 := time.Now()
		_, err := store.Do(context.Background(), guard.OpCheck, 0, oneCounter(name), make([]guard.CounterResult, 1))
		*took = time.Since(t0)
		done <- err
	}
	start := time.Now()
	var zt, at, bt time.Duration
	zDone, aDone, bDone := make(chan error, 1), make(chan error, 1), make(chan error, 1)
	go do("tg{z}", &zt, zDone) // hangs until 300 ms
	for len(store.pq) != 0 || time.Since(start) < 20*time.Millisecond {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(30 * time.Millisecond)
	go do("tg{a}", &at, aDone) // queued at ~50 ms: deadline ~350 ms
	for len(store.pq) != 1 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(250*time.Millisecond - time.Since(start))
	go do("tg{b}", &bt, bDone) // queued at ~250 ms: deadline ~550 ms
	for len(store.pq) != 2 {
		time.Sleep(time.Millisecond)
	}
	t.Logf("Z: %v", <-zDone)
	time.Sleep(420*time.Millisecond - time.Since(start)) // Redis back at ~420 ms
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	t.Logf("A after %v: %v", at, <-aDone)
	if err := <-bDone; err != nil {
		t.Fatalf("B (300 ms of its own, Redis back after %v of them) failed after %v: %v", 420*time.Millisecond-250*time.Millisecond, bt, err)
	}
}
