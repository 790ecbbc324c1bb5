// Package testnet holds what tests need around processes and servers:
// loopback addresses nothing listens on and listeners held for a test, a
// buffer several goroutines (a process's stdout and stderr, a logger) may
// write to while the test reads it, a server's Run kept going until the
// test ends or stops it, a listener's connections kept going until the
// test ends, the variables of an env file a process is started with, and,
// for tests that read the source tree, the module's root directory,
// generated files held to what generates them and the constants a source
// file declares.
package testnet

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/token"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// FreeAddr returns a loopback address ("127.0.0.1:port") nothing listens
// on right now: for a server that is down, or one a test starts on a port
// it must know in advance. Another process may take the port before the
// test does; callers that bind it retry or accept that.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testnet: find a free port: %v", err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatalf("testnet: release %s: %v", addr, err)
	}
	return addr
}

// Listen returns a listener on a free loopback port, closed when the
// test ends: for a server the test serves on it, or a port a test needs
// held (a bind that must fail, a peer that accepts and never answers).
func Listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testnet: listen: %v", err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln
}

// FreePort is FreeAddr's port.
func FreePort(t testing.TB) int {
	t.Helper()
	return Port(t, FreeAddr(t))
}

// Port returns the port of a host:port address; an address of another
// form fails the test.
func Port(t testing.TB, addr string) int {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("testnet: %v", err)
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatalf("testnet: port of %s: %v", addr, err)
	}
	return n
}

// Buffer is a bytes.Buffer safe for concurrent use: writers (a process's
// output, a logger) and a test reading what they wrote. The zero value is
// ready to use.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// stopTimeout is how long Start's Stop and cleanup wait for run to
// return once its context is canceled.
const stopTimeout = 30 * time.Second

// RunUntilCleanup calls run (a server's Run) on a goroutine, with a
// context the test's cleanup cancels; the cleanup then waits for run to
// return and fails the test, naming the server name, when it returns an
// error or has not returned within 30 s. (Start, for a test that also
// stops the server itself.)
func RunUntilCleanup(t testing.TB, name string, run func(context.Context) error) {
	Start(t, name, run)
}

// Running is a server's Run that Start started.
type Running struct {
	name    string
	cancel  context.CancelFunc
	done    chan struct{}
	err     error // run's, once done is closed
	stop    sync.Once
	stopErr error
	told    atomic.Bool // Stop was called: the test has the error
}

// Start calls run (a server's Run) on a goroutine, with a context that
// Stop or Cancel, or else the test's cleanup, cancels. The cleanup waits
// for run to return and fails the test, naming the server name, when run
// returned an error or has not returned within 30 s, unless the test
// called Stop and so was given that error itself.
func Start(t testing.TB, name string, run func(context.Context) error) *Running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &Running{name: name, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = run(ctx)
	}()
	t.Cleanup(func() {
		if err := r.halt(); err != nil && !r.told.Load() {
			t.Errorf("%s", err)
		}
	})
	return r
}

// Cancel ends run's context without waiting for run to return (Done
// says when it has).
func (r *Running) Cancel() { r.cancel() }

// Done is closed once run has returned.
func (r *Running) Done() <-chan struct{} { return r.done }

// Wait waits for run to return, unbounded (after Done, at once), and
// returns its error.
func (r *Running) Wait() error {
	<-r.done
	return r.err
}

// Stop ends run's context, waits for run to return and returns its error
// ("name: Run: …"), or an error when run has not returned within 30 s.
// Later calls return the same.
func (r *Running) Stop() error {
	r.told.Store(true)
	return r.halt()
}

// StopNow is Stop for a test that stops the server before it ends, as
// the cleanup would: the test fails (Error) on Stop's error.
func (r *Running) StopNow(t testing.TB) {
	t.Helper()
	if err := r.Stop(); err != nil {
		t.Error(err)
	}
}

