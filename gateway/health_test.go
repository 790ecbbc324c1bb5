package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/compose/kafkabroker/kafkatest"
	"github.com/tollgate/tollgate/compose/natsserver/natstest"
	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/gateway"
	"github.com/tollgate/tollgate/internal/logtest"
	"github.com/tollgate/tollgate/internal/testnet"
	"github.com/tollgate/tollgate/internal/testwait"
)

// healthBudget is how long /healthz and /readyz may take to answer,
// whatever the dependencies do.
const healthBudget = time.Second

// readyzBody is the /readyz body as these tests read it.
type readyzBody struct {
	Status string `json:"status"`
	Redis  struct {
		Status string     `json:"status"`
		Error  string     `json:"error"`
		Since  *time.Time `json:"since"`
	} `json:"redis"`
	NATS *struct {
		Status string     `json:"status"`
		Since  *time.Time `json:"since"`
	} `json:"nats"`
	Kafka *struct {
		Status string     `json:"status"`
		Since  *time.Time `json:"since"`
		Error  string     `json:"error"`
	} `json:"kafka"`
	Missing []string `json:"missing"`
}

// since returns the since of dependency dep in r, or nil.
func (r *readyzBody) since(dep string) *time.Time {
	switch {
	case dep == "redis":
		return r.Redis.Since
	case dep == "nats" && r.NATS != nil:
		return r.NATS.Since
	case dep == "kafka" && r.Kafka != nil:
		return r.Kafka.Since
	}
	return nil
}

// slowestProbe is the longest a /healthz or /readyz answer took in these
// tests, for the log.
var slowestProbe atomic.Int64

// probe reads /healthz and /readyz of metrics, failing the test when
// either takes longer than healthBudget, and returns /readyz's answer.
func probe(t testing.TB, metrics string) (int, readyzBody) {
	t.Helper()
	client := &http.Client{Timeout: 2 * healthBudget}
	defer client.CloseIdleConnections()
	get := func(path string) (int, []byte) {
		start := time.Now()
		resp, err := client.Get("http://" + metrics + path)
		var body []byte
		if err == nil {
			body, err = io.ReadAll(resp.Body)
			_ = resp.Body.Close()
		}
		took := time.Since(start)
		if err != nil || took > healthBudget {
			t.Fatalf("GET %s: answered in %v (at most %v): %v", path, took, healthBudget, err)
		}
		for {
			old := slowestProbe.Load()
			if int64(took) <= old || slowestProbe.CompareAndSwap(old, int64(took)) {
				break
			}
		}
		return resp.StatusCode, body
	}
	if code, body := get("/healthz"); code != 200 || string(body) != "ok\n" {
		t.Fatalf("healthz: %d %q", code, body)
	}
	code, body := get("/readyz")
	var r readyzBody
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatalf("readyz: %d %q: %v", code, body, err)
	}
	return code, r
}

// waitMissing probes until /readyz names dep as missing, since a time not
// after now, while staying ready (200).
func waitMissing(t testing.TB, metrics, dep string) readyzBody {
	t.Helper()
	var r readyzBody
	testwait.Eventually(t, 20*time.Second, func() error {
		var code int
		code, r = probe(t, metrics)
		if code != 200 || r.Status != "ready" {
			t.Fatalf("readyz %d %+v with %s missing: want 200 ready", code, r, dep)
		}
		if !slices.Contains(r.Missing, dep) {
			return fmt.Errorf("readyz names %v missing, not %s", r.Missing, dep)
		}
		if s := r.since(dep); s == nil || s.After(time.Now()) {
			return fmt.Errorf("readyz names %s missing since %v", dep, s)
		}
		return nil
	})
	return r
}

// waitPresent probes until /readyz names nothing missing.
func waitPresent(t testing.TB, metrics string) {
	t.Helper()
	testwait.Eventually(t, 20*time.Second, func() error {
		code, r := probe(t, metrics)
		if code != 200 || len(r.Missing) != 0 {
			return fmt.Errorf("readyz %d, missing %v", code, r.Missing)
		}
		return nil
	})
}

// blackhole listens on addr, accepts connections and never answers: a
// host that hangs. It stops at the test's end.
func blackhole(t testing.TB, addr string) {
	t.Helper()
	var ln net.Listener
	testwait.Eventually(t, 10*time.Second, func() error { // the port may linger a moment
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	})
	testnet.Serve(t, ln, nil)
}

