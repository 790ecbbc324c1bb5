package pipeline_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/aggregator"
	"github.com/tollgate/tollgate/compose/kafkabroker/kafkatest"
	"github.com/tollgate/tollgate/compose/natsserver/natstest"
	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/gateway"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/internal/logtest"
	"github.com/tollgate/tollgate/internal/testwait"
)

var (
	fleetSizes   = flag.String("fleet-sizes", "10,50,200", "gateway counts BenchmarkFleetScale measures, comma-separated")
	fleetProfile = flag.String("fleet-cpuprofile", "", "write a CPU profile of BenchmarkFleetScale's changes to this file (the last size's; not the fleet's start, which -cpuprofile includes)")
)

// scaleFleet is one NATS server, one aggregator with its operator API
// (on a Kafka-protocol broker), one Redis, and gateways in fleet mode in
// this process. The gateways share nothing but NATS and Redis: each has
// its own guard, rules syncer, controls, NATS connection, KV watchers and
// state directory (its last-known-good copy).
type scaleFleet struct {
	tb     testing.TB
	admin  string
	client *http.Client
	gws    []*gateway.Server
	stops  []func()
}

func newScaleFleet(tb testing.TB, n int) *scaleFleet {
	tb.Helper()
	f := &scaleFleet{tb: tb, client: &http.Client{Timeout: 30 * time.Second}}
	tb.Cleanup(f.client.CloseIdleConnections)
	redisAddr := redistest.StartTB(tb).Addr()
	ns := natstest.StartTB(tb)
	rulesFile := filepath.Join(tb.TempDir(), "rules.yaml")
	if err := os.WriteFile(rulesFile, []byte(fleetRules(3)), 0o600); err != nil {
		tb.Fatal(err)
	}
	kb := kafkatest.StartTB(tb)
	cfg := aggregator.Config{Listen: "127.0.0.1:0", MetricsListen: aggregator.Off, ID: "agg", DataDir: tb.TempDir(),
		AdminToken: token, KeySecret: secret, SessionTimeout: 2 * time.Second}
	cfg.Kafka.Brokers = kb.Addrs()
	cfg.NATS.URL = ns.ClientURL()
	cfg.Redis = configs.Redis{Addrs: []string{redisAddr}, Timeout: 2 * time.Second}
	agg, _ := runAggregator(tb, cfg, logtest.Verbose(tb).With("part", "aggregator"))
	f.admin = agg.Addrs().API
	waitOperatorAPI(tb, f.op)
	f.op("PUT", "/admin/v1/rules", fleetRules(5))

	dataDir := tb.TempDir()
	var wg sync.WaitGroup
	tb.Cleanup(func() {
		// Stopped together: one at a time, 200 gateways' shutdowns add up.
		var stopping sync.WaitGroup
		for _, stop := range f.stops {
			stopping.Go(stop)
		}
		stopping.Wait()
		wg.Wait()
	})
	for i := range n {
		id := fmt.Sprintf("gw%d", i+1)
		c := gateway.Config{APIListen: "127.0.0.1:0", MetricsListen: gateway.Off, GRPCListen: gateway.Off,
			RulesFile: rulesFile, KeySecret: secret, GatewayID: id, DataDir: dataDir,
			Redis: configs.Redis{Addrs: []string{redisAddr}, Timeout: 2 * time.Second}}
		c.NATS.URL = ns.ClientURL()
		srv, err := gateway.New(c, logtest.Verbose(tb).With("part", id))
		if err != nil {
			tb.Fatal(err)
		}
		gctx, gcancel := context.WithCancel(context.Background())
		gdone := make(chan error, 1)
		wg.Go(func() { gdone <- srv.Run(gctx) })
		f.gws = append(f.gws, srv)
		f.stops = append(f.stops, func() {
			gcancel()
			if err := <-gdone; err != nil {
				tb.Errorf("gateway %s: %v", id, err)
			}
		})
	}
	// Every gateway enforces the operator API's ruleset (capacity 5).
	testwait.Eventually(tb, 60*time.Second, func() error {
		for i, g := range f.gws {
			d, err := g.Guard().Peek(context.Background(), &guard.Request{Key: "sk_fleet_probe", Path: "/v1/x"})
			if err != nil {
				return err
			}
			if d.Deciding < 0 || d.Rules[d.Deciding].Limit != 5 {
				return fmt.Errorf("gw%d does not enforce the fleet's ruleset yet", i+1)
			}
		}
		return nil
	})
	return f
}

