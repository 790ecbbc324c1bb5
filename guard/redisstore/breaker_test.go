package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/breaker"
	"github.com/tollgate/tollgate/guard/internal/guardtest"
	"github.com/tollgate/tollgate/guard/redisstore"
	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/internal/testnet"
)

func fixedWindow(name string) []guard.Counter {
	return []guard.Counter{{Name: name, Algorithm: rules.FixedWindow, Params: rules.Params{Limit: 1000, Window: 3_600_000_000}, Cost: 1}}
}

// TestBreakerOpensAndRecovers drives a store's breaker on a breaker clock
// of its own against a real redis-server: killed, the node's calls fail
// until the breaker opens; then calls fail at once with ErrBreakerOpen and
// send nothing; after OpenFor one probe goes out, fails while Redis is
// down, and closes the breaker once Redis is back (empty: every counter
// starts full). Outcomes counts the answered calls and the failed ones,
// and neither the calls the open breaker refused.
func TestBreakerOpensAndRecovers(t *testing.T) {
	t.Parallel()
	srv := redistest.StartTB(t)
	client := guardtest.RedisClient(t, redisstore.Config{Addrs: []string{srv.Addr()}, Timeout: time.Second})
	var clock atomic.Int64
	var mu sync.Mutex
	var changes []string
	store := redisstore.New(client, redisstore.WithTimeout(time.Second),
		redisstore.WithBreaker(breaker.Config{Clock: clock.Load}),
		redisstore.WithOnBreakerChange(func(node string, from, to breaker.State) {
			mu.Lock()
			defer mu.Unlock()
			changes = append(changes, fmt.Sprintf("%s %v>%v", node, from, to))
		}))
	t.Cleanup(func() { store.Close() })
	ctx := context.Background()
	res := make([]guard.CounterResult, 1)
	do := func() error {
		_, err := store.Do(ctx, guard.OpCheck, 0, fixedWindow("tg{t}x"), res)
		return err
	}
	outcomes := func(wantAnswered, wantFailed uint64) {
		t.Helper()
		if a, f := store.Outcomes(); a != wantAnswered || f != wantFailed {
			t.Fatalf("outcomes: %d answered, %d failed; want %d, %d", a, f, wantAnswered, wantFailed)
		}
	}
	for range 3 {
		if err := do(); err != nil {
			t.Fatal(err)
		}
	}
	outcomes(3, 0)
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	failures := 0
	for ; ; failures++ {
		err := do()
		if errors.Is(err, redisstore.ErrBreakerOpen) {
			break
		}
		if err == nil || failures > breaker.DefaultConsecutiveFailures {
			t.Fatalf("call %d after the kill: %v", failures, err)
		}
	}
	if failures != breaker.DefaultConsecutiveFailures {
		t.Fatalf("breaker opened after %d failures, want %d", failures, breaker.DefaultConsecutiveFailures)
	}
	outcomes(3, breaker.DefaultConsecutiveFailures)
	calls := store.Calls()
	for range 1000 {
		if err := do(); !errors.Is(err, redisstore.ErrBreakerOpen) || !errors.Is(err, guard.ErrUnavailable) {
			t.Fatalf("while open: %v", err)
		}
	}
	if n := store.Calls() - calls; n != 0 {
		t.Fatalf("%d scripts sent while the breaker was open", n)
	}
	clock.Add(int64(breaker.DefaultOpenFor))
	if err := do(); err == nil || errors.Is(err, redisstore.ErrBreakerOpen) {
		t.Fatalf("probe with Redis down: %v", err)
	}
	if err := do(); !errors.Is(err, redisstore.ErrBreakerOpen) {
		t.Fatalf("after a failed probe: %v", err)
	}
	if n := store.Calls() - calls; n != 1 {
		t.Fatalf("%d scripts sent for one probe", n)
	}
	outcomes(3, breaker.DefaultConsecutiveFailures+1)
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	clock.Add(int64(breaker.DefaultOpenFor))
	if err := do(); err != nil {
		t.Fatalf("probe with Redis back: %v", err)
	}
	outcomes(4, breaker.DefaultConsecutiveFailures+1)
	// Restarted empty: the counter is full again (limit 1000, 1 used).
	if res[0].Remaining != 999 {
		t.Fatalf("remaining %d after an empty restart, want 999", res[0].Remaining)
	}
	if st := store.BreakerStates(); len(st) != 1 || st[0].Node != srv.Addr() || st[0].State != breaker.Closed {
		t.Fatalf("breaker states %+v", st)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"closed>open", "open>half_open", "half_open>open", "open>half_open", "half_open>closed"}
	if len(changes) != len(want) {
		t.Fatalf("changes %q", changes)
	}
	for i, w := range want {
		if changes[i] != srv.Addr()+" "+w {
			t.Fatalf("change %d: %q, want %q", i, changes[i], w)
		}
	}
}

