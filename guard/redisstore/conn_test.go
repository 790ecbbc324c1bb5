package redisstore

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/redisstore/internal/scriptargs"
	"github.com/tollgate/tollgate/guard/rules"
)

// Tests of the lean call path (conn.go, resp.go): against real
// redis-servers where Redis's behaviour is the point, against a scripted
// fake server where a failure must be produced exactly.

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
// KEYS and ARGV the go-redis path sends.
func TestAppendRESPMatchesBuild(t *testing.T) {
	t.Parallel()
	counters := testCounters("tg{t}")
	cmd, tail := appendScriptCall(nil, "0123456789012345678901234567890123456789", guard.OpCheck, 0, 1000, counters)
	got := decodeCommand(t, cmd)
	keys, args := scriptargs.Strings(guard.OpCheck, 0, 1000, counters)
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

// fakeRedis is a server that reads commands and answers each with what
// answer returns ("" for no answer: a hung Redis).
type fakeRedis struct {
	ln       net.Listener
	answer   func(args []string) string
	commands atomic.Int64
	conns    atomic.Int64
	wg       sync.WaitGroup
	mu       sync.Mutex
	open     []net.Conn
}

func startFake(t *testing.T, answer func(args []string) string) *fakeRedis {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeRedis{ln: ln, answer: answer}
	f.wg.Add(1)
	go f.accept()
	t.Cleanup(func() {
		ln.Close()
		f.mu.Lock()
		for _, c := range f.open {
			c.Close()
		}
		f.mu.Unlock()
		f.wg.Wait()
	})
	return f
}

func (f *fakeRedis) accept() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.conns.Add(1)
		f.mu.Lock()
		f.open = append(f.open, c)
		f.mu.Unlock()
		f.wg.Add(1)
		go f.serve(c)
	}
}

func (f *fakeRedis) serve(c net.Conn) {
	defer f.wg.Done()
	r := bufio.NewReader(c)
	for {
		args, err := readCommand(r)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				c.Close()
			}
			return
		}
		f.commands.Add(1)
		if a := f.answer(args); a != "" {
			if _, err := c.Write([]byte(a)); err != nil {
				return
			}
		}
	}
}

// TestHungRedisNeverRetried: a Redis that reads the call and never
// answers: the call is answered at its deadline with an error that says so,
// and it is never sent again, on this connection or another (Redis may
// have run it: SPEC §7). Later calls each go out once, on a new
// connection.
func TestHungRedisNeverRetried(t *testing.T) {
	t.Parallel()
	fake := startFake(t, func([]string) string { return "" })
	const deadline = 50 * time.Millisecond
	store, _ := leanStore(t, fake.ln.Addr().String(), deadline)
	res := make([]guard.CounterResult, 1)
	for i := range 3 {
		t0 := time.Now()
		_, err := store.Do(context.Background(), guard.OpCheck, 0, oneCounter("tg{hung}"), res)
		took := time.Since(t0)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("call %d: %v, want a deadline error", i, err)
		}
		if took < deadline || took > deadline+500*time.Millisecond {
			t.Fatalf("call %d answered after %v, deadline %v", i, took, deadline)
		}
		if n := fake.commands.Load(); n != int64(i+1) {
			t.Fatalf("after call %d the server read %d commands: a call was sent again", i, n)
		}
	}
	if n := fake.conns.Load(); n != 3 {
		t.Fatalf("%d connections for 3 calls that timed out: a connection whose reply is lost must not be reused", n)
	}
}

// TestBatchDeadlineHoldsForEveryCall: many concurrent calls to a hung
// Redis, more than the goroutines' batches hold at once: every call is
// answered by its deadline plus scheduling slack, none twice.
func TestBatchDeadlineHoldsForEveryCall(t *testing.T) {
	t.Parallel()
	fake := startFake(t, func([]string) string { return "" })
	const deadline = 50 * time.Millisecond
	store, _ := leanStore(t, fake.ln.Addr().String(), deadline, WithBatch(4, 2))
	var wg sync.WaitGroup
	var slowest atomic.Int64
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := make([]guard.CounterResult, 1)
			t0 := time.Now()
			_, err := store.Do(context.Background(), guard.OpCheck, 0, oneCounter(fmt.Sprintf("tg{c%d}", i)), res)
			took := time.Since(t0)
			for {
				s := slowest.Load()
				if int64(took) <= s || slowest.CompareAndSwap(s, int64(took)) {
					break
				}
			}
			// A deadline, or a dial that the deadline cut short.
			if err == nil {
				t.Errorf("call %d decided by a hung Redis", i)
			}
		}()
	}
	wg.Wait()
	if s := time.Duration(slowest.Load()); s > deadline+500*time.Millisecond {
		t.Fatalf("slowest call answered after %v, deadline %v", s, deadline)
	}
	if n := fake.commands.Load(); n > store.Calls() {
		t.Fatalf("server read %d commands for %d calls sent", n, store.Calls())
	}
}
