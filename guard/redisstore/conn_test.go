package redisstore

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/rules"
)

// Tests of the lean call path (conn.go, resp.go): against real
// redis-servers (paused with SIGSTOP for a hung Redis, restarted, flushed);
// the reply parser on its own with byte strings and a fuzz target.

func testCounters(name string) []guard.Counter {
	return []guard.Counter{
		{Name: name + "a", Algorithm: rules.TokenBucket, Params: rules.Params{Limit: 10, FullNum: 10_000_000, FullDen: 1}, Cost: 2, Lease: 3},
		{Name: name + "b", Algorithm: rules.FixedWindow, Params: rules.Params{Limit: 5, Window: 3_600_000_000}, Cost: 1, Shadow: true, Token: "x:1", Return: 1},
	}
}

// oneCounter is a token bucket of 10, each call costing 2.
func oneCounter(name string) []guard.Counter {
	return []guard.Counter{{Name: name, Algorithm: rules.TokenBucket, Params: rules.Params{Limit: 10, FullNum: 10_000_000_000, FullDen: 1}, Cost: 2}}
}

// TestAppendRESPMatchesBuild: the pre-serialised call carries exactly the
// KEYS and ARGV the go-redis path sends, which ScriptArgs gives tools.
func TestAppendRESPMatchesBuild(t *testing.T) {
	t.Parallel()
	counters := testCounters("tg{t}")
	cmd, tail := appendScriptCall(nil, "0123456789012345678901234567890123456789", guard.OpCheck, 0, 1000, counters)
	got := decodeCommand(t, cmd)
	keys, args := ScriptArgs(guard.OpCheck, 0, 1000, counters)
	want := append([]string{"EVALSHA", "0123456789012345678901234567890123456789", strconv.Itoa(len(keys))}, keys...)
	want = append(want, args...)
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("command\n%q\nwant\n%q", got, want)
	}
	eval := decodeCommand(t, appendEval(nil, "return 1", cmd, tail))
	want[0], want[1] = "EVAL", "return 1"
	if strings.Join(eval, "|") != strings.Join(want, "|") {
		t.Fatalf("EVAL\n%q\nwant\n%q", eval, want)
	}
}

func decodeCommand(t *testing.T, b []byte) []string {
	t.Helper()
	args, err := readCommand(bufio.NewReader(strings.NewReader(string(b))))
	if err != nil {
		t.Fatal(err)
	}
	return args
}

// readCommand reads one RESP array of bulk strings, as a server does.
func readCommand(r *bufio.Reader) ([]string, error) {
	rr := replyReader{r: r}
	b, err := rr.line()
	if err != nil {
		return nil, err
	}
	if b[0] != '*' {
		return nil, fmt.Errorf("not an array: %q", b)
	}
	n, _ := parseInt(b[1:])
	args := make([]string, 0, n)
	for range n {
		v, err := rr.elem()
		if err != nil {
			return nil, err
		}
		if v.kind != '$' {
			return nil, fmt.Errorf("not a bulk string: %q", v.kind)
		}
		args = append(args, string(v.s))
	}
	return args, nil
}