// TestScriptErrorsKeepBreakerClosed: error replies to the script itself
// (here an unknown algorithm) show a live node and never open its breaker;
// Outcomes counts them answered.
func TestScriptErrorsKeepBreakerClosed(t *testing.T) {
	t.Parallel()
	srv := redistest.StartTB(t)
	client := guardtest.RedisClient(t, redisstore.Config{Addrs: []string{srv.Addr()}, Timeout: time.Second})
	store := redisstore.New(client, redisstore.WithTimeout(time.Second), redisstore.WithBatch(1, 0))
	t.Cleanup(func() { store.Close() })
	bad := fixedWindow("tg{t}bad")
	bad[0].Algorithm = "no_such_algorithm"
	res := make([]guard.CounterResult, 1)
	for i := range 50 {
		_, err := store.Do(context.Background(), guard.OpCheck, 0, bad, res)
		if err == nil || errors.Is(err, redisstore.ErrBreakerOpen) {
			t.Fatalf("bad call %d: %v", i, err)
		}
	}
	if _, err := store.Do(context.Background(), guard.OpCheck, 0, fixedWindow("tg{t}good"), res); err != nil {
		t.Fatalf("good call after script errors: %v", err)
	}
	if st := store.BreakerStates(); st[0].State != breaker.Closed {
		t.Fatalf("breaker %v after script errors", st[0].State)
	}
	if a, f := store.Outcomes(); a != 51 || f != 0 {
		t.Fatalf("outcomes: %d answered, %d failed; want 51, 0", a, f)
	}
}

// TestInvalidBreakerConfigUsesDefaults: New cannot fail, so an invalid
// breaker configuration falls back to the defaults (and is logged).
func TestInvalidBreakerConfigUsesDefaults(t *testing.T) {
	t.Parallel()
	client := guardtest.RedisClient(t, redisstore.Config{Addrs: []string{"127.0.0.1:1"}})
	store := redisstore.New(client, redisstore.WithBreaker(breaker.Config{FailureRatio: 2}))
	t.Cleanup(func() { store.Close() })
	if st := store.BreakerStates(); len(st) != 1 || st[0].Node != "127.0.0.1:1" || st[0].State != breaker.Closed {
		t.Fatalf("breaker states %+v", st)
	}
}

// TestBreakerOpenLogSaysForHowLong: the warning of an opening breaker
// gives the time it stays open, defaults applied, not the zero of an
// unset field.
func TestBreakerOpenLogSaysForHowLong(t *testing.T) {
	t.Parallel()
	client := guardtest.RedisClient(t, redisstore.Config{Addrs: []string{"127.0.0.1:1"}, Timeout: time.Second})
	tests := []struct {
		name string
		cfg  breaker.Config
		want string
	}{
		{"defaults", breaker.Config{}, "open_for=500ms"},
		{"configured", breaker.Config{OpenFor: 2 * time.Second}, "open_for=2s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var logs testnet.Buffer
			store := redisstore.New(client, redisstore.WithTimeout(time.Second), redisstore.WithBreaker(tt.cfg),
				redisstore.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
			t.Cleanup(func() { store.Close() })
			res := make([]guard.CounterResult, 1)
			for i := 0; i <= breaker.DefaultConsecutiveFailures; i++ {
				_, _ = store.Do(context.Background(), guard.OpCheck, 0, fixedWindow("tg{t}log"), res)
			}
			line := ""
			for l := range strings.SplitSeq(logs.String(), "\n") {
				if strings.Contains(l, "redis circuit breaker open") {
					line = l
				}
			}
			if !strings.Contains(line, tt.want) {
				t.Fatalf("the breaker's opening was logged as %q, want %s", line, tt.want)
			}
		})
	}
}
