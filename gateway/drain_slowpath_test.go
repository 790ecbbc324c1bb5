package gateway_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/gateway"
	"github.com/tollgate/tollgate/internal/testwait"
)

// TestSlowPathChecksNotCancelledByDrain: a check the fasthttp server hands to net/http
// (any request with a query string, every /v1/authz) in flight when
// shutdown begins. net/http's Shutdown lets it finish with its decision
// (as the fast path's TestCheckAPIDrainsOnShutdown asserts for /v1/check);
// through fasthttpadaptor its context is the RequestCtx, canceled at the
// start of the shutdown.
func TestSlowPathChecksNotCancelledByDrain(t *testing.T) {
	const body = `{"api_key":"sk_drain3","endpoint":"/v1/x"}`
	rd := redistest.StartTB(t)
	e := newEnv(t, envOptions{rules: apiRules, redisAddr: rd.Addr()})
	cfg := e.config()
	cfg.ShutdownTimeout = 3 * time.Second
	srv, err := gateway.New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- srv.Run(ctx) }()
	api := srv.Addrs().API
	warm := dial(t, api)
	if status := exchange(t, warm, post(body)); status != http.StatusOK {
		t.Fatalf("warm-up: %d", status)
	}
	busy, err := net.Dial("tcp", api)
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	if err := rd.Pause(); err != nil {
		t.Fatal(err)
	}
	defer rd.Resume()
	b2 := `{"api_key":"sk_drain4","endpoint":"/v1/x"}`
	raw := "POST /v1/check?via=slow HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(b2)) + "\r\n\r\n" + b2
	if _, err := io.WriteString(busy, raw); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 5*time.Second, func() error {
		if n := unreadBytes(t, rd.Port()); n == 0 {
			return errors.New("the check has not reached Redis")
		}
		return nil
	})
	cancel()
	testwait.Eventually(t, 5*time.Second, func() error {
		c, err := net.DialTimeout("tcp", api, time.Second)
		if err == nil {
			c.Close()
			return errors.New("still accepts")
		}
		return nil
	})
	if err := rd.Resume(); err != nil {
		t.Fatal(err)
	}
	_ = busy.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(busy), nil)
	if err != nil {
		t.Fatalf("in-flight slow-path check: %v", err)
	}
	rb, _ := io.ReadAll(resp.Body)
	t.Logf("answer: %d %v %s", resp.StatusCode, resp.Header, rb)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-RateLimit-Policy") == "degraded" || strings.Contains(string(rb), "redis_unavailable") {
		t.Errorf("in-flight slow-path check answered %d, degraded, though Redis answered: %s", resp.StatusCode, rb)
	}
	<-errc
}
