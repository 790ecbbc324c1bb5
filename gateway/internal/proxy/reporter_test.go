package proxy

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/guard"
)

func TestReporterDropsWhenFullAndDrainsOnClose(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var charged, dropped atomic.Int64
	r := NewReporter(func(ctx context.Context, req *guard.Request) error {
		<-release
		charged.Add(req.Cost)
		return nil
	}, 2, 1, time.Second, func() { dropped.Add(1) })
	done := make(chan error, 1)
	go func() { done <- r.Run() }()

	// One report is taken by the worker (blocked), two fill the queue; the
	// worker may not have taken the first yet, so allow one more drop.
	queued := 0
	for i := 0; i < 5; i++ {
		if r.Enqueue(guard.Request{Cost: 1}) {
			queued++
		}
	}
	if queued < 2 || queued > 3 || dropped.Load() != int64(5-queued) {
		t.Fatalf("queued %d, dropped %d", queued, dropped.Load())
	}
	close(release)
	r.Close(context.Background())
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if charged.Load() != int64(queued) {
		t.Fatalf("charged %d of %d queued", charged.Load(), queued)
	}
	if r.Enqueue(guard.Request{Cost: 1}) {
		t.Fatal("Enqueue after Close succeeded")
	}
	r.Close(context.Background()) // idempotent
}

func TestReporterCloseAbandonsAtDeadline(t *testing.T) {
	t.Parallel()
	r := NewReporter(func(ctx context.Context, req *guard.Request) error {
		<-ctx.Done() // a Redis that never answers
		return ctx.Err()
	}, 10, 1, time.Hour, nil)
	done := make(chan error, 1)
	go func() { done <- r.Run() }()
	for i := 0; i < 5; i++ {
		r.Enqueue(guard.Request{Cost: 1})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	r.Close(ctx)
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Close took %v", took)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
