package linkproxy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/compose/linkproxy"
	"github.com/tollgate/tollgate/internal/testnet"
	"github.com/tollgate/tollgate/internal/testwait"
)

// echo is a TCP server that writes back every line it reads.
func echo(t *testing.T) string {
	t.Helper()
	ln := testnet.Listen(t)
	testnet.Serve(t, ln, func(c net.Conn) { _, _ = io.Copy(c, c) })
	return ln.Addr().String()
}

func start(t *testing.T) *linkproxy.Link {
	t.Helper()
	p, err := linkproxy.Start(context.Background(), linkproxy.Config{Name: "test", Listen: "127.0.0.1:0",
		Target: echo(t), ControlListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	})
	return p
}

// roundTrip sends a line on c and reads it back.
func roundTrip(c net.Conn, r *bufio.Reader, line string) error {
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return err
	}
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return err
	}
	got, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if got != line+"\n" {
		return fmt.Errorf("echo %q, want %q", got, line)
	}
	return nil
}

// control calls the proxy's control API.
func control(t *testing.T, p *linkproxy.Link, method, path string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+p.ControlAddr()+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func state(t *testing.T, p *linkproxy.Link) linkproxy.State {
	t.Helper()
	code, body := control(t, p, http.MethodGet, "/")
	var s linkproxy.State
	if err := json.Unmarshal([]byte(body), &s); code != 200 || err != nil {
		t.Fatalf("GET /: %d %s %v", code, body, err)
	}
	return s
}

// TestLink drives the link through its control API with real TCP
// connections: latency delays both directions, a cut closes live
// connections and refuses new ones, heal lets them through again.
func TestLink(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		run  func(t *testing.T, p *linkproxy.Link)
	}{
		{"forwards", func(t *testing.T, p *linkproxy.Link) {
			c := dial(t, p)
			r := bufio.NewReader(c)
			for i := range 3 {
				if err := roundTrip(c, r, fmt.Sprint("hello ", i)); err != nil {
					t.Fatal(err)
				}
			}
			if s := state(t, p); s.Connections != 1 || s.Accepted != 1 || s.Cut || s.LatencyMS != 0 {
				t.Fatalf("state %+v, want one live connection, not cut, no latency", s)
			}
		}},
		{"latency both ways", func(t *testing.T, p *linkproxy.Link) {
			c, r := dialed(t, p, "warm")
			if code, body := control(t, p, http.MethodPost, "/latency?ms=250"); code != 200 || !strings.Contains(body, `"latency_ms":250`) {
				t.Fatalf("POST /latency: %d %s", code, body)
			}
			t0 := time.Now()
			if err := roundTrip(c, r, "slow"); err != nil {
				t.Fatal(err)
			}
			// There and back: at least twice the latency, however fast the machine.
			if took := time.Since(t0); took < 500*time.Millisecond {
				t.Fatalf("round trip took %v with 250ms each way, want at least 500ms", took)
			}
			if code, _ := control(t, p, http.MethodPost, "/latency?ms=0"); code != 200 {
				t.Fatal("latency 0 refused")
			}
			if err := roundTrip(c, r, "fast again"); err != nil {
				t.Fatal(err)
			}
		}},
		{"cut and heal", func(t *testing.T, p *linkproxy.Link) {
			c, r := dialed(t, p, "before")
			if code, body := control(t, p, http.MethodPost, "/cut"); code != 200 || !strings.Contains(body, `"cut":true`) {
				t.Fatalf("POST /cut: %d %s", code, body)
			}
			// The live connection is closed...
			if err := roundTrip(c, r, "during"); err == nil {
				t.Fatal("a live connection still echoes after the cut")
			}
			// ... and a new one is reset at once (so fast, at times, that
			// the dial itself sees the reset).
			if c2, err := net.Dial("tcp", p.Addr()); err == nil {
				defer c2.Close()
				if err := roundTrip(c2, bufio.NewReader(c2), "refused"); err == nil {
					t.Fatal("a new connection echoes while the link is cut")
				}
			}
			testwait.Eventually(t, 5*time.Second, func() error {
				if s := state(t, p); s.Connections != 0 || s.Refused < 1 {
					return fmt.Errorf("state %+v, want no live connection and one refused", s)
				}
				return nil
			})
			if code, body := control(t, p, http.MethodPost, "/heal"); code != 200 || !strings.Contains(body, `"cut":false`) {
				t.Fatalf("POST /heal: %d %s", code, body)
			}
			c3 := dial(t, p)
			if err := roundTrip(c3, bufio.NewReader(c3), "after"); err != nil {
				t.Fatalf("after heal: %v", err)
			}
		}},
		{"stall holds until healed", func(t *testing.T, p *linkproxy.Link) {
			c, r := dialed(t, p, "before")
			if code, body := control(t, p, http.MethodPost, "/stall"); code != 200 || !strings.Contains(body, `"stalled":true`) {
				t.Fatalf("POST /stall: %d %s", code, body)
			}
			if _, err := io.WriteString(c, "held\n"); err != nil {
				t.Fatal(err)
			}
			// Nothing comes back while stalled; the connection stays open.
			if err := c.SetReadDeadline(time.Now().Add(300 * time.Millisecond)); err != nil {
				t.Fatal(err)
			}
			var ne net.Error
			if _, err := r.ReadString('\n'); !errors.As(err, &ne) || !ne.Timeout() {
				t.Fatalf("read while stalled: %v, want a timeout", err)
			}
			if code, body := control(t, p, http.MethodPost, "/heal"); code != 200 || !strings.Contains(body, `"stalled":false`) {
				t.Fatalf("POST /heal: %d %s", code, body)
			}
			// What was held is delivered.
			if err := c.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
				t.Fatal(err)
			}
			if got, err := r.ReadString('\n'); err != nil || got != "held\n" {
				t.Fatalf("after heal: %q %v, want the held line", got, err)
			}
		}},
		{"close ends live connections", func(t *testing.T, p *linkproxy.Link) {
			c, r := dialed(t, p, "x")
			if err := p.SetLatency(10 * time.Second); err != nil {
				t.Fatal(err)
			}
			if _, err := io.WriteString(c, "queued behind the latency\n"); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- p.Close() }()
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Close waited for queued bytes' latency")
			}
			if err := roundTrip(c, r, "y"); err == nil {
				t.Fatal("the connection works after Close")
			}
			if err := p.Cut(); !errors.Is(err, linkproxy.ErrClosed) {
				t.Fatalf("Cut after Close: %v, want ErrClosed", err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.run(t, start(t))
		})
	}
}

