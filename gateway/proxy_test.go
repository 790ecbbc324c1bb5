package gateway_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/gateway"
	"github.com/tollgate/tollgate/internal/testnet"
	"github.com/tollgate/tollgate/internal/testwait"
)

const proxyRules = `
rules:
  - {id: all, match: {}, algorithm: token_bucket, capacity: 100, rate: 100/1h}
`

func TestProxyForwarding(t *testing.T) {
	t.Parallel()
	seen := make(chan *http.Request, 1)
	e := newEnv(t, envOptions{rules: proxyRules, upstream: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		seen <- r
		w.Header().Set("Connection", "X-Upstream-Hop")
		w.Header().Set("X-Upstream-Hop", "secret hop")
		w.Header().Set("RateLimit", `"fake";r=1000`)
		w.Header().Set("X-RateLimit-Remaining", "1000")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "created:"+string(body))
	})})

	req, _ := http.NewRequest(http.MethodPost, "http://"+e.gw.addrs.Proxy+"/v1/items?q=1", strings.NewReader("payload"))
	req.Header.Set("X-API-Key", "sk_fwd")
	req.Header.Set("X-Forwarded-For", "198.51.100.7")
	req.Header.Set("Connection", "X-Client-Hop")
	req.Header.Set("X-Client-Hop", "dropped")
	req.Header.Set("X-Custom", "kept")
	resp, body := e.do(req)
	up := <-seen

	if resp.StatusCode != http.StatusCreated || string(body) != "created:payload" {
		t.Fatalf("response %d %q", resp.StatusCode, body)
	}
	if up.Method != http.MethodPost || up.URL.Path != "/v1/items" || up.URL.RawQuery != "q=1" {
		t.Errorf("upstream request %s %s?%s", up.Method, up.URL.Path, up.URL.RawQuery)
	}
	if got := up.Header.Get("X-Forwarded-For"); got != "198.51.100.7, 127.0.0.1" {
		t.Errorf("X-Forwarded-For %q, want the client's list with the peer appended", got)
	}
	if up.Header.Get("X-Forwarded-Proto") != "http" || up.Header.Get("X-Forwarded-Host") == "" {
		t.Errorf("X-Forwarded-Proto %q, -Host %q", up.Header.Get("X-Forwarded-Proto"), up.Header.Get("X-Forwarded-Host"))
	}
	if up.Header.Get("X-Client-Hop") != "" || up.Header.Get("X-Custom") != "kept" || up.Header.Get("X-API-Key") != "sk_fwd" {
		t.Errorf("upstream headers %v", up.Header)
	}
	if resp.Header.Get("X-Upstream-Hop") != "" {
		t.Errorf("hop-by-hop response header forwarded")
	}
	if got := resp.Header.Values("X-RateLimit-Remaining"); len(got) != 1 || got[0] != "99" {
		t.Errorf("X-RateLimit-Remaining %q, want the gateway's 99 only", got)
	}
	if rl := sfList(t, resp.Header, "RateLimit"); len(rl) != 1 || rl["all"]["r"] != 99 {
		t.Errorf("RateLimit %q, want the gateway's", resp.Header.Get("RateLimit"))
	}
}

// TestProxyStreams: a streamed upstream response reaches the client chunk
// by chunk, before the upstream has finished.
func TestProxyStreams(t *testing.T) {
	t.Parallel()
	next := make(chan struct{})
	e := newEnv(t, envOptions{rules: proxyRules, upstream: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < 3; i++ {
			_, _ = io.WriteString(w, "data: chunk\n\n")
			w.(http.Flusher).Flush()
			select {
			case <-next:
			case <-r.Context().Done():
				return
			}
		}
	})})
	req, _ := http.NewRequest(http.MethodGet, "http://"+e.gw.addrs.Proxy+"/events", nil)
	req.Header.Set("X-API-Key", "sk_stream")
	resp, err := e.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.Header.Get("X-RateLimit-Limit") != "100" {
		t.Errorf("X-RateLimit-Limit %q on a streamed response", resp.Header.Get("X-RateLimit-Limit"))
	}
	br := bufio.NewReader(resp.Body)
	for i := 0; i < 3; i++ {
		line, err := br.ReadString('\n')
		if err != nil || line != "data: chunk\n" {
			t.Fatalf("chunk %d: %q %v", i, line, err)
		}
		_, _ = br.ReadString('\n')
		next <- struct{}{} // the upstream writes the next chunk only now
	}
}