// TestScriptReplyShapes: replies of the wrong shape fail their call with
// ErrReply and leave the connection in step; an error reply is the call's
// error; bytes that are not RESP fail the connection.
func TestScriptReplyShapes(t *testing.T) {
	t.Parallel()
	good := "*10\r\n:7\r\n:1\r\n:1\r\n:1\r\n:9\r\n:100\r\n:10\r\n:0\r\n$1\r\n1\r\n:0\r\n"
	for _, tc := range []struct {
		name    string
		reply   string
		callErr error
		fatal   bool
	}{
		{"good", good, nil, false},
		{"short array", "*3\r\n:1\r\n:2\r\n*2\r\n$1\r\nx\r\n:4\r\n", ErrReply, false},
		{"string for a number", strings.Replace(good, ":9\r\n", "$1\r\n9\r\n", 1), ErrReply, false},
		{"number for the token", strings.Replace(good, "$1\r\n1\r\n", ":1\r\n", 1), ErrReply, false},
		{"bulk string", "$3\r\nabc\r\n", ErrReply, false},
		{"integer", ":5\r\n", ErrReply, false},
		{"error", "-ERR user_script:1: boom\r\n", replyError("ERR user_script:1: boom"), false},
		{"not resp", "hello\r\n", nil, true},
		{"cut short", good[:20], nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// The reply, then a good one: read in step, the second parses.
			rr := replyReader{r: bufio.NewReader(strings.NewReader(tc.reply + good))}
			out := make([]guard.CounterResult, 1)
			now, adm, callErr, err := rr.scriptReply(out)
			if tc.fatal {
				if err == nil {
					t.Fatalf("no connection error (call error %v)", callErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !errors.Is(callErr, tc.callErr) && callErr != tc.callErr {
				t.Fatalf("call error %v, want %v", callErr, tc.callErr)
			}
			if tc.callErr == nil {
				want := guard.CounterResult{Allowed: true, Charged: true, Remaining: 9, ResetAfter: 100, NextAfter: 10, Token: "1"}
				if now != 7 || !adm || out[0] != want {
					t.Fatalf("now %d admitted %v %+v", now, adm, out[0])
				}
			}
			if _, _, callErr, err := rr.scriptReply(out); err != nil || callErr != nil {
				t.Fatalf("the next reply: %v %v", callErr, err)
			}
		})
	}
}

// TestNoScriptFallsBackToEval: a Redis that lost its scripts (restarted,
// flushed) refuses EVALSHA with NOSCRIPT without running it; the call is
// sent again as EVAL, within its deadline, and decides once.
func TestNoScriptFallsBackToEval(t *testing.T) {
	t.Parallel()
	srv := redistest.StartTB(t)
	store, admin := leanStore(t, srv.Addr(), time.Second)
	ctx := context.Background()
	counters := oneCounter("tg{ns}")
	res := make([]guard.CounterResult, 1)
	for i := range 3 {
		if i == 2 {
			if err := admin.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := store.Do(ctx, guard.OpCheck, 0, counters, res); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if want := int64(10 - 2*(i+1)); res[0].Remaining != want {
			t.Fatalf("call %d: remaining %d, want %d: charged once per call", i, res[0].Remaining, want)
		}
	}
	stats := admin.Info(ctx, "commandstats").Val()
	// The first call and the call after the flush: EVALSHA refused, EVAL.
	for cmd, want := range map[string]string{"evalsha": "calls=3", "eval": "calls=2"} {
		if !strings.Contains(stats, "cmdstat_"+cmd+":"+want+",") {
			t.Errorf("%s: want %s in\n%s", cmd, want, stats)
		}
	}
	if n := store.Calls(); n != 3 {
		t.Errorf("Calls() = %d for 3 calls", n)
	}
}

// TestAuthAndSelect: the lean connections authenticate and select the
// configured database, as go-redis's would.
func TestAuthAndSelect(t *testing.T) {
	t.Parallel()
	srv := redistest.StartTB(t)
	admin := srv.Client()
	defer admin.Close()
	if err := admin.ConfigSet(context.Background(), "requirepass", "s3cret").Err(); err != nil {
		t.Fatal(err)
	}
	client, err := NewClient(Config{Addrs: []string{srv.Addr()}, Password: "s3cret", DB: 3, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	store := New(client, WithTimeout(time.Second))
	t.Cleanup(func() { store.Close() })
	if store.wire == nil {
		t.Fatal("a standalone client does not take the lean path")
	}
	res := make([]guard.CounterResult, 1)
	if _, err := store.Do(context.Background(), guard.OpCheck, 0, oneCounter("tg{auth}"), res); err != nil {
		t.Fatal(err)
	}
	if n, err := client.Exists(context.Background(), "tg{auth}").Result(); err != nil || n != 1 {
		t.Fatalf("counter in db 3: %d (%v)", n, err)
	}
	bad, err := NewClient(Config{Addrs: []string{srv.Addr()}, Password: "wrong", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bad.Close() })
	badStore := New(bad, WithTimeout(time.Second))
	t.Cleanup(func() { badStore.Close() })
	if _, err := badStore.Do(context.Background(), guard.OpCheck, 0, oneCounter("tg{auth}"), res); err == nil {
		t.Fatal("a wrong password decided")
	}
}

// TestStaleConnectionAfterRestart: a connection Redis closed while it sat
// idle is found closed before it is used (idle check set to every batch
// here), so the first call after a restart is decided, not failed.
func TestStaleConnectionAfterRestart(t *testing.T) {
	t.Parallel()
	srv := redistest.StartTB(t)
	store, _ := leanStore(t, srv.Addr(), time.Second, WithBatch(1, 1))
	store.idle = 0
	ctx := context.Background()
	res := make([]guard.CounterResult, 1)
	if _, err := store.Do(ctx, guard.OpCheck, 0, oneCounter("tg{st}"), res); err != nil {
		t.Fatal(err)
	}
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Do(ctx, guard.OpCheck, 0, oneCounter("tg{st}"), res); err != nil {
		t.Fatalf("first call after the restart: %v", err)
	}
	if res[0].Remaining != 8 {
		t.Fatalf("remaining %d after an empty restart, want 8", res[0].Remaining)
	}
}

func leanStore(t *testing.T, addr string, timeout time.Duration, opts ...Option) (*Store, redis.UniversalClient) {
	t.Helper()
	client, err := NewClient(Config{Addrs: []string{addr}, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	store := New(client, append([]Option{WithTimeout(timeout)}, opts...)...)
	t.Cleanup(func() { store.Close() })
	if store.wire == nil {
		t.Fatal("a standalone client does not take the lean path")
	}
	return store, client
}

// peekRemaining reads a counter's remaining units through store without
// charging it.
func peekRemaining(t *testing.T, store *Store, counters []guard.Counter) int64 {
	t.Helper()
	res := make([]guard.CounterResult, len(counters))
	if _, err := store.Do(context.Background(), guard.OpPeek, 0, counters, res); err != nil {
		t.Fatalf("peek: %v", err)
	}
	return res[0].Remaining
}

// windowCounter is a check of one fixed-window counter (10 an hour, cost
// 1), whose units windowCount reads.
func windowCounter(name string) []guard.Counter {
	return []guard.Counter{{Name: name, Algorithm: rules.FixedWindow, Params: rules.Params{Limit: 10, Window: 3_600_000_000}, Cost: 1}}
}

// windowCount reads the units a fixed-window counter holds straight from
// Redis (lua/fixed_window.lua: field c), bypassing the store and its
// circuit breaker.
func windowCount(t *testing.T, admin redis.UniversalClient, key string) int64 {
	t.Helper()
	v, err := admin.HGet(context.Background(), key, "c").Int64()
	if errors.Is(err, redis.Nil) {
		return 0
	}
	if err != nil {
		t.Fatalf("HGET %s c: %v", key, err)
	}
	return v
}

// TestHungRedisNeverRetried: a real Redis, paused (SIGSTOP) after the
// script is loaded, reads nothing and answers nothing. Each call is
// answered at its deadline with an error that says so. After the resume,
// Redis runs whatever was left in its sockets: each timed-out call at most
// once (never sent again: Redis may have run it), and the next
// call reads its own reply, not a late one of a timed-out call (a
// connection whose reply is lost is never reused).
func TestHungRedisNeverRetried(t *testing.T) {
	t.Parallel()
	srv := redistest.StartTB(t)
	const deadline = 100 * time.Millisecond
	store, admin := leanStore(t, srv.Addr(), deadline, WithBatch(64, 1))
	ctx := context.Background()
	// One connection, the script loaded: the hung calls go out as EVALSHA
	// on a connection that worked.
	hung := windowCounter("tg{hung}")
	if got := peekRemaining(t, store, hung); got != 9 {
		t.Fatalf("a peek of cost 1 before any call: remaining %d, want 9", got)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	res := make([]guard.CounterResult, 1)
	const calls = 3
	for i := range calls {
		t0 := time.Now()
		_, err := store.Do(ctx, guard.OpCheck, 0, hung, res)
		took := time.Since(t0)
		if !errors.Is(err, context.DeadlineExceeded) {
			srv.Resume()
			t.Fatalf("call %d: %v, want a deadline error", i, err)
		}
		if took < deadline-5*time.Millisecond || took > deadline+500*time.Millisecond {
			srv.Resume()
			t.Fatalf("call %d answered after %v, deadline %v", i, took, deadline)
		}
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	// The next call, on another counter: had a connection been reused,
	// it would read a hung call's late reply (remaining 9, 8 or 7).
	other := []guard.Counter{{Name: "tg{other}", Algorithm: rules.FixedWindow, Params: rules.Params{Limit: 10, Window: 3_600_000_000}, Cost: 4}}
	if _, err := store.Do(ctx, guard.OpCheck, 0, other, res); err != nil {
		t.Fatalf("first call after the resume: %v", err)
	}
	if res[0].Remaining != 6 {
		t.Fatalf("first call after the resume read remaining %d, want 6: a late reply was taken for its own", res[0].Remaining)
	}
	// Every EVALSHA Redis will ever run has arrived by now (the store
	// sends nothing more); each hung call ran at most once.
	if got := windowCount(t, admin, "tg{hung}"); got > calls {
		t.Fatalf("%d units charged by %d timed-out calls of cost 1: a call was sent again", got, calls)
	}
	stats := admin.Info(ctx, "commandstats").Val()
	if n := commandCalls(stats, "evalsha") + commandCalls(stats, "eval"); n > 3+calls {
		t.Fatalf("Redis ran %d scripts for %d calls (2 peeks, %d hung, 1 after):\n%s", n, 3+calls, calls, stats)
	}
}

// commandCalls returns the calls of cmd in INFO commandstats.
func commandCalls(stats, cmd string) int64 {
	_, after, ok := strings.Cut(stats, "cmdstat_"+cmd+":calls=")
	if !ok {
		return 0
	}
	n, _ := strconv.ParseInt(after[:strings.IndexByte(after, ',')], 10, 64)
	return n
}

// TestBatchDeadlineHoldsForEveryCall: many concurrent calls to a paused
// Redis, more than the goroutines' batches hold at once: every call is
// answered by its deadline plus scheduling slack, none decided, and after
// the resume none has been charged twice.
func TestBatchDeadlineHoldsForEveryCall(t *testing.T) {
	t.Parallel()
	srv := redistest.StartTB(t)
	const deadline = 100 * time.Millisecond
	store, admin := leanStore(t, srv.Addr(), deadline, WithBatch(4, 2))
	counter := func(i int) []guard.Counter {
		return windowCounter(fmt.Sprintf("tg{c%d}", i))
	}
	peekRemaining(t, store, counter(-1)) // the script loaded
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	const callers = 64
	var wg sync.WaitGroup
	var slowest atomic.Int64
	var decided atomic.Int64
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := make([]guard.CounterResult, 1)
			t0 := time.Now()
			_, err := store.Do(context.Background(), guard.OpCheck, 0, counter(i), res)
			took := time.Since(t0)
			for {
				s := slowest.Load()
				if int64(took) <= s || slowest.CompareAndSwap(s, int64(took)) {
					break
				}
			}
			if err == nil {
				decided.Add(1)
			}
		}()
	}
	wg.Wait()
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	if n := decided.Load(); n > 0 {
		t.Errorf("%d calls decided by a paused Redis", n)
	}
	if s := time.Duration(slowest.Load()); s > deadline+500*time.Millisecond {
		t.Errorf("slowest call answered after %v, deadline %v", s, deadline)
	}
	// Every connection the store opened is closed by now; what Redis runs
	// after the resume is what was sent, once.
	sent := int64(0)
	for i := range callers {
		n := windowCount(t, admin, fmt.Sprintf("tg{c%d}", i))
		if n > 1 {
			t.Fatalf("counter %d: %d units charged by one timed-out call of cost 1: sent again", i, n)
		}
		sent += n
	}
	t.Logf("%d of %d timed-out calls reached Redis (the rest were refused by the breaker or expired in the queue)", sent, callers)
}

// FuzzScriptReply: whatever bytes arrive, the reply reader neither panics
// nor allocates beyond its bulk-string cap; a call error leaves it in step
// and a connection error ends the reading.
func FuzzScriptReply(f *testing.F) {
	good := "*10\r\n:7\r\n:1\r\n:1\r\n:1\r\n:9\r\n:100\r\n:10\r\n:0\r\n$1\r\n1\r\n:0\r\n"
	for _, s := range []string{good, good + good, "-NOSCRIPT x\r\n", "*1\r\n*1\r\n*1\r\n:1\r\n", "$99999999999\r\n", "*-1\r\n", "$-1\r\n", ":-\r\n", "*3\r\n$2\r\nab\r\n"} {
		f.Add([]byte(s), uint8(1))
	}
	f.Fuzz(func(t *testing.T, b []byte, n uint8) {
		rr := replyReader{r: bufio.NewReaderSize(strings.NewReader(string(b)), 64)}
		out := make([]guard.CounterResult, int(n%4))
		for range 16 {
			_, _, _, err := rr.scriptReply(out)
			if err != nil {
				return
			}
		}
	})
}
