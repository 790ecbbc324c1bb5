package linkproxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testnet"
)

// echoServer answers every connection with what it reads, and reports each
// chunk it receives on got.
func echoServer(t *testing.T) (addr string, got <-chan []byte) {
	t.Helper()
	ln := testnet.Listen(t)
	ch := make(chan []byte, 64)
	testnet.Serve(t, ln, func(c net.Conn) {
		defer c.Close() // after the client's half-close: EOF its way too
		buf := make([]byte, 1024)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				select {
				case ch <- bytes.Clone(buf[:n]):
				default:
				}
				if _, err := c.Write(buf[:n]); err != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	})
	return ln.Addr().String(), ch
}

// byIP names clients by their source address: 127.0.0.2 is "a", 127.0.0.3
// is "b".
func byIP(peer, _ netip.AddrPort) string {
	switch peer.Addr().String() {
	case "127.0.0.2":
		return "a"
	case "127.0.0.3":
		return "b"
	}
	return ""
}

func newProxy(t *testing.T) *Proxy {
	t.Helper()
	p, _ := newProxyAndServer(t)
	return p
}

// newProxyAndServer is newProxy with what its echo server receives.
func newProxyAndServer(t *testing.T) (*Proxy, <-chan []byte) {
	t.Helper()
	target, got := echoServer(t)
	p, err := Listen("127.0.0.1:0", WithClassifier(byIP))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	p.SetTarget(target)
	return p, got
}

// warmClient connects client "a" and waits for its first chunk to go
// round.
func warmClient(t *testing.T, p *Proxy, got <-chan []byte) net.Conn {
	t.Helper()
	c := dialFrom(t, "127.0.0.2", p.Addr())
	if err := roundTrip(c, "warm", arrive); err != nil {
		t.Fatal(err)
	}
	<-got
	return c
}

// dialFrom connects to addr from the loopback address src.
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip writes msg and reads it back within wait; it returns the error
// of the read (a timeout when nothing came back).
func roundTrip(c net.Conn, msg string, wait time.Duration) error {
	if _, err := c.Write([]byte(msg)); err != nil {
		return err
	}
	return readBack(c, msg, wait)
}

func readBack(c net.Conn, msg string, wait time.Duration) error {
	_ = c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != msg {
		return errors.New("echo differs: " + string(buf))
	}
	return nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// hold is how long the tests wait to see that nothing arrives; answers that
// must arrive get generous deadlines.
const (
	hold   = 300 * time.Millisecond
	arrive = 10 * time.Second
)

func TestPassForwardsBothWays(t *testing.T) {
	p := newProxy(t)
	c := dialFrom(t, "127.0.0.2", p.Addr())
	for _, msg := range []string{"hello", "again"} {
		if err := roundTrip(c, msg, arrive); err != nil {
			t.Fatalf("%s: %v", msg, err)
		}
	}
	// A half-close reaches the server, whose close reaches the client.
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(arrive))
	if n, err := c.Read(make([]byte, 8)); !errors.Is(err, io.EOF) {
		t.Fatalf("after a half-close: read %d, %v; want EOF", n, err)
	}
}