// TestProxyUpstreamDown: a dead upstream is a 502 with a JSON error.
func TestProxyUpstreamDown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rules: proxyRules, config: func(c *gateway.Config) { c.Upstream = "http://" + testnet.FreeAddr(t) }})
	resp, body := e.proxyGet("/x", "sk_down")
	if resp.StatusCode != http.StatusBadGateway || !contains(body, `"UPSTREAM_UNAVAILABLE"`) {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
}

// TestProxyTrustedProxy: behind a trusted proxy the client IP is the first
// untrusted X-Forwarded-For hop from the right, and identity headers count.
func TestProxyTrustedProxy(t *testing.T) {
	t.Parallel()
	rules := `
keys:
  sk_reg: {tenant: acme}
rules:
  - {id: per-ip, scope: ip, match: {anonymous: true}, algorithm: token_bucket, capacity: 1, rate: 1/1h}
  - {id: tenant-t1, scope: tenant, match: {tenant: t1}, algorithm: token_bucket, capacity: 10, rate: 10/1h}
  - {id: costly, match: {api_key: "sk_cost*"}, algorithm: token_bucket, capacity: 10, rate: 10/1h}
`
	trusted := newEnv(t, envOptions{rules: rules, config: func(c *gateway.Config) {
		c.Identity.TrustedProxies = []string{"127.0.0.0/8"}
		c.Identity.TenantHeader = "X-Tenant"
		c.Identity.CostHeader = "X-Cost"
	}})
	get := func(e *env, hdr map[string]string) *http.Response {
		req, _ := http.NewRequest(http.MethodGet, "http://"+e.gw.addrs.Proxy+"/t", nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, _ := e.do(req)
		return resp
	}
	// Two clients behind the proxy: separate per-IP counters.
	for _, ip := range []string{"203.0.113.1", "203.0.113.2"} {
		if resp := get(trusted, map[string]string{"X-Forwarded-For": ip + ", 127.0.0.9"}); resp.StatusCode != 200 {
			t.Fatalf("client %s: %d", ip, resp.StatusCode)
		}
	}
	if resp := get(trusted, map[string]string{"X-Forwarded-For": "203.0.113.1"}); resp.StatusCode != 429 {
		t.Fatalf("client 203.0.113.1 again: %d", resp.StatusCode)
	}
	// Tenant header honoured; cost header honoured.
	resp := get(trusted, map[string]string{"X-API-Key": "sk_unreg", "X-Tenant": "t1"})
	if resp.Header.Get("X-RateLimit-Resource") != "tenant-t1" {
		t.Fatalf("tenant header ignored from a trusted proxy: %v", resp.Header)
	}
	resp = get(trusted, map[string]string{"X-API-Key": "sk_cost1", "X-Cost": "4"})
	if resp.Header.Get("X-RateLimit-Remaining") != "6" {
		t.Fatalf("cost header: remaining %q, want 6", resp.Header.Get("X-RateLimit-Remaining"))
	}
	if resp := get(trusted, map[string]string{"X-API-Key": "sk_cost1", "X-Cost": "x"}); resp.StatusCode != 400 {
		t.Fatalf("bad cost header: %d", resp.StatusCode)
	}

	// Without trust, the same headers are ignored: one socket peer.
	untrusted := newEnv(t, envOptions{rules: rules, config: func(c *gateway.Config) {
		c.Identity.TenantHeader = "X-Tenant"
		c.Identity.CostHeader = "X-Cost"
	}})
	if resp := get(untrusted, map[string]string{"X-Forwarded-For": "203.0.113.1"}); resp.StatusCode != 200 {
		t.Fatalf("untrusted 1: %d", resp.StatusCode)
	}
	if resp := get(untrusted, map[string]string{"X-Forwarded-For": "203.0.113.2"}); resp.StatusCode != 429 {
		t.Fatalf("untrusted XFF was believed: %d", resp.StatusCode)
	}
	if resp := get(untrusted, map[string]string{"X-API-Key": "sk_unreg", "X-Tenant": "t1"}); resp.Header.Get("X-RateLimit-Resource") != "" {
		t.Fatalf("untrusted tenant header was believed: %q", resp.Header.Get("X-RateLimit-Resource"))
	}
	if resp := get(untrusted, map[string]string{"X-API-Key": "sk_cost2", "X-Cost": "4"}); resp.Header.Get("X-RateLimit-Remaining") != "9" {
		t.Fatalf("untrusted cost header was believed: remaining %q", resp.Header.Get("X-RateLimit-Remaining"))
	}
}

// TestProxyCostResponseHeader: the upstream's cost header is charged after
// the response.
func TestProxyCostResponseHeader(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{
		rules: `
rules:
  - {id: tokens, match: {}, algorithm: token_bucket, capacity: 100, rate: 100/1h}
`,
		upstream: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Tokens-Used", "30")
			_, _ = io.WriteString(w, "answer")
		}),
		config: func(c *gateway.Config) { c.CostResponseHeader = "X-Tokens-Used" },
	})
	resp, body := e.proxyGet("/llm", "sk_llm")
	if resp.StatusCode != 200 || string(body) != "answer" || resp.Header.Get("X-RateLimit-Remaining") != "99" {
		t.Fatalf("%d %q remaining %q", resp.StatusCode, body, resp.Header.Get("X-RateLimit-Remaining"))
	}
	// 1 for the request, then 30 charged asynchronously.
	testwait.Eventually(t, 5*time.Second, func() error {
		_, d := e.check(map[string]any{"api_key": "sk_llm", "endpoint": "/llm", "cost": 0})
		if d.Remaining != 68 { // a peek shows what a cost of 1 would leave
			return fmt.Errorf("remaining %d, want 68", d.Remaining)
		}
		return nil
	})
}

