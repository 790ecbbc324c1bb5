package gateway_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/tollgate/tollgate/gateway"
	"github.com/tollgate/tollgate/guard"
)

// offenderRules limits sk_off_* keys far below what the tests send, so
// that every decision of a key without a control would reach Redis.
const offenderRules = `rules:
  - id: demo
    match: {api_key: "sk_off_*"}
    algorithm: token_bucket
    capacity: 1
    rate: 1/1h
`

// clientConn is one client connection to the proxy from a chosen loopback
// source address, sending requests one after the other.
type clientConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

// dialFrom connects to addr from source (a 127.0.0.x address: Linux routes
// all of 127/8 to the loopback interface).
func dialFrom(t *testing.T, addr, source string) *clientConn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	return &clientConn{t: t, c: c, br: bufio.NewReader(c)}
}

// get sends GET /v1/x with key and extra header lines and returns the
// response (body read) and how long it took.
func (cc *clientConn) get(key, extra string) (*http.Response, time.Duration) {
	cc.t.Helper()
	start := time.Now()
	if _, err := fmt.Fprintf(cc.c, "GET /v1/x HTTP/1.1\r\nHost: gw\r\nX-API-Key: %s\r\n%s\r\n", key, extra); err != nil {
		cc.t.Fatalf("write: %v", err)
	}
	resp, err := http.ReadResponse(cc.br, nil)
	if err != nil {
		cc.t.Fatalf("read: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp, time.Since(start)
}

// closed reports whether the gateway closed the connection.
func (cc *clientConn) closed() bool {
	_, err := cc.br.ReadByte()
	return err != nil
}

// TestTopOfLadderConnectionLevel: a key at the top of the penalty ladder
// is answered 403 with Connection: close at its close_after-th answer on a
// direct client's connection; that client's address is then throttled at
// accept (its next connection held for throttle_delay and closed at the
// first answer), while another address is not, and a trusted proxy's
// connection is never closed nor throttled. No answer costs a Redis call.
func TestTopOfLadderConnectionLevel(t *testing.T) {
	t.Parallel()
	const delay = 500 * time.Millisecond
	// The hold starts at accept, which may come a little before the
	// request's first byte (when the client's clock starts): allow that.
	const held = delay - 50*time.Millisecond
	e := newEnv(t, envOptions{rules: offenderRules, config: func(c *gateway.Config) {
		c.Offenders.CloseAfter = 3
		c.Offenders.ThrottleDelay = delay
		c.Identity.TrustedProxies = []string{"127.0.0.9/32"}
	}})
	g := e.gw.srv.Guard()
	top, level2 := "sk_off_top", "sk_off_cooldown"
	until := time.Now().Add(time.Hour).UnixMicro()
	g.Controls().Block(g.KeyID(top), guard.Entry{Level: 3, Close: true, Expiry: until})
	g.Controls().SetPenalty(g.KeyID(level2), guard.Penalty{Level: 2, Until: until})
	proxyAddr := e.gw.addrs.Proxy
	redisBefore := e.metric(e.gw, "tollgate_redis_calls_total")

	// A direct client: closed at the third answer, not before.
	cc := dialFrom(t, proxyAddr, "127.0.0.2")
	for i := 1; i <= 3; i++ {
		resp, _ := cc.get(top, "")
		if resp.StatusCode != 403 || resp.Close != (i == 3) {
			t.Fatalf("answer %d: status %d, Connection: close %v; want 403, close at the 3rd", i, resp.StatusCode, resp.Close)
		}
	}
	if !cc.closed() {
		t.Fatal("answered Connection: close but left the connection open")
	}

	// Its address is throttled now: held, then closed at the first answer.
	cc = dialFrom(t, proxyAddr, "127.0.0.2")
	resp, took := cc.get(top, "")
	if resp.StatusCode != 403 || !resp.Close || took < held {
		t.Errorf("throttled address: status %d, close %v after %v; want 403, closed, after at least %v", resp.StatusCode, resp.Close, took, delay)
	}
	// Another key behind the throttled address is slowed, not refused.
	cc = dialFrom(t, proxyAddr, "127.0.0.2")
	if resp, took := cc.get(level2, ""); resp.StatusCode != 429 || took < held || resp.Close {
		t.Errorf("another key from the throttled address: status %d after %v, close %v; want 429 after the delay, kept", resp.StatusCode, took, resp.Close)
	}

	// Another address is not throttled.
	cc = dialFrom(t, proxyAddr, "127.0.0.3")
	if resp, took := cc.get(top, ""); resp.StatusCode != 403 || resp.Close || took >= delay {
		t.Errorf("another address: status %d, close %v after %v; want 403 at once, connection kept", resp.StatusCode, resp.Close, took)
	}

	// A trusted proxy, forwarding the same offender: never closed.
	cc = dialFrom(t, proxyAddr, "127.0.0.9")
	for i := 1; i <= 6; i++ {
		resp, _ := cc.get(top, "X-Forwarded-For: 198.51.100.7\r\n")
		if resp.StatusCode != 403 || resp.Close {
			t.Fatalf("trusted proxy, answer %d: status %d, close %v; want 403, connection kept", i, resp.StatusCode, resp.Close)
		}
	}

	// A level 2 penalty never closes a connection.
	cc = dialFrom(t, proxyAddr, "127.0.0.4")
	for i := 1; i <= 5; i++ {
		resp, _ := cc.get(level2, "")
		if resp.StatusCode != 429 || resp.Close || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("level 2, answer %d: status %d, close %v, Retry-After %q", i, resp.StatusCode, resp.Close, resp.Header.Get("Retry-After"))
		}
	}

	if got := e.metric(e.gw, "tollgate_redis_calls_total") - redisBefore; got != 0 {
		t.Errorf("%v Redis calls for penalised and blocked keys, want 0", got)
	}
	for _, m := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"tollgate_penalty_connections_closed_total", []string{`reason="penalty"`}, 2},
		{"tollgate_accept_throttled_total", []string{`outcome="delayed"`}, 2},
		{"tollgate_accept_throttled_total", []string{`outcome="refused"`}, 0},
		{"tollgate_accept_throttled_addresses", nil, 1},
		{"tollgate_penalized_keys", []string{`level="3"`}, 1},
		{"tollgate_penalized_keys", []string{`level="2"`}, 1},
	} {
		if got := e.metric(e.gw, m.name, m.labels...); got != m.want {
			t.Errorf("%s%v = %v, want %v", m.name, m.labels, got, m.want)
		}
	}
}

// TestThrottleOff: with offenders.throttle off, connections are closed
// after close_after answers but nobody is held at accept.
func TestThrottleOff(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rules: offenderRules, config: func(c *gateway.Config) {
		c.Offenders.CloseAfter = 1
		c.Offenders.Throttle = gateway.ThrottleOff
		c.Offenders.ThrottleDelay = time.Hour
	}})
	g := e.gw.srv.Guard()
	g.Controls().Block(g.KeyID("sk_off_x"), guard.Entry{Level: 3, Close: true})
	for range 3 {
		cc := dialFrom(t, e.gw.addrs.Proxy, "127.0.0.2")
		if resp, _ := cc.get("sk_off_x", ""); resp.StatusCode != 403 || !resp.Close {
			t.Fatalf("status %d close %v", resp.StatusCode, resp.Close)
		}
	}
	if got := e.metric(e.gw, "tollgate_accept_throttled_total"); got != 0 {
		t.Errorf("throttled %v connections with throttle off", got)
	}
}