func TestFaults(t *testing.T) {
	cases := []struct {
		name  string
		fault Fault
		// check runs with the fault set on client "a", on a connection
		// opened before the fault (old) and one opened during it (new).
		check func(t *testing.T, p *Proxy, old net.Conn)
	}{
		{"cut resets old and new connections", Fault{Mode: Cut}, func(t *testing.T, p *Proxy, old net.Conn) {
			if err := roundTrip(old, "x", arrive); err == nil || isTimeout(err) {
				t.Fatalf("old connection: %v, want a reset", err)
			}
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}, Timeout: arrive}
			c, err := d.Dial("tcp", p.Addr())
			if err != nil {
				return // reset before the dial returned: cut all the same
			}
			defer c.Close()
			if err := roundTrip(c, "y", arrive); err == nil || isTimeout(err) {
				t.Fatalf("new connection: %v, want a reset", err)
			}
		}},
		{"stall holds until healed, then delivers", Fault{Mode: Stall}, func(t *testing.T, p *Proxy, old net.Conn) {
			if err := roundTrip(old, "held", hold); !isTimeout(err) {
				t.Fatalf("during the stall: %v, want a timeout", err)
			}
			c := dialFrom(t, "127.0.0.2", p.Addr())
			if err := roundTrip(c, "new", hold); !isTimeout(err) {
				t.Fatalf("new connection during the stall: %v, want a timeout", err)
			}
			p.Clear("a")
			if err := readBack(old, "held", arrive); err != nil {
				t.Fatalf("after the heal: %v", err)
			}
			if err := readBack(c, "new", arrive); err != nil {
				t.Fatalf("new connection after the heal: %v", err)
			}
		}},
		{"latency delays each chunk", Fault{Mode: Latency, Delay: 150 * time.Millisecond}, func(t *testing.T, p *Proxy, old net.Conn) {
			start := time.Now()
			if err := roundTrip(old, "slow", arrive); err != nil {
				t.Fatal(err)
			}
			if d := time.Since(start); d < 300*time.Millisecond {
				t.Fatalf("round trip took %v, want at least twice the latency", d)
			}
		}},
		{"one way to the server holds the answers", Fault{Mode: OneWay, ToServer: true}, func(t *testing.T, p *Proxy, old net.Conn) {
			if err := roundTrip(old, "ping", hold); !isTimeout(err) {
				t.Fatalf("answer came back: %v", err)
			}
			p.Clear("a")
			if err := readBack(old, "ping", arrive); err != nil {
				t.Fatalf("after the heal: %v", err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := newProxy(t)
			a := dialFrom(t, "127.0.0.2", p.Addr())
			b := dialFrom(t, "127.0.0.3", p.Addr())
			if err := roundTrip(a, "warm", arrive); err != nil {
				t.Fatal(err)
			}
			p.Set("a", tc.fault)
			tc.check(t, p, a)
			// The other client never noticed.
			if err := roundTrip(b, "other", arrive); err != nil {
				t.Fatalf("client b: %v", err)
			}
		})
	}
}

func TestOneWayToClientDeliversNothingToTheServer(t *testing.T) {
	p, got := newProxyAndServer(t)
	c := warmClient(t, p, got)
	p.Set(AnyClient, Fault{Mode: OneWay, ToServer: false})
	if _, err := c.Write([]byte("lost")); err != nil {
		t.Fatal(err)
	}
	select {
	case b := <-got:
		t.Fatalf("server received %q during a one-way fault towards the client", b)
	case <-time.After(hold):
	}
	p.Clear(AnyClient)
	select {
	case b := <-got:
		if string(b) != "lost" {
			t.Fatalf("server received %q", b)
		}
	case <-time.After(arrive):
		t.Fatal("held data never delivered after the heal")
	}
}

func TestNoTargetHoldsConnections(t *testing.T) {
	target, _ := echoServer(t)
	p, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	c := dialFrom(t, "127.0.0.1", p.Addr())
	if err := roundTrip(c, "early", hold); !isTimeout(err) {
		t.Fatalf("before a target: %v, want a timeout", err)
	}
	p.SetTarget(target)
	if err := readBack(c, "early", arrive); err != nil {
		t.Fatal(err)
	}
	if got := p.Conns()[Unknown]; got != 1 {
		t.Fatalf("Conns()[%q] = %d, want 1", Unknown, got)
	}
}

func TestCloseIsIdempotentAndEndsConnections(t *testing.T) {
	p := newProxy(t)
	c := dialFrom(t, "127.0.0.2", p.Addr())
	if err := roundTrip(c, "x", arrive); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() { defer wg.Done(); p.Close() }()
	}
	wg.Wait()
	if err := roundTrip(c, "y", arrive); err == nil || isTimeout(err) {
		t.Fatalf("after Close: %v, want the connection gone", err)
	}
}

// linkproxyGoroutines counts the goroutines of the package's code that
// are blocked.
func linkproxyGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		// A goroutine running or runnable may be one that has already
		// told its owner it is done, on its way out; a blocked one is not.
		if strings.HasPrefix(g, "goroutine ") && (strings.Contains(g, " [running]") || strings.Contains(g, " [runnable]")) {
			continue
		}
		if strings.Contains(g, "linkproxy.(*Proxy).") || strings.Contains(g, "linkproxy.(*Link).") || strings.Contains(g, "linkproxy.Start.") {
			count++
		}
	}
	return count
}