// op calls the operator API.
func (f *scaleFleet) op(method, path, body string) (int, []byte) {
	f.tb.Helper()
	return operatorCall(f.tb, f.client, f.admin, token, method, path, body)
}

// waitOperatorAPI waits until the operator API op calls answers.
func waitOperatorAPI(tb testing.TB, op func(method, path, body string) (int, []byte)) {
	tb.Helper()
	testwait.Eventually(tb, 20*time.Second, func() error {
		if code, b := op("GET", "/admin/v1/rules/versions", ""); code != 200 {
			return fmt.Errorf("operator API: %d %s", code, b)
		}
		return nil
	})
}

// operatorCall calls the operator API at admin with the bearer token tok
// and returns the status and body; a failed call fails the test.
func operatorCall(tb testing.TB, client *http.Client, admin, tok, method, path, body string) (int, []byte) {
	tb.Helper()
	req, err := http.NewRequest(method, "http://"+admin+path, strings.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := client.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// scaleTimes are, per change, the time from the operator API's answer to
// enforcement on every gateway (0 when all enforced it before the answer).
type scaleTimes struct{ rule, block []time.Duration }

// measure makes n rule changes (the limit of rule demo) and n blocklist
// entries through the operator API and waits, after each, until every
// gateway's guard enforces it. The wait polls, every 200µs, what each
// pending gateway's guard decides with — its ruleset and its controls,
// read as a decision reads them (an atomic load and a map read, nothing
// else) — so that polling 200 gateways costs microseconds; a Peek per
// gateway and poll would cost a Redis round trip each (tens of
// milliseconds for a poll of 200 on two loaded cores) and measure
// itself. Once all enforce it, one Peek per gateway (not timed) checks
// that their decisions do.
func (f *scaleFleet) measure(n int) scaleTimes {
	ctx := context.Background()
	enforced := func(probe func(*guard.Guard) bool) time.Time {
		tick := time.NewTicker(200 * time.Microsecond)
		defer tick.Stop()
		deadline := time.Now().Add(30 * time.Second)
		pending := slices.Clone(f.gws)
		for len(pending) > 0 {
			pending = slices.DeleteFunc(pending, func(g *gateway.Server) bool { return probe(g.Guard()) })
			if time.Now().After(deadline) {
				f.tb.Fatalf("%d of %d gateways do not enforce the change after 30s", len(pending), len(f.gws))
			}
			if len(pending) > 0 {
				<-tick.C
			}
		}
		return time.Now()
	}
	decides := func(what string, req *guard.Request, cond func(*guard.Decision) bool) {
		for i, g := range f.gws {
			d, err := g.Guard().Peek(ctx, req)
			if err != nil || !cond(d) {
				f.tb.Fatalf("gw%d: %s in force but not decided: %+v, %v", i+1, what, d, err)
			}
		}
	}
	var out scaleTimes
	for i := range n {
		limit := int64(100 + i)
		if code, b := f.op("PUT", "/admin/v1/rules", fleetRules(int(limit))); code != 200 {
			f.tb.Fatalf("PUT rules: %d %s", code, b)
		}
		answered := time.Now()
		at := enforced(func(g *guard.Guard) bool {
			r := g.Rules().Rule("demo")
			return r != nil && r.Params.Limit == limit
		})
		out.rule = append(out.rule, max(0, at.Sub(answered)))
		decides("rule change", &guard.Request{Key: "sk_fleet_probe", Path: "/v1/x"},
			func(d *guard.Decision) bool { return d.Deciding >= 0 && d.Rules[d.Deciding].Limit == limit })

		key := "sk_fleet_blk" + strconv.Itoa(i)
		if code, b := f.op("PUT", "/admin/v1/blocklist/"+key, `{"ttl":"1m","reason":"propagation"}`); code != 200 {
			f.tb.Fatalf("PUT blocklist: %d %s", code, b)
		}
		answered = time.Now()
		at = enforced(func(g *guard.Guard) bool {
			_, blocked := g.Controls().BlockEntry(g.KeyID(key))
			return blocked
		})
		out.block = append(out.block, max(0, at.Sub(answered)))
		decides("blocklist entry", &guard.Request{Key: key, Path: "/v1/x"}, func(d *guard.Decision) bool { return d.Status == 403 })
	}
	return out
}

// startCPUProfile starts a CPU profile written to path; the returned
// function stops it.
func startCPUProfile(tb testing.TB, path string) func() {
	tb.Helper()
	fh, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	if err := pprof.StartCPUProfile(fh); err != nil {
		_ = fh.Close()
		tb.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := fh.Close(); err != nil {
			tb.Error(err)
		}
	}
}

// nearestRank returns the p-th percentile (nearest rank) of ds.
func nearestRank(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(p/100*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// BenchmarkFleetScale measures rule and blocklist propagation to 10, 50
// and 200 gateways on one NATS server (docs/benchmarks.md):
//
//	go test ./compose/pipeline -run '^$' -bench FleetScale -benchtime 50x -timeout 15m
//	go test ./compose/pipeline -run '^$' -bench FleetScale -benchtime 50x -fleet-sizes 200 -fleet-cpuprofile cpu.out
//
// Each iteration changes the limit of a rule and blocks a new key through
// the operator API. Metrics, in milliseconds, from the API's answer to
// enforcement on every gateway: rule-p50-ms, rule-p99-ms, block-p50-ms,
// block-p99-ms.
func BenchmarkFleetScale(b *testing.B) {
	for _, s := range strings.Split(*fleetSizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			b.Fatalf("-fleet-sizes: %q is not a gateway count", s)
		}
		b.Run(fmt.Sprintf("gateways=%d", n), func(b *testing.B) {
			f := newScaleFleet(b, n)
			b.ResetTimer()
			if *fleetProfile != "" {
				stop := startCPUProfile(b, *fleetProfile)
				defer stop()
			}
			times := f.measure(b.N)
			b.StopTimer()
			ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
			b.ReportMetric(ms(nearestRank(times.rule, 50)), "rule-p50-ms")
			b.ReportMetric(ms(nearestRank(times.rule, 99)), "rule-p99-ms")
			b.ReportMetric(ms(nearestRank(times.block, 50)), "block-p50-ms")
			b.ReportMetric(ms(nearestRank(times.block, 99)), "block-p99-ms")
		})
	}
}

// TestFleetScalePropagation: a rule change and a blocklist entry reach
// each of 10 gateways on one NATS within the propagation bound (2 s at
// p99); BenchmarkFleetScale gives the figures at 10, 50 and 200.
func TestFleetScalePropagation(t *testing.T) {
	t.Parallel()
	f := newScaleFleet(t, 10)
	times := f.measure(5)
	for _, m := range []struct {
		what string
		ds   []time.Duration
	}{{"rule change", times.rule}, {"blocklist entry", times.block}} {
		p99 := nearestRank(m.ds, 99)
		t.Logf("%s, 10 gateways: p50 %v, p99 %v after the API's answer", m.what, nearestRank(m.ds, 50), p99)
		if p99 > 2*time.Second {
			t.Errorf("%s: p99 %v, want < 2s", m.what, p99)
		}
	}
}
