package testnet_test

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testnet"
)

func TestFreeAddrIsFreeLoopback(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		addr func(testing.TB) string
	}{
		{"FreeAddr", testnet.FreeAddr},
		{"FreePort", func(t testing.TB) string { return "127.0.0.1:" + strconv.Itoa(testnet.FreePort(t)) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			addr := tt.addr(t)
			host, port, err := net.SplitHostPort(addr)
			if err != nil || host != "127.0.0.1" || port == "0" {
				t.Fatalf("address %q (%v): want 127.0.0.1 and a port", addr, err)
			}
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				t.Fatalf("listen on %s: %v", addr, err)
			}
			_ = ln.Close()
		})
	}
}

func TestPort(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		addr string
		port int
		msg  string // of the failure; "" for none
	}{
		{"127.0.0.1:8080", 8080, ""},
		{"[::1]:9092", 9092, ""},
		{"localhost:0", 0, ""},
		{"127.0.0.1", 0, "missing port"},
		{"127.0.0.1:http", 0, "port of 127.0.0.1:http"},
	} {
		t.Run(tt.addr, func(t *testing.T) {
			t.Parallel()
			var port int
			msg := testnet.RecordFatal(t, func(tb testing.TB) { port = testnet.Port(tb, tt.addr) })
			if port != tt.port || (tt.msg == "") != (msg == "") || !strings.Contains(msg, tt.msg) {
				t.Fatalf("Port(%q) = %d, failure %q; want %d, failure %q", tt.addr, port, msg, tt.port, tt.msg)
			}
		})
	}
}

func TestBufferConcurrentWriters(t *testing.T) {
	t.Parallel()
	var b testnet.Buffer
	var wg sync.WaitGroup
	const writers, lines = 4, 50
	for w := range writers {
		wg.Go(func() {
			for i := range lines {
				fmt.Fprintf(&b, "w%d %d\n", w, i)
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if got := strings.Count(b.String(), "\n"); got != writers*lines {
		t.Fatalf("%d lines, want %d", got, writers*lines)
	}
}

// TestListen: the listener is on loopback, holds its port (a second bind
// fails) and is closed by the test's cleanup (the port binds again).
func TestListen(t *testing.T) {
	t.Parallel()
	tb := &cleanupTB{TB: t}
	ln := testnet.Listen(tb)
	addr := ln.Addr().String()
	if host, _, err := net.SplitHostPort(addr); err != nil || host != "127.0.0.1" {
		t.Fatalf("address %q (%v): want 127.0.0.1", addr, err)
	}
	if again, err := net.Listen("tcp", addr); err == nil {
		_ = again.Close()
		t.Fatalf("%s bound twice: Listen does not hold it", addr)
	}
	if len(tb.cleanups) != 1 {
		t.Fatalf("%d cleanups registered, want 1", len(tb.cleanups))
	}
	tb.cleanups[0]()
	again, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("after the cleanup: %v", err)
	}
	_ = again.Close()
}

// cleanupTB records what Start and Listen ask of a test: its cleanups
// and its failures.
type cleanupTB struct {
	testing.TB
	cleanups []func()
	errs     []string
}

func (c *cleanupTB) Cleanup(f func()) { c.cleanups = append(c.cleanups, f) }

func (c *cleanupTB) Errorf(format string, args ...any) {
	c.errs = append(c.errs, fmt.Sprintf(format, args...))
}

func (c *cleanupTB) Error(args ...any) { c.errs = append(c.errs, fmt.Sprint(args...)) }

func TestRunUntilCleanup(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		err     error // what run returns once its context ends
		wantErr string
	}{
		{"clean stop", nil, ""},
		{"failed stop", errors.New("boom"), "srv: Run: boom"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb := &cleanupTB{TB: t}
			started := make(chan context.Context, 1)
			testnet.RunUntilCleanup(tb, "srv", func(ctx context.Context) error {
				started <- ctx
				<-ctx.Done()
				return tt.err
			})
			ctx := <-started
			if ctx.Err() != nil {
				t.Fatal("run's context ended before the test did")
			}
			if len(tb.cleanups) != 1 {
				t.Fatalf("%d cleanups registered, want 1", len(tb.cleanups))
			}
			tb.cleanups[0]()
			if ctx.Err() == nil {
				t.Fatal("the cleanup did not cancel run's context")
			}
			if got := strings.Join(tb.errs, "; "); got != tt.wantErr {
				t.Fatalf("failures %q, want %q", got, tt.wantErr)
			}
		})
	}
}

// TestStartStop: Stop ends run's context and hands the test run's error,
// which the cleanup then does not report again; Cancel only ends the
// context, Done and Wait say when run returned and with what.
func TestStartStop(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		err       error // what run returns once its context ends
		cancel    bool  // Cancel and wait on Done first
		stop      bool  // the test calls Stop
		stopNow   bool  // the test calls StopNow
		wantStop  string
		wantClean string // what the cleanup reports
	}{
		{"stop, clean", nil, false, true, false, "", ""},
		{"stop, failed", errors.New("boom"), false, true, false, "srv: Run: boom", ""},
		{"stop now, failed", errors.New("boom"), false, false, true, "srv: Run: boom", ""},
		{"stop now, clean", nil, false, false, true, "", ""},
		{"cancel then stop", errors.New("boom"), true, true, false, "srv: Run: boom", ""},
		{"cancel, cleanup reports", errors.New("boom"), true, false, false, "", "srv: Run: boom"},
		{"cleanup only", errors.New("boom"), false, false, false, "", "srv: Run: boom"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb := &cleanupTB{TB: t}
			r := testnet.Start(tb, "srv", func(ctx context.Context) error {
				<-ctx.Done()
				return tt.err
			})
			select {
			case <-r.Done():
				t.Fatal("run returned before its context ended")
			default:
			}
			if tt.cancel {
				r.Cancel()
				<-r.Done()
				if err := r.Wait(); !errors.Is(err, tt.err) {
					t.Fatalf("Wait: %v, want %v", err, tt.err)
				}
			}
			if tt.stopNow {
				rec := &cleanupTB{TB: t}
				r.StopNow(rec)
				if got := strings.Join(rec.errs, "; "); got != tt.wantStop {
					t.Fatalf("StopNow failed the test with %q, want %q", got, tt.wantStop)
				}
			}
			if tt.stop {
				for range 2 {
					got := ""
					if err := r.Stop(); err != nil {
						got = err.Error()
					}
					if got != tt.wantStop {
						t.Fatalf("Stop: %q, want %q", got, tt.wantStop)
					}
				}
			}
			if len(tb.cleanups) != 1 {
				t.Fatalf("%d cleanups registered, want 1", len(tb.cleanups))
			}
			tb.cleanups[0]()
			if got := strings.Join(tb.errs, "; "); got != tt.wantClean {
				t.Fatalf("cleanup reported %q, want %q", got, tt.wantClean)
			}
		})
	}
}

