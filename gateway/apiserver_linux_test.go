package gateway_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/gateway"
	"github.com/tollgate/tollgate/internal/logtest"
	"github.com/tollgate/tollgate/internal/testnet"
	"github.com/tollgate/tollgate/internal/testwait"
)

// TestCheckAPIDrainsOnShutdown: the check API (served by fasthttp) lets a
// check in flight at shutdown finish with its decision — on the fast path
// and on a request handed to net/http (a query string; every /v1/authz),
// whose context fasthttp's shutdown must not cancel (it would decide it
// degraded) — closes idle keep-alive connections, stops accepting, and
// cuts a request still unread when shutdown_timeout runs out.
func TestCheckAPIDrainsOnShutdown(t *testing.T) {
	t.Parallel()
	const body = `{"api_key":"sk_drain","endpoint":"/v1/x"}`
	tests := []struct {
		name string
		// wholeRequest: when shutdown begins a client has sent a whole
		// check (answered once Redis wakes), else headers without the
		// whole body.
		wholeRequest bool
		target       string // the request target
		wantStatus   int    // 0: the connection is cut, no answer
	}{
		{"check in flight finishes", true, "/v1/check", http.StatusOK},
		{"slow-path check in flight finishes", true, "/v1/check?via=net-http", http.StatusOK},
		{"unread body cut at shutdown_timeout", false, "/v1/check", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rd := redistest.StartTB(t)
			e := newEnv(t, envOptions{rules: apiRules, redisAddr: rd.Addr()})
			cfg := e.config()
			cfg.ShutdownTimeout = 1500 * time.Millisecond
			srv, err := gateway.New(cfg, logtest.Warnings(t))
			if err != nil {
				t.Fatal(err)
			}
			run := testnet.Start(t, "gateway", srv.Run)
			api := srv.Addrs().API

			// An idle keep-alive connection, answered once.
			idle := dial(t, api)
			if status := exchange(t, idle, post(body)); status != http.StatusOK {
				t.Fatalf("warm-up check: %d", status)
			}

			busy, err := net.Dial("tcp", api)
			if err != nil {
				t.Fatal(err)
			}
			defer busy.Close()
			apiPort := testnet.Port(t, api)
			if tt.wholeRequest {
				// Redis is paused, so the check waits for it while the
				// gateway shuts down: in flight once its script sits
				// unread in Redis's socket.
				if err := rd.Pause(); err != nil {
					t.Fatal(err)
				}
				defer rd.Resume()
				post := strings.Replace(post(strings.Replace(body, "sk_drain", "sk_drain2", 1)), "/v1/check", tt.target, 1)
				if _, err := io.WriteString(busy, post); err != nil {
					t.Fatal(err)
				}
				testwait.Eventually(t, 5*time.Second, func() error {
					if n := unreadBytes(t, rd.Port()); n == 0 {
						return errors.New("the check has not reached Redis")
					}
					return nil
				})
			} else {
				full := post(body)
				if _, err := io.WriteString(busy, full[:len(full)-5]); err != nil {
					t.Fatal(err)
				}
				// The gateway has read the head and what came of the
				// body: it waits for the rest.
				testwait.Eventually(t, 5*time.Second, func() error {
					if n := unreadBytes(t, apiPort); n > 0 {
						return fmt.Errorf("%d bytes of the request unread", n)
					}
					return nil
				})
			}
			start := time.Now()
			run.Cancel()
			if tt.wholeRequest {
				// Shutdown has begun (nothing accepts) while the check
				// waits; then Redis answers it.
				testwait.Eventually(t, 5*time.Second, func() error {
					c, err := net.DialTimeout("tcp", api, time.Second)
					if err == nil {
						c.Close()
						return errors.New("the check API still accepts")
					}
					return nil
				})
				if err := rd.Resume(); err != nil {
					t.Fatal(err)
				}
			}

			_ = busy.SetReadDeadline(time.Now().Add(5 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(busy), nil)
			switch {
			case tt.wantStatus == 0 && err == nil:
				t.Fatalf("answered %d, want the connection cut", resp.StatusCode)
			case tt.wantStatus == 0 && time.Since(start) < time.Second:
				t.Fatalf("cut after %v, before shutdown_timeout", time.Since(start))
			case tt.wantStatus != 0 && err != nil:
				t.Fatalf("in-flight check: %v", err)
			case tt.wantStatus != 0 && resp.StatusCode != tt.wantStatus:
				t.Fatalf("in-flight check: %d, want %d", resp.StatusCode, tt.wantStatus)
			}
			if resp != nil {
				rb, _ := io.ReadAll(resp.Body)
				if resp.Header.Get("X-RateLimit-Limit") == "" || strings.Contains(string(rb), `"degraded":true`) {
					t.Errorf("in-flight check answered without its decision (degraded, though Redis answered): %v %s", resp.Header, rb)
				}
			}

			select {
			case <-run.Done():
				if err := run.Wait(); err != nil {
					t.Fatalf("Run: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not return")
			}
			// The idle connection was closed, and nothing accepts.
			_ = idle.c.SetReadDeadline(time.Now().Add(2 * time.Second))
			if _, err := idle.r.ReadByte(); !errors.Is(err, io.EOF) && !isReset(err) {
				t.Errorf("idle connection after shutdown: %v", err)
			}
			if c, err := net.DialTimeout("tcp", api, time.Second); err == nil {
				c.Close()
				t.Error("the check API still accepts after shutdown")
			}
		})
	}
}

func post(body string) string {
	return "POST /v1/check HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

type conn struct {
	c net.Conn
	r *bufio.Reader
}

func dial(t *testing.T, addr string) *conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &conn{c: c, r: bufio.NewReader(c)}
}

// exchange sends raw on c and reads one answer, leaving c open.
func exchange(t *testing.T, c *conn, raw string) int {
	t.Helper()
	if _, err := io.WriteString(c.c, raw); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(c.r, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func isReset(err error) bool {
	return err != nil && strings.Contains(err.Error(), "connection reset")
}

// unreadBytes returns the bytes received and not yet read by the process
// owning the loopback TCP sockets whose local port is port
// (/proc/net/tcp's rx_queue: this file builds on Linux only), so a test
// can tell that a server has read a request, or that a request reached a
// server that is not reading.
func unreadBytes(t *testing.T, port int) int64 {
	t.Helper()
	var total int64
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fields := strings.Fields(line)
			if len(fields) < 5 {
				continue
			}
			local := fields[1]
			i := strings.LastIndexByte(local, ':')
			p, err := strconv.ParseInt(local[i+1:], 16, 32)
			if err != nil || int(p) != port {
				continue
			}
			_, rx, _ := strings.Cut(fields[4], ":")
			n, err := strconv.ParseInt(rx, 16, 64)
			if err == nil {
				total += n
			}
		}
	}
	return total
}