// TestHealthUnderFaults starts gateways with Redis, NATS or Kafka down,
// and loses each while a gateway runs: /healthz and /readyz always answer
// within a second, /readyz stays 200 (the gateway keeps deciding) and
// names what is missing, and since when.
func TestHealthUnderFaults(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		dep  string
		// setup returns the gateway's configuration changes and, for a
		// dependency lost later, what loses it (nil: down from the start).
		setup func(t *testing.T) (mutate func(*gateway.Config), lose func(g *runningGateway))
	}{
		{"redis down at start", "redis", func(t *testing.T) (func(*gateway.Config), func(*runningGateway)) {
			// A Redis that accepts and never answers.
			addr := testnet.FreeAddr(t)
			blackhole(t, addr)
			return func(c *gateway.Config) { c.Redis = redisConfig(addr) }, nil
		}},
		{"redis lost later", "redis", func(t *testing.T) (func(*gateway.Config), func(*runningGateway)) {
			rs := redistest.StartTB(t)
			return func(c *gateway.Config) { c.Redis = redisConfig(rs.Addr()) }, func(*runningGateway) {
				if err := rs.Pause(); err != nil { // SIGSTOP: calls hang
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = rs.Resume() })
			}
		}},
		{"nats down at start", "nats", func(t *testing.T) (func(*gateway.Config), func(*runningGateway)) {
			// A NATS that accepts and never says hello: the client waits
			// for each handshake holding its connection's lock.
			addr := testnet.FreeAddr(t)
			blackhole(t, addr)
			return func(c *gateway.Config) { c.NATS.URL = "nats://" + addr }, nil
		}},
		{"nats lost later", "nats", func(t *testing.T) (func(*gateway.Config), func(*runningGateway)) {
			ns := natstest.StartTB(t)
			return func(c *gateway.Config) { c.NATS.URL = ns.ClientURL() }, func(*runningGateway) {
				if err := ns.Down(); err != nil {
					t.Fatal(err)
				}
				blackhole(t, ns.Addr())
			}
		}},
		{"kafka down at start", "kafka", func(t *testing.T) (func(*gateway.Config), func(*runningGateway)) {
			addr := testnet.FreeAddr(t)
			return func(c *gateway.Config) { c.Kafka.Brokers = []string{addr} }, nil
		}},
		{"kafka lost later", "kafka", func(t *testing.T) (func(*gateway.Config), func(*runningGateway)) {
			kb := kafkatest.StartTB(t)
			return func(c *gateway.Config) { c.Kafka.Brokers = kb.Addrs() }, func(g *runningGateway) {
				if err := kb.Down(); err != nil {
					t.Fatal(err)
				}
				// The producer learns of Kafka through the events it sends.
				sendChecks(t, g, 20)
			}
		}},
	}
	t.Cleanup(func() { t.Logf("slowest /healthz or /readyz answer: %v", time.Duration(slowestProbe.Load())) })
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			mutate, lose := tc.setup(t)
			e := &env{t: t, client: &http.Client{Timeout: 10 * time.Second}}
			t.Cleanup(e.client.CloseIdleConnections)
			e.rulesPath = filepath.Join(t.TempDir(), "rules.yaml")
			e.writeRules(proxyRules)
			cfg := gateway.Config{
				APIListen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0", GRPCListen: gateway.Off,
				RulesFile: e.rulesPath, KeySecret: testSecret, GatewayID: "health-" + tc.dep,
				DataDir: t.TempDir(),
			}
			if tc.dep != "redis" {
				cfg.Redis = redisConfig(redistest.StartTB(t).Addr())
			}
			mutate(&cfg)
			srv, err := gateway.New(cfg, logtest.Warnings(t))
			if err != nil {
				t.Fatal(err)
			}
			g := run(t, srv)
			// At once, and at every probe: an answer within the budget.
			probe(t, g.addrs.Metrics)
			if lose != nil {
				waitPresent(t, g.addrs.Metrics)
				lost := time.Now()
				lose(g)
				r := waitMissing(t, g.addrs.Metrics, tc.dep)
				if s := r.since(tc.dep); s.Before(lost.Add(-time.Second)) {
					t.Fatalf("%s missing since %v, lost at %v", tc.dep, s, lost)
				}
				t.Logf("readyz: %+v", r)
				return
			}
			r := waitMissing(t, g.addrs.Metrics, tc.dep)
			t.Logf("readyz: %+v", r)
			// It keeps deciding.
			if resp, _ := e.post(g, "/v1/check", map[string]any{"api_key": "sk_health", "endpoint": "/x"}, nil); resp.StatusCode != 200 && resp.StatusCode != 429 {
				t.Fatalf("check with %s missing: %d", tc.dep, resp.StatusCode)
			}
		})
	}
}