// TestGracefulShutdown: cancelling Run stops accepting new connections but
// lets an in-flight proxied request finish.
func TestGracefulShutdown(t *testing.T) {
	t.Parallel()
	arrived := make(chan struct{})
	release := make(chan struct{})
	e := newEnv(t, envOptions{rules: proxyRules, upstream: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-release
		_, _ = io.WriteString(w, "finished")
	})})
	type result struct {
		status int
		body   string
		err    error
	}
	done := make(chan result, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodGet, "http://"+e.gw.addrs.Proxy+"/slow", nil)
		req.Header.Set("X-API-Key", "sk_slow")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		done <- result{resp.StatusCode, string(b), err}
	}()
	<-arrived
	e.gw.run.Cancel()
	// Shutdown has begun once the listener refuses new connections.
	testwait.Eventually(t, 5*time.Second, func() error {
		c, err := net.DialTimeout("tcp", e.gw.addrs.Proxy, time.Second)
		if err == nil {
			c.Close()
			return errors.New("the proxy still accepts connections")
		}
		return nil
	})
	select {
	case <-e.gw.run.Done():
		t.Fatalf("Run returned %v with a request in flight", e.gw.run.Wait())
	default:
	}
	close(release)
	r := <-done
	if r.err != nil || r.status != 200 || r.body != "finished" {
		t.Fatalf("in-flight request: %+v", r)
	}
	select {
	case <-e.gw.run.Done():
		if err := e.gw.run.Wait(); err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the drain")
	}
}
