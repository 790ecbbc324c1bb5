package tarpit

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testnet"
	"github.com/tollgate/tollgate/internal/testwait"
)

func TestTable(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	tb := NewTable(8)
	a := netip.MustParseAddr("192.0.2.1")
	v6 := netip.MustParseAddr("2001:db8:1:2::1")
	tests := []struct {
		name string
		addr netip.Addr
		at   time.Time
		want bool
	}{
		{"marked", a, now, true},
		{"IPv4-mapped spelling of the same address", netip.MustParseAddr("::ffff:192.0.2.1"), now, true},
		{"another address", netip.MustParseAddr("192.0.2.2"), now, false},
		{"same /64", netip.MustParseAddr("2001:db8:1:2:ffff::9"), now, true},
		{"another /64", netip.MustParseAddr("2001:db8:1:3::1"), now, false},
		{"cooldown over", a, now.Add(time.Minute), false},
		{"invalid", netip.Addr{}, now, false},
	}
	tb.Mark(a, now.Add(time.Minute))
	tb.Mark(v6, now.Add(time.Minute))
	tb.Mark(a, now.Add(time.Second)) // never shortens
	tb.Mark(netip.Addr{}, now.Add(time.Hour))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tb.Throttled(tt.addr, tt.at); got != tt.want {
				t.Errorf("Throttled(%v) = %v, want %v", tt.addr, got, tt.want)
			}
		})
	}
	if n := tb.Len(now); n != 2 {
		t.Errorf("Len = %d, want 2", n)
	}
}

// The table's memory is fixed: marking many more addresses than it holds
// keeps the newest (longest cooldowns) and evicts the soonest to expire.
func TestTableBounded(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	tb := NewTable(64)
	if tb.Cap() != 64 {
		t.Fatalf("Cap = %d", tb.Cap())
	}
	addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}) }
	for i := range 10_000 {
		tb.Mark(addr(i), now.Add(time.Duration(i)*time.Millisecond+time.Hour))
	}
	if n := tb.Len(now); n != 64 {
		t.Fatalf("Len = %d after 10 000 marks, want the capacity 64", n)
	}
	kept := 0
	for i := 9_900; i < 10_000; i++ {
		if tb.Throttled(addr(i), now) {
			kept++
		}
	}
	if kept < 32 {
		t.Errorf("only %d of the last 100 marked addresses kept: eviction should take the soonest expiry", kept)
	}
}

type heldKey struct{}

// server serves HTTP on a Listener over a real loopback socket, and
// answers "held" or "direct" from tarpit.Held.
type server struct {
	ln      *Listener
	srv     *http.Server
	done    chan error
	delayed atomic.Int32
	refused atomic.Int32
}

func startServer(t *testing.T, tb *Table, delay time.Duration, maxHeld int, exempt func(netip.Addr) bool) *server {
	t.Helper()
	inner := testnet.Listen(t)
	s := &server{done: make(chan error, 1)}
	s.ln = NewListener(inner, ListenerConfig{Table: tb, Delay: delay, MaxHeld: maxHeld, Exempt: exempt,
		OnThrottle: func(refused bool) {
			if refused {
				s.refused.Add(1)
			} else {
				s.delayed.Add(1)
			}
		}})
	s.srv = &http.Server{
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, heldKey{}, Held(c))
		},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Context().Value(heldKey{}).(bool) {
				io.WriteString(w, "held")
			} else {
				io.WriteString(w, "direct")
			}
		}),
	}
	go func() { s.done <- s.srv.Serve(s.ln) }()
	t.Cleanup(func() {
		s.srv.Close()
		<-s.done
		s.ln.Close()
	})
	return s
}

// get sends one request from source address src and returns how long the
// answer took and the answer ("held" or "direct").
func get(t *testing.T, addr, src string) (time.Duration, string, error) {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	start := time.Now()
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return 0, "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"); err != nil {
		return 0, "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, "", err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return time.Since(start), string(b), err
}