// sendChecks makes n decisions through g's check API.
func sendChecks(t testing.TB, g *runningGateway, n int) {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	for range n {
		req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://"+g.addrs.API+"/v1/check",
			strings.NewReader(`{"api_key":"sk_health","endpoint":"/x"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
}

// TestRedisHealthFromTraffic: while its decisions' calls to Redis are
// answered, a gateway sends Redis no PING of its own (they show Redis
// answering); idle, it pings again; and a Redis that dies under traffic is
// named missing in /readyz within the monitor's period and redis.timeout.
func TestRedisHealthFromTraffic(t *testing.T) {
	t.Parallel()
	rs := redistest.StartTB(t)
	const timeout = 200 * time.Millisecond
	e := newEnv(t, envOptions{redisAddr: rs.Addr(), rules: proxyRules,
		config: func(c *gateway.Config) { c.Redis.Timeout = timeout }})
	waitPresent(t, e.gw.addrs.Metrics)
	rc := rs.Client()
	t.Cleanup(func() { _ = rc.Close() })
	pings := func() int {
		t.Helper()
		info, err := rc.Info(context.Background(), "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.SplitSeq(info, "\r\n") {
			if rest, ok := strings.CutPrefix(line, "cmdstat_ping:calls="); ok {
				n, _, _ := strings.Cut(rest, ",")
				var calls int
				if _, err := fmt.Sscan(n, &calls); err != nil {
					t.Fatalf("commandstats %q: %v", line, err)
				}
				return calls
			}
		}
		return 0
	}
	// traffic sends checks of distinct keys (each one a Redis call) from
	// two clients until stop is closed.
	traffic := func(stop <-chan struct{}) *sync.WaitGroup {
		var wg sync.WaitGroup
		for c := range 2 {
			wg.Go(func() {
				client := &http.Client{Timeout: 10 * time.Second}
				defer client.CloseIdleConnections()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					body := fmt.Sprintf(`{"api_key":"sk_traffic_%d_%d","endpoint":"/x"}`, c, i)
					resp, err := client.Post("http://"+e.gw.addrs.API+"/v1/check", "application/json", strings.NewReader(body))
					if err != nil {
						t.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
				}
			})
		}
		return &wg
	}

	// Idle: the monitor pings (twice a second).
	before := pings()
	testwait.Eventually(t, 10*time.Second, func() error {
		if n := pings() - before; n < 2 {
			return fmt.Errorf("%d PINGs from an idle gateway", n)
		}
		return nil
	})

	// Deciding: three seconds (six checks of the monitor), six PINGs
	// without traffic. Two are allowed, for checks that find no call
	// answered since the last because the loaded machine stalled the
	// traffic (TestRedisMonitorPassive checks the rule itself).
	stop := make(chan struct{})
	wg := traffic(stop)
	sendChecks(t, e.gw, 5)
	before = pings()
	for start := time.Now(); time.Since(start) < 3*time.Second; {
		sendChecks(t, e.gw, 1)
	}
	during := pings() - before
	close(stop)
	wg.Wait()
	t.Logf("PINGs in 3 s of traffic: %d", during)
	if during > 2 {
		t.Errorf("%d PINGs in 3 s while the gateway's calls to Redis were answered, want none", during)
	}
	if code, r := probe(t, e.gw.addrs.Metrics); code != 200 || len(r.Missing) != 0 || r.Redis.Status != "ok" {
		t.Fatalf("readyz after traffic: %d %+v", code, r)
	}

	// Redis dies under traffic: the failed calls make the monitor ping,
	// and the PING fails.
	stop = make(chan struct{})
	wg = traffic(stop)
	defer wg.Wait()
	defer close(stop)
	sendChecks(t, e.gw, 5)
	killed := time.Now()
	if err := rs.Kill(); err != nil {
		t.Fatal(err)
	}
	r := waitMissing(t, e.gw.addrs.Metrics, "redis")
	seen := time.Since(killed)
	t.Logf("Redis killed under traffic: /readyz says degraded after %v (since %v): %+v", seen, r.Redis.Since.Sub(killed), r.Redis)
	// The bound is the monitor's period and the PING's timeout; the
	// loaded machine gets a generous margin.
	if seen > 5*time.Second {
		t.Errorf("a dead Redis named missing after %v", seen)
	}
}