// TestServe: each connection reaches handle (or is held open with none);
// the cleanup closes the listener and every connection, so a handle
// blocked reading returns and a client sees its connection end.
func TestServe(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		handle func(net.Conn)
		want   string // what the client reads back after writing "ping\n"
	}{
		{"echo", func(c net.Conn) { _, _ = io.Copy(c, c) }, "ping\n"},
		{"held open", nil, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ln := testnet.Listen(t)
			tb := &cleanupTB{TB: t}
			testnet.Serve(tb, ln, tt.handle)
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil { // fail, not hang
				t.Fatal(err)
			}
			if _, err := io.WriteString(c, "ping\n"); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(tt.want))
			if _, err := io.ReadFull(c, got); err != nil || string(got) != tt.want {
				t.Fatalf("read %q, %v; want %q", got, err, tt.want)
			}
			if len(tb.cleanups) != 1 {
				t.Fatalf("%d cleanups registered, want 1", len(tb.cleanups))
			}
			cleaned := make(chan struct{})
			go func() { tb.cleanups[0](); close(cleaned) }()
			select { // it returns once the accept loop and handle have
			case <-cleaned:
			case <-time.After(10 * time.Second):
				t.Fatal("the cleanup did not return: a connection is still open")
			}
			var ne net.Error
			if _, err := c.Read(make([]byte, 1)); err == nil || errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("the connection is still open after the cleanup (read: %v)", err)
			}
			if _, err := net.Dial("tcp", ln.Addr().String()); err == nil {
				t.Fatal("the listener still accepts after the cleanup")
			}
		})
	}
}