// dialed connects to p and makes one round trip of line on the new
// connection, so that it is through to the echo server; it returns the
// connection and its reader.
func dialed(t *testing.T, p *linkproxy.Link, line string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c := dial(t, p)
	r := bufio.NewReader(c)
	if err := roundTrip(c, r, line); err != nil {
		t.Fatal(err)
	}
	return c, r
}

func dial(t *testing.T, p *linkproxy.Link) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestControlRefusesBadRequests: a bad control request is a 400 (or 404)
// saying what is wrong, and changes nothing.
func TestControlRefusesBadRequests(t *testing.T) {
	t.Parallel()
	p := start(t)
	tests := []struct {
		method, path string
		code         int
		says         string
	}{
		{http.MethodPost, "/latency", 400, "POST /latency?ms=100"},
		{http.MethodPost, "/latency?ms=", 400, "not a whole number"},
		{http.MethodPost, "/latency?ms=fast", 400, "not a whole number"},
		{http.MethodPost, "/latency?ms=1.5", 400, "not a whole number"},
		{http.MethodPost, "/latency?ms=-1", 400, "not within [0, 60000]"},
		{http.MethodPost, "/latency?ms=60001", 400, "not within [0, 60000]"},
		{http.MethodPost, "/latency?ms=99999999999999999999", 400, "not a whole number"},
		{http.MethodPost, "/latency?ms=1&ms=2", 400, "once"},
		{http.MethodGet, "/latency?ms=100", 404, "POST /latency?ms=N"},
		{http.MethodGet, "/cut", 404, "POST /cut"},
		{http.MethodGet, "/stall", 404, "POST /stall"},
		{http.MethodPost, "/partition", 404, "POST /heal"},
	}
	for _, tt := range tests {
		code, body := control(t, p, tt.method, tt.path)
		var e struct{ Error string }
		if code != tt.code || json.Unmarshal([]byte(body), &e) != nil || !strings.Contains(e.Error, tt.says) {
			t.Errorf("%s %s: %d %s, want %d with %q", tt.method, tt.path, code, body, tt.code, tt.says)
		}
	}
	if s := state(t, p); s.Cut || s.Stalled || s.LatencyMS != 0 {
		t.Fatalf("bad requests changed the link: %+v", s)
	}
}

// FuzzControl: whatever the request, the control API answers with JSON, a
// 200 or a 4xx (or the mux's redirect to a clean path), and never panics.
func FuzzControl(f *testing.F) {
	for _, s := range []string{"/", "/latency?ms=100", "/latency?ms=-5", "/cut", "/stall", "/heal", "/latency?ms=%zz", "/x/y"} {
		f.Add("POST", s)
		f.Add("GET", s)
	}
	p, err := linkproxy.Start(context.Background(), linkproxy.Config{Listen: "127.0.0.1:0", Target: "127.0.0.1:1", ControlListen: "127.0.0.1:0"})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = p.Close() })
	h := p.Handler()
	f.Fuzz(func(t *testing.T, method, target string) {
		req, err := http.NewRequest(method, "http://link"+target, nil)
		if err != nil || !strings.HasPrefix(target, "/") {
			return // not a request a client could send
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code == http.StatusMovedPermanently || w.Code == http.StatusTemporaryRedirect || w.Code == http.StatusPermanentRedirect {
			return // net/http's mux cleaning the path (/./cut, //heal)
		}
		if w.Code != 200 && (w.Code < 400 || w.Code > 499) {
			t.Fatalf("%s %s: %d %s", method, target, w.Code, w.Body)
		}
		if !json.Valid(w.Body.Bytes()) {
			t.Fatalf("%s %s: not JSON: %s", method, target, w.Body)
		}
	})
}