// TestCloseWaitsForEveryGoroutine: when Close returns, none of the
// goroutines of the proxy (or of a Link and its control API) runs any
// more, whatever its connections were doing: held by a stall before the
// dial, queued behind a latency, held by a one-way fault, passing.
// (Not parallel: no other test's proxy runs meanwhile.)
func TestCloseWaitsForEveryGoroutine(t *testing.T) {
	// busy opens connections in every state there is on addr; set puts a
	// fault on one client ("a", "b" or AnyClient when the proxy does not
	// tell them apart).
	busy := func(t *testing.T, addr string, set func(client string, f Fault), perClient bool) {
		passing := dialFrom(t, "127.0.0.4", addr)
		if err := roundTrip(passing, "warm", arrive); err != nil {
			t.Fatal(err)
		}
		slow := dialFrom(t, "127.0.0.3", addr)
		if err := roundTrip(slow, "warm", arrive); err != nil {
			t.Fatal(err)
		}
		if !perClient {
			set(AnyClient, Fault{Mode: Latency, Delay: 50 * time.Second})
			if _, err := slow.Write([]byte("queued behind 50 s")); err != nil {
				t.Fatal(err)
			}
			return
		}
		set("b", Fault{Mode: Latency, Delay: 50 * time.Second})
		if _, err := slow.Write([]byte("queued behind 50 s")); err != nil {
			t.Fatal(err)
		}
		set("a", Fault{Mode: Stall})
		held := dialFrom(t, "127.0.0.2", addr) // held before its dial
		if _, err := held.Write([]byte("held")); err != nil {
			t.Fatal(err)
		}
		set(Unknown, Fault{Mode: OneWay, ToServer: true})
		if err := roundTrip(passing, "no answer", hold); !isTimeout(err) {
			t.Fatalf("one way: %v, want the answer held", err)
		}
	}
	cases := []struct {
		name  string
		start func(t *testing.T) (close func() error)
	}{
		{"proxy", func(t *testing.T) func() error {
			p := newProxy(t)
			busy(t, p.Addr(), p.Set, true)
			return p.Close
		}},
		{"link", func(t *testing.T) func() error {
			target, _ := echoServer(t)
			l, err := Start(context.Background(), Config{Name: "t", Listen: "127.0.0.1:0", Target: target, ControlListen: "127.0.0.1:0"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = l.Close() })
			busy(t, l.Addr(), func(_ string, f Fault) {
				if err := l.SetLatency(f.Delay); err != nil {
					t.Fatal(err)
				}
			}, false)
			return l.Close
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			closeIt := tc.start(t)
			if n := linkproxyGoroutines(); n == 0 {
				t.Fatal("no goroutine of the proxy seen before Close: the count sees nothing")
			}
			if err := closeIt(); err != nil {
				t.Fatal(err)
			}
			if n := linkproxyGoroutines(); n != 0 {
				t.Fatalf("%d goroutines of the proxy still run after Close returned", n)
			}
		})
	}
}

// TestLatencyDelaysWithoutSlowing: a latency makes a stream late, not
// slower: chunks written one after another each arrive about one delay
// after they were sent, not one delay after the chunk before them.
func TestLatencyDelaysWithoutSlowing(t *testing.T) {
	t.Parallel()
	p, got := newProxyAndServer(t)
	c := warmClient(t, p, got)
	const delay = 3 * time.Second
	p.Set("a", Fault{Mode: Latency, Delay: delay})
	// Five chunks, 100 ms apart: queued one after the other they all reach
	// the server about one delay after the first was sent; one delay per
	// chunk (the proxy waiting out each before reading the next) would take
	// at least two.
	t0 := time.Now()
	pace := time.NewTicker(100 * time.Millisecond)
	defer pace.Stop()
	const msg = "chunk"
	for i := range 5 {
		if i > 0 {
			<-pace.C
		}
		if _, err := c.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
	}
	received := 0
	deadline := time.After(4 * delay)
	for received < 5*len(msg) {
		select {
		case b := <-got:
			received += len(b)
		case <-deadline:
			t.Fatalf("the server got %d of %d bytes in %v", received, 5*len(msg), 4*delay)
		}
	}
	took := time.Since(t0)
	if took < delay {
		t.Fatalf("the chunks arrived in %v, before the delay of %v", took, delay)
	}
	if took >= 2*delay-500*time.Millisecond {
		t.Fatalf("the chunks took %v with a delay of %v: each waited for the one before", took, delay)
	}
}