// A throttled address's connection is served only after the delay; other
// addresses' (and an exempt one's) at once; past MaxHeld, connections of
// throttled addresses are refused; Close releases what is held.
func TestListenerDelaysThrottled(t *testing.T) {
	t.Parallel()
	const delay = 400 * time.Millisecond
	tb := NewTable(16)
	until := time.Now().Add(time.Hour)
	tb.Mark(netip.MustParseAddr("127.0.0.2"), until)
	tb.Mark(netip.MustParseAddr("127.0.0.3"), until)
	exempt := func(a netip.Addr) bool { return a == netip.MustParseAddr("127.0.0.3") }
	s := startServer(t, tb, delay, 2, exempt)
	addr := s.ln.Addr().String()

	took, body, err := get(t, addr, "127.0.0.2")
	if err != nil {
		t.Fatal(err)
	}
	if took < delay || body != "held" {
		t.Errorf("throttled address answered %q after %v, want held, at least %v", body, took, delay)
	}
	for _, src := range []string{"127.0.0.1", "127.0.0.3"} {
		took, body, err := get(t, addr, src)
		if err != nil {
			t.Fatal(err)
		}
		if took >= delay || body != "direct" {
			t.Errorf("%s answered %q after %v: not throttled, it should not wait", src, body, took)
		}
	}
	if d, r := s.delayed.Load(), s.refused.Load(); d != 1 || r != 0 {
		t.Errorf("delayed %d refused %d, want 1 0", d, r)
	}

	// Four at once from the throttled address: two held, two refused.
	var wg sync.WaitGroup
	var ok, failed atomic.Int32
	for range 4 {
		wg.Go(func() {
			if _, _, err := get(t, addr, "127.0.0.2"); err != nil {
				failed.Add(1)
			} else {
				ok.Add(1)
			}
		})
	}
	testwait.Eventually(t, 5*time.Second, func() error {
		if n := s.delayed.Load() + s.refused.Load(); n != 5 {
			return fmt.Errorf("%d throttled so far", n)
		}
		return nil
	})
	wg.Wait()
	if ok.Load() != 2 || failed.Load() != 2 || s.refused.Load() != 2 {
		t.Errorf("served %d, failed %d, refused %d: want 2 held and served, 2 refused", ok.Load(), failed.Load(), s.refused.Load())
	}
}

// Close stops the goroutines and closes the connections still held, even
// when Accept was never called again.
func TestListenerCloseReleasesHeld(t *testing.T) {
	t.Parallel()
	tb := NewTable(16)
	tb.Mark(netip.MustParseAddr("127.0.0.1"), time.Now().Add(time.Hour))
	inner := testnet.Listen(t)
	l := NewListener(inner, ListenerConfig{Table: tb, Delay: time.Hour})
	accepted := make(chan error, 1)
	go func() {
		_, err := l.Accept()
		accepted <- err
	}()
	c, err := net.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	testwait.Eventually(t, 5*time.Second, func() error {
		if l.HeldNow() != 1 {
			return fmt.Errorf("%d held", l.HeldNow())
		}
		return nil
	})
	for range 3 {
		go l.Close() // idempotent, from many goroutines
	}
	l.Close()
	if err := <-accepted; err != net.ErrClosed {
		t.Errorf("Accept after Close: %v", err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Error("the held connection is still open after Close")
	}
	if l.HeldNow() != 0 {
		t.Errorf("%d held after Close", l.HeldNow())
	}
}

// A Listener closed before its first Accept starts nothing.
func TestListenerCloseBeforeAccept(t *testing.T) {
	t.Parallel()
	inner := testnet.Listen(t)
	l := NewListener(inner, ListenerConfig{Table: NewTable(0)})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Accept(); err != net.ErrClosed {
		t.Errorf("Accept = %v", err)
	}
}
