package service

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testwait"
)

func TestGroupStopsAtFirstError(t *testing.T) {
	g, ctx := NewGroup(context.Background())
	boom := errors.New("boom")
	g.Go(func() error { <-ctx.Done(); return nil })
	g.Go(func() error { return boom })
	if err := g.Wait(); !errors.Is(err, boom) {
		t.Fatalf("Wait = %v, want boom", err)
	}
}

func TestLifecycle(t *testing.T) {
	tests := []struct {
		name string
		run  bool
	}{{"never run", false}, {"running", true}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var l Lifecycle
			released := 0
			stopped := make(chan struct{})
			if tt.run {
				ctx, finish, err := l.Start(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if _, _, err := l.Start(context.Background()); !errors.Is(err, ErrRunning) {
					t.Fatalf("second Start = %v", err)
				}
				go func() {
					<-ctx.Done()
					finish()
					close(stopped)
				}()
			}
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() { l.Close(func() { released++ }) })
			}
			wg.Wait()
			if tt.run {
				<-stopped
				if released != 0 {
					t.Fatal("release called for a running process")
				}
			} else if released != 1 {
				t.Fatalf("release called %d times, want 1", released)
			}
			if _, _, err := l.Start(context.Background()); !errors.Is(err, ErrClosed) {
				t.Fatalf("Start after Close = %v", err)
			}
		})
	}
}

func TestEvery(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var calls atomic.Int64
	start := time.Now()
	done := Go(func() error {
		Every(ctx, time.Millisecond, func(now time.Time) {
			if now.Before(start) {
				t.Errorf("tick at %v, before the call at %v", now, start)
			}
			calls.Add(1)
		})
		return nil
	})
	testwait.Eventually(t, 10*time.Second, func() error {
		if n := calls.Load(); n < 3 {
			return fmt.Errorf("%d calls so far, want 3", n)
		}
		return nil
	})
	if done.Exited() {
		t.Fatal("Exited before Every returned")
	}
	cancel()
	select {
	case <-done.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Every still running 10s after its context ended")
	}
	if !done.Exited() {
		t.Fatal("not Exited after Done")
	}
}

func TestWait(t *testing.T) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name string
		ctx  context.Context
		c    func() <-chan time.Time
		want bool
	}{
		{"c delivers", context.Background(), func() <-chan time.Time {
			c := make(chan time.Time, 1)
			c <- time.Now()
			return c
		}, true},
		{"ctx done", canceled, func() <-chan time.Time { return make(chan time.Time) }, false},
		{"timer fires", context.Background(), func() <-chan time.Time { return time.NewTimer(time.Millisecond).C }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Wait(tt.ctx, tt.c()); got != tt.want {
				t.Fatalf("Wait = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestPoll(t *testing.T) {
	t.Parallel()
	busy := errors.New("busy")
	for _, tc := range []struct {
		name    string
		results []error // fn's results in turn; after them fn reports busy, not done
		timeout time.Duration
		want    func(error) bool
		calls   int // the least number of calls
	}{
		{"done at once", []error{nil}, time.Minute, func(err error) bool { return err == nil }, 1},
		{"done after retries", []error{busy, busy, nil}, time.Minute, func(err error) bool { return err == nil }, 3},
		{"deadline keeps the last error", nil, 50 * time.Millisecond, func(err error) bool {
			return errors.Is(err, context.DeadlineExceeded) && errors.Is(err, busy)
		}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), tc.timeout)
			defer cancel()
			calls := 0
			err := Poll(ctx, time.Millisecond, func() (bool, error) {
				calls++
				if calls <= len(tc.results) {
					r := tc.results[calls-1]
					return r == nil, r
				}
				return false, busy
			})
			if !tc.want(err) || calls < tc.calls {
				t.Errorf("Poll = %v after %d calls", err, calls)
			}
		})
	}
}