func (r *Running) halt() error {
	r.stop.Do(func() {
		r.cancel()
		select {
		case <-r.done:
			if r.err != nil {
				r.stopErr = fmt.Errorf("%s: Run: %w", r.name, r.err)
			}
		case <-time.After(stopTimeout):
			r.stopErr = fmt.Errorf("%s: Run did not return within %v of its context's end", r.name, stopTimeout)
		}
	})
	return r.stopErr
}

// Serve accepts connections on ln until the test ends, handing each to
// handle on a goroutine of its own (nil: held open, never answered, as a
// host that hangs). The test's cleanup closes ln and every connection
// accepted, then waits for the accept loop and every handle to return.
func Serve(t testing.TB, ln net.Listener, handle func(net.Conn)) {
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		conns  []net.Conn
		closed bool
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			if closed { // accepted as the cleanup ran: it will not see c
				mu.Unlock()
				_ = c.Close()
				continue
			}
			conns = append(conns, c)
			mu.Unlock()
			if handle != nil {
				wg.Go(func() { handle(c) })
			}
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		closed = true
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
}

// FirstDiff returns the first line (counted from 1) where the texts a and
// b differ, with that line of each (NoLine past a text's end); 0 when they
// are the same.
func FirstDiff(a, b string) (line int, x, y string) {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range max(len(al), len(bl)) {
		x, y = NoLine, NoLine
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y || i >= len(al) || i >= len(bl) {
			return i + 1, x, y
		}
	}
	return 0, "", ""
}

// NoLine is FirstDiff's line of a text that has ended.
const NoLine = "(no line: the text ends before)"

// Golden holds the file at path (a generated doc or source file) to want:
// with update it writes want there instead; otherwise a file that is
// missing or differs fails the test, naming its first differing line and
// rerun, the command that rewrites it.
func Golden(t testing.TB, path string, want []byte, update bool, rerun string) {
	t.Helper()
	if update {
		if err := os.WriteFile(path, want, 0o644); err != nil {
			t.Fatalf("testnet: %v", err)
		}
		return
	}
	have, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v: run %s", err, rerun)
	}
	if line, h, w := FirstDiff(string(have), string(want)); line > 0 {
		t.Fatalf("%s is stale (first difference at line %d):\n have %q\n want %q\nrun %s", path, line, h, w, rerun)
	}
}

// RecordFatal runs f with a testing.TB whose Fatal and Fatalf record
// their message and end f, as they end a test, and returns that message
// ("" when f returned): for the tests of helpers that fail a test.
func RecordFatal(t testing.TB, f func(tb testing.TB)) string {
	rec := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(rec)
	}()
	<-done
	return rec.msg
}

// fatalRecorder is RecordFatal's testing.TB.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Helper() {}

func (r *fatalRecorder) Fatal(args ...any) {
	r.msg = fmt.Sprint(args...)
	runtime.Goexit()
}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// EnvFile reads the NAME=value lines of the env file at path, skipping
// blank lines and # comments: the names in the file's order, and each
// name's value. A line of another form fails the test.
func EnvFile(t testing.TB, path string) (names []string, values map[string]string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	values = map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, value, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: %q is not NAME=value", path, line)
		}
		names = append(names, name)
		values[name] = value
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return names, values
}

// ModuleRoot returns the directory holding go.mod, looked for from the
// test's working directory (its package's directory) up.
func ModuleRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatalf("testnet: %v", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		} else if !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("testnet: %v", err)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("testnet: go.mod not found above the test's directory")
		}
		dir = parent
	}
}

// ConstValues calls fn with every constant of f that is given a value, in
// the order of the source: for tests that read a table of constants from
// its source.
func ConstValues(f *ast.File, fn func(name string, value ast.Expr)) {
	for _, decl := range f.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if i < len(vs.Values) {
					fn(name.Name, vs.Values[i])
				}
			}
		}
	}
}

// Numbered returns n strings, the i-th formatted from format and i, in
// order: names to fill a table with ("key-%018d"), or the lines of a
// file with many entries ("  - {id: r%d, capacity: 1, rate: 1/s}\n").
func Numbered(format string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf(format, i)
	}
	return out
}
