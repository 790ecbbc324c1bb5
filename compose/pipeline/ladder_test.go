package pipeline_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/aggregator"
	"github.com/tollgate/tollgate/gateway"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/internal/testwait"
)

// ladderRules: one tenant, ci, with a storm key and a polite key, each
// with a token bucket of 5 refilling 5 a second.
const ladderRules = `keys:
  sk_fleet_storm: {tenant: ci}
  sk_fleet_polite: {tenant: ci}
rules:
  - id: demo
    match: {api_key: "sk_fleet_*"}
    algorithm: token_bucket
    capacity: 5
    rate: 5/1s
`

// httpClientFrom is an HTTP client whose connections come from source.
func httpClientFrom(source string) *http.Client {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}}).DialContext,
		MaxIdleConnsPerHost: 1,
	}
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// answers counts what a test client got.
type answers struct {
	ok, limited, penalty, blocked, closed, errs atomic.Int64
}

func (a *answers) String() string {
	return fmt.Sprintf("2xx %d, 429 %d, PENALTY %d, 403 %d, closed %d, errors %d",
		a.ok.Load(), a.limited.Load(), a.penalty.Load(), a.blocked.Load(), a.closed.Load(), a.errs.Load())
}

// loop sends GET /v1/x with key through proxy from source until ctx ends:
// at once after every answer (a storm), or, polite, every 100 ms and
// after waiting out each Retry-After.
func loop(ctx context.Context, proxy, source, key string, polite bool, a *answers) {
	c := httpClientFrom(source)
	defer c.CloseIdleConnections()
	for ctx.Err() == nil {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+proxy+"/v1/x", nil)
		req.Header.Set("X-API-Key", key)
		resp, err := c.Do(req)
		wait := time.Millisecond // a storm still lets a 2-core test machine breathe
		if polite {
			wait = 100 * time.Millisecond
		}
		if err != nil {
			if ctx.Err() == nil {
				a.errs.Add(1)
			}
		} else {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.Close {
				a.closed.Add(1)
			}
			switch {
			case resp.StatusCode == 200:
				a.ok.Add(1)
			case resp.StatusCode == 403:
				a.blocked.Add(1)
			case resp.StatusCode == 429 && resp.Header.Get("X-RateLimit-Limit") == "":
				a.penalty.Add(1)
			case resp.StatusCode == 429:
				a.limited.Add(1)
			}
			if ra, _ := strconv.Atoi(resp.Header.Get("Retry-After")); polite && ra > 0 {
				wait = time.Duration(ra) * time.Second
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}

// ladderLevel is where a gateway's controls put keyID on the ladder.
func ladderLevel(c *guard.ControlSet, keyID string, now int64) int {
	if e, ok := c.Blocked[keyID]; ok && e.Level > 0 && (e.Expiry == 0 || e.Expiry > now) {
		return e.Level
	}
	if p, ok := c.Penalties[keyID]; ok && p.Until > now {
		return p.Level
	}
	if o, ok := c.KeyOverrides[keyID]; ok && o.Level > 0 && (o.Expiry == 0 || o.Expiry > now) {
		return o.Level
	}
	return 0
}

// TestLadderEndToEnd: a client that ignores Retry-After through a
// gateway's proxy climbs the penalty ladder to its top — its decisions
// reach the aggregator through Kafka, each step reaches all three gateways
// through NATS KV within 2 s, each gateway logs each level once, and at
// the top the storm is answered at the connection level without Redis —
// while a polite client of the same tenant, through another gateway, never
// climbs.
func TestLadderEndToEnd(t *testing.T) {
	t.Parallel()
	// The upstream answers 200 to whatever the gateway lets through.
	upstream := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(upstream.Close)
	f := newFleetWith(t, 3, func(f *fleet) {
		f.events = true
		f.penalty = aggregator.PenaltyConfig{Window: 2 * time.Second, BackoffMinIgnored: 20, BackoffMinShare: 0.5,
			RejectionMinRequests: 50, RejectionRatio: 0.9, ReducedFor: time.Hour, CooldownFor: time.Hour,
			BlockFor: time.Hour, QuietPeriod: time.Hour, Grace: 500 * time.Millisecond}
		f.gwConfig = func(c *gateway.Config) {
			c.Listen, c.Upstream = "127.0.0.1:0", upstream.URL
			c.Offenders.ThrottleDelay = 100 * time.Millisecond
		}
	})
	f.waitRules(f.putRules(ladderRules), 5)
	g1, g2 := f.gws[0], f.gws[1]
	stormID := g1.srv.Guard().KeyID("sk_fleet_storm")
	politeID := g1.srv.Guard().KeyID("sk_fleet_polite")

	// Each gateway's first sight of each level of the storm key.
	type sight struct {
		mu   sync.Mutex
		seen [4]time.Time
	}
	sights := make([]*sight, len(f.gws))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for i, g := range f.gws {
		sights[i] = &sight{}
		c := g.srv.Guard().Controls()
		wg.Go(func() {
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case now := <-tick.C:
					level := ladderLevel(c.Snapshot(), stormID, now.UnixMicro())
					sights[i].mu.Lock()
					if level > 0 && sights[i].seen[level].IsZero() {
						sights[i].seen[level] = now
					}
					sights[i].mu.Unlock()
				}
			}
		})
	}

	var storm, polite answers
	wg.Go(func() { loop(ctx, g1.addrs.Proxy, "127.0.0.2", "sk_fleet_storm", false, &storm) })
	wg.Go(func() { loop(ctx, g2.addrs.Proxy, "127.0.0.3", "sk_fleet_polite", true, &polite) })

	// The aggregator climbs to the top; every gateway follows each step
	// within 2 s.
	type step struct {
		Time  time.Time `json:"time"`
		Level int       `json:"level"`
	}
	var hist []step
	took := testwait.Eventually(t, 90*time.Second, func() error {
		code, b := f.op("GET", "/admin/v1/penalties/sk_fleet_storm", "")
		var a struct {
			Level   int    `json:"level"`
			History []step `json:"history"`
		}
		if code != 200 || json.Unmarshal(b, &a) != nil {
			return fmt.Errorf("GET penalties: %d %s", code, b)
		}
		if a.Level != 3 || len(a.History) != 3 {
			return fmt.Errorf("storm key at level %d, history %+v (storm: %s)", a.Level, a.History, &storm)
		}
		hist = a.History
		return nil
	})
	t.Logf("the storm key reached level 3 %v after the storm started (storm: %s)", took, &storm)
	testwait.Eventually(t, 5*time.Second, func() error {
		for i, s := range sights {
			s.mu.Lock()
			seen := s.seen
			s.mu.Unlock()
			for _, h := range hist {
				if seen[h.Level].IsZero() {
					return fmt.Errorf("gateway %s has not enforced level %d", f.gws[i].id, h.Level)
				}
			}
		}
		return nil
	})
	for i, s := range sights {
		s.mu.Lock()
		for _, h := range hist {
			lag := s.seen[h.Level].Sub(h.Time)
			t.Logf("gateway %s enforced level %d %v after the step", f.gws[i].id, h.Level, lag.Round(time.Millisecond))
			if lag > 2*time.Second {
				t.Errorf("gateway %s enforced level %d %v after the step, want < 2 s", f.gws[i].id, h.Level, lag)
			}
		}
		s.mu.Unlock()
	}

	// At the top: 403 with Connection: close, the address throttled at
	// accept, and no Redis call for the storm's answers.
	testwait.Eventually(t, 10*time.Second, func() error {
		if storm.blocked.Load() == 0 || storm.closed.Load() == 0 || storm.penalty.Load() == 0 {
			return fmt.Errorf("storm answers: %s", &storm)
		}
		if n := f.metric(g1, `tollgate_accept_throttled_total{gateway="gw1",outcome="delayed"}`); n < 1 {
			return fmt.Errorf("no connection held at accept yet (%v)", n)
		}
		return nil
	})
	calls := f.metric(g1, `tollgate_redis_calls_total{gateway="gw1"}`)
	blocked := storm.blocked.Load()
	testwait.Eventually(t, 20*time.Second, func() error {
		if n := storm.blocked.Load() - blocked; n < 10 {
			return fmt.Errorf("%d more 403s so far", n)
		}
		return nil
	})
	if got := f.metric(g1, `tollgate_redis_calls_total{gateway="gw1"}`) - calls; got != 0 {
		t.Errorf("%v Redis calls for 10 answers at the top of the ladder, want 0", got)
	}
	cancel()

	// The polite client never climbed, nor was it closed or throttled.
	code, b := f.op("GET", "/admin/v1/penalties/sk_fleet_polite", "")
	if code != 200 || !strings.Contains(string(b), `"level": 0`) || strings.Contains(string(b), `"change"`) {
		t.Errorf("polite key: %d %s", code, b)
	}
	if polite.penalty.Load()+polite.blocked.Load()+polite.closed.Load() != 0 || polite.ok.Load() == 0 {
		t.Errorf("polite answers: %s; want no penalty, no close", &polite)
	}
	t.Logf("polite answers: %s", &polite)

	// Each gateway logged each level of the storm key once, and nothing of
	// the polite key.
	for _, g := range f.gws {
		logs := g.logs.String()
		for level := 1; level <= 3; level++ {
			want := fmt.Sprintf("key_id=%s level=%d ", stormID, level)
			n := 0
			for line := range strings.Lines(logs) {
				if strings.Contains(line, `msg="key penalised"`) && strings.Contains(line, want) {
					n++
				}
			}
			if n != 1 {
				t.Errorf("gateway %s logged %q %d times, want once:\n%s", g.id, want, n, logs)
			}
		}
		if strings.Contains(logs, politeID) || strings.Contains(logs, "sk_fleet_storm") {
			t.Errorf("gateway %s logged the polite key, or a raw key", g.id)
		}
	}
	if errs := storm.errs.Load(); errs > 0 {
		t.Logf("storm transport errors (closed connections racing a request): %d", errs)
	}
}