func TestFirstDiff(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, a, b string
		line       int
		x, y       string
	}{
		{"same", "a\nb", "a\nb", 0, "", ""},
		{"second line", "a\nb\nc", "a\nB\nc", 2, "b", "B"},
		{"b longer", "a", "a\nb", 2, testnet.NoLine, "b"},
		{"a longer: a trailing newline", "a\nb\n", "a\nb", 3, "", testnet.NoLine},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			line, x, y := testnet.FirstDiff(tt.a, tt.b)
			if line != tt.line || x != tt.x || y != tt.y {
				t.Fatalf("FirstDiff = %d %q %q, want %d %q %q", line, x, y, tt.line, tt.x, tt.y)
			}
		})
	}
}

func TestGolden(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, tt := range []struct {
		name    string
		file    string // the file's text before; "-": none
		update  bool
		wantMsg string // "": passes
		after   string // the file's text after
	}{
		{"same", "a\nb\n", false, "", "a\nb\n"},
		{"stale", "a\nc\n", false, "first difference at line 2):\n have \"c\"\n want \"b\"\nrun make regen", "a\nc\n"},
		{"missing", "-", false, "run make regen", "-"},
		{"update", "a\nc\n", true, "", "a\nb\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "_"))
			if tt.file != "-" {
				if err := os.WriteFile(path, []byte(tt.file), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			msg := testnet.RecordFatal(t, func(tb testing.TB) {
				testnet.Golden(tb, path, []byte("a\nb\n"), tt.update, "make regen")
			})
			if tt.wantMsg == "" && msg != "" || !strings.Contains(msg, tt.wantMsg) {
				t.Fatalf("failed with %q, want %q", msg, tt.wantMsg)
			}
			after, err := os.ReadFile(path)
			if tt.after == "-" && err == nil || tt.after != "-" && string(after) != tt.after {
				t.Fatalf("file after: %q, %v; want %q", after, err, tt.after)
			}
		})
	}
}

// TestConstValues: every constant given a value, in source order, grouped
// or not; a constant of an iota group without its own value, variables and
// functions are not.
func TestConstValues(t *testing.T) {
	t.Parallel()
	const src = `package p
const A = "a"
const (
	B, C = 1, "c"
	D = iota
	E
)
var V = "v"
func F() { const Inner = 1 }
`
	f, err := parser.ParseFile(token.NewFileSet(), "p.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	testnet.ConstValues(f, func(name string, value ast.Expr) {
		got = append(got, fmt.Sprintf("%s=%s", name, types.ExprString(value)))
	})
	if want := []string{`A="a"`, "B=1", `C="c"`, "D=iota"}; !slices.Equal(got, want) {
		t.Fatalf("ConstValues = %q, want %q", got, want)
	}
}

// TestNumbered: the i-th string is format with i, in order; none for 0.
func TestNumbered(t *testing.T) {
	t.Parallel()
	if got, want := testnet.Numbered("key-%03d", 3), []string{"key-000", "key-001", "key-002"}; !slices.Equal(got, want) {
		t.Errorf("Numbered(key-%%03d, 3) = %q, want %q", got, want)
	}
	if got := testnet.Numbered("r%d\n", 0); len(got) != 0 {
		t.Errorf("Numbered(r%%d, 0) = %q, want none", got)
	}
}

// TestEnvFile: names in order and their values, blank lines and comments
// skipped, a value keeping its own '='; a line that is not NAME=value
// fails the test.
func TestEnvFile(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, file string
		names      []string
		values     map[string]string
		fails      string
	}{
		{"names and values", "# a comment\nB=2\n\n  A=x=y  \nC=\n", []string{"B", "A", "C"}, map[string]string{"A": "x=y", "B": "2", "C": ""}, ""},
		{"empty", "\n# only a comment\n", nil, map[string]string{}, ""},
		{"not NAME=value", "A=1\njunk\n", nil, nil, `"junk" is not NAME=value`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "x.env")
			if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
				t.Fatal(err)
			}
			var names []string
			var values map[string]string
			msg := testnet.RecordFatal(t, func(tb testing.TB) { names, values = testnet.EnvFile(tb, path) })
			if tc.fails != "" {
				if !strings.Contains(msg, tc.fails) {
					t.Fatalf("EnvFile failed with %q, want it to say %q", msg, tc.fails)
				}
				return
			}
			if msg != "" || !slices.Equal(names, tc.names) || !maps.Equal(values, tc.values) {
				t.Fatalf("EnvFile = %q %q (failure %q), want %q %q", names, values, msg, tc.names, tc.values)
			}
		})
	}
}
