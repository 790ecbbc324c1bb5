// Command scenario replays the scenarios of docs/benchmarks.md against real processes
// (redis-server and bin/gateway, started on free loopback ports) and
// prints their figures:
//
//	burst   trading-bot burst: one key, token bucket 100 at 100/min,
//	        500 requests as fast as possible through the check API; then
//	        the bot waits out its Retry-After and goes on at the sustainable
//	        rate
//	zipf    Zipfian fleet: a million keys, Zipf-distributed, over
//	        three gateway processes (Envoy RLS), a 100-per-day fixed window:
//	        throughput, latency, Redis calls per check, fast-path hit rate,
//	        over-admission and false rejections against the exact oracle
//	hotkey  hot key: one key far over its limit beside normal traffic
//	        at a moderate fixed rate: the normal keys' latency with and
//	        without it
//	regions one global limit over several regions (each its own
//	        redis-server and gateway, and with -agents its own NATS linked
//	        to the others, Kafka broker and aggregator lending unused units
//	        between regions): a client rotating the regions at
//	        10 × L, a client moving region, split traffic at 90 % of L, a
//	        partition and latency on every link; the exact judge counts
//	        over-admission and false rejections
//
//	scenario -scenario burst|zipf|hotkey|regions [-gateway bin/gateway] [-duration 20s]
//
// make loadtest SCENARIO=… builds the binaries and runs it.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tollgate/tollgate/compose/redisserver"
	"github.com/tollgate/tollgate/loadtest"
	"github.com/tollgate/tollgate/loadtest/internal/cmdstats"
	"github.com/tollgate/tollgate/loadtest/internal/fleet"
	"github.com/tollgate/tollgate/loadtest/internal/procstat"
)

type options struct {
	scenario, gateway string
	duration          time.Duration
	keys              int
	workers           int
	gateways          int
	regions           regionsOptions
}

func main() {
	var o options
	flag.StringVar(&o.scenario, "scenario", "", "burst, zipf, hotkey or regions (required)")
	flag.StringVar(&o.gateway, "gateway", "bin/gateway", "gateway binary (make build)")
	flag.DurationVar(&o.duration, "duration", 20*time.Second, "length of a load phase (zipf, hotkey)")
	flag.IntVar(&o.keys, "keys", 1_000_000, "zipf: distinct keys")
	flag.IntVar(&o.workers, "workers", 60, "zipf: closed-loop workers over all gateways")
	flag.IntVar(&o.gateways, "gateways", 3, "zipf: gateway processes")
	flag.IntVar(&o.regions.regions, "regions", 2, "regions: how many regions")
	flag.Int64Var(&o.regions.limit, "regions-limit", 50, "regions: the global rule's limit L per window")
	flag.DurationVar(&o.regions.window, "regions-window", time.Second, "regions: the global rule's fixed window (at least 400ms)")
	flag.DurationVar(&o.regions.phase, "regions-phase", 15*time.Second, "regions: length of each load phase")
	flag.DurationVar(&o.regions.partition, "regions-partition", 60*time.Second, "regions: length of the partition")
	flag.DurationVar(&o.regions.latency, "regions-latency", 100*time.Millisecond, "regions: latency added on every link")
	flag.DurationVar(&o.regions.redisTimeout, "regions-redis-timeout", time.Second, "regions: the gateways' Redis deadline (TOLLGATE_REDIS_TIMEOUT; a call past it fails open and is not judged), and the aggregators'")
	flag.BoolVar(&o.regions.json, "json", false, "regions: print the summary as JSON")
	flag.BoolVar(&o.regions.agents, "agents", true, "regions: run each region's NATS (linked), Kafka and aggregator so that shares follow demand; false: static shares")
	flag.DurationVar(&o.regions.period, "regions-period", 500*time.Millisecond, "regions: the aggregators' and gateways' regions_period (TOLLGATE_REGIONS_PERIOD) with -agents")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch o.scenario {
	case "burst":
		err = burst(ctx, o, log, os.Stdout)
	case "zipf":
		err = zipf(ctx, o, log, os.Stdout)
	case "hotkey":
		err = hotkey(ctx, o, log, os.Stdout)
	case "regions":
		var sum *regionsSummary
		if sum, err = regionsScenario(ctx, o, o.regions, log, os.Stdout); err == nil {
			err = sum.overAdmitted()
		}
	default:
		fmt.Fprintln(os.Stderr, "scenario: -scenario must be burst, zipf, hotkey or regions")
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "scenario:", err)
		os.Exit(1)
	}
}

// stack is a Redis and the gateways started on it; close stops them all.
type stack struct {
	dir      string
	redis    *redisserver.Server
	gateways []*fleet.Process
}

func (s *stack) close() {
	for _, g := range s.gateways {
		g.Stop()
	}
	if s.redis != nil {
		_ = s.redis.Stop()
	}
	if s.dir != "" {
		_ = os.RemoveAll(s.dir)
	}
}

func start(ctx context.Context, o options, log *slog.Logger, rules string, n int, api bool) (*stack, error) {
	s := &stack{}
	var err error
	if s.dir, err = os.MkdirTemp("", "tollgate-scenario-"); err != nil {
		return s, err
	}
	if s.redis, err = fleet.StartRedis(ctx, log); err != nil {
		return s, err
	}
	for i := range n {
		g, err := fleet.StartGateway(ctx, fleet.Gateway{
			Bin: o.gateway, Dir: s.dir, Name: fmt.Sprintf("gw%d", i+1), Rules: rules,
			Redis: s.redis.Addr(), API: api, Metrics: true,
		})
		if g != nil {
			s.gateways = append(s.gateways, g)
		}
		if err != nil {
			return s, err
		}
	}
	return s, nil
}

// checkAnswer is the part of a check API answer the bot reads.
type checkAnswer struct {
	Allowed    bool  `json:"allowed"`
	Remaining  int64 `json:"remaining"`
	RetryAfter int64 `json:"retry_after"`
	// Degraded: decided without Redis (failing open).
	Degraded bool `json:"degraded"`
}

func check(ctx context.Context, c *http.Client, api, key string) (checkAnswer, error) {
	body, _ := json.Marshal(map[string]any{"api_key": key, "endpoint": "/v1/orders", "method": "POST"})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+api+"/v1/check", bytes.NewReader(body))
	if err != nil {
		return checkAnswer{}, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return checkAnswer{}, err
	}
	defer resp.Body.Close()
	var a checkAnswer
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		return a, err
	}
	return a, nil
}

// burst is the trading-bot burst.
func burst(ctx context.Context, o options, log *slog.Logger, out io.Writer) error {
	const rules = "rules:\n  - {id: bot, match: {}, algorithm: token_bucket, capacity: 100, rate: 100/1m}\n"
	s, err := start(ctx, o, log, rules, 1, true)
	defer s.close()
	if err != nil {
		return err
	}
	gw := s.gateways[0]
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	const key, total, workers = "sk_prod_bot", 500, 20
	calls0, err := scriptCalls(ctx, s.redis.Addr())
	if err != nil {
		return err
	}
	type answer struct {
		checkAnswer
		at time.Time // when the answer came back
	}
	answers := make([]answer, 0, total)
	var mu sync.Mutex
	var next atomic.Int64
	var wg sync.WaitGroup
	var firstErr error
	began := time.Now()
	for range workers {
		wg.Go(func() {
			for next.Add(1) <= total {
				a, err := check(ctx, c, gw.API, key)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				answers = append(answers, answer{a, time.Now()})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	lasted := time.Since(began)
	calls1, _ := scriptCalls(ctx, s.redis.Addr())
	admitted, rejected, noRetry := 0, 0, 0
	var resume time.Time
	for _, a := range answers {
		if a.Allowed {
			admitted++
			continue
		}
		rejected++
		if a.RetryAfter < 1 {
			noRetry++
		}
		if t := a.at.Add(time.Duration(a.RetryAfter) * time.Second); t.After(resume) {
			resume = t
		}
	}
	refill := 600 * time.Millisecond
	low, high := 100+int(lasted/refill)-1, 100+int(lasted/refill)+1
	fmt.Fprintf(out, "burst: %d requests from %d workers in %v: %d admitted, %d rejected (429), %d without Retry-After\n",
		total, workers, lasted.Round(time.Millisecond), admitted, rejected, noRetry)
	fmt.Fprintf(out, "burst: the model admits 100 + one per 0.6 s of burst: %d..%d for %v measured from the client\n", low, high, lasted.Round(time.Millisecond))
	fmt.Fprintf(out, "burst: %d Redis calls for %d decisions (%.3f per rejection at most)\n", calls1-calls0, total, float64(calls1-calls0)/float64(max(rejected, 1)))

	// The bot waits out the longest Retry-After it was given, then goes on
	// at the sustainable rate, one request per 0.6 s.
	if d := time.Until(resume); d > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
		}
	}
	steadyRejected := 0
	const steady = 15
	for i := range steady {
		a, err := check(ctx, c, gw.API, key)
		if err != nil {
			return err
		}
		if !a.Allowed {
			steadyRejected++
		}
		if i < steady-1 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(refill):
			}
		}
	}
	fmt.Fprintf(out, "burst: after waiting out Retry-After, %d requests at one per 0.6 s: %d rejected\n", steady, steadyRejected)
	if admitted < low || admitted > high || noRetry > 0 || steadyRejected > 0 {
		return fmt.Errorf("burst: admitted %d (want %d..%d), %d 429s without Retry-After, %d rejected at the sustainable rate", admitted, low, high, noRetry, steadyRejected)
	}
	return nil
}

// counts is requests and admissions per key.
type counts struct {
	mu sync.Mutex
	m  map[string]*[2]int64
}

func (c *counts) add(key, outcome string) {
	c.mu.Lock()
	n := c.m[key]
	if n == nil {
		n = new([2]int64)
		c.m[key] = n
	}
	n[0]++
	if outcome == "OK" {
		n[1]++
	}
	c.mu.Unlock()
}

// zipf is the Zipfian fleet.
func zipf(ctx context.Context, o options, log *slog.Logger, out io.Writer) error {
	const limit = 100
	// A fixed window of a day, aligned to midnight UTC: the run must stay
	// inside one window for the oracle (at most limit admissions per key)
	// to be exact.
	now := time.Now().UTC()
	if end := now.Truncate(24 * time.Hour).Add(24 * time.Hour); end.Sub(now) < 2*o.duration+time.Minute {
		return fmt.Errorf("zipf: too close to midnight UTC (the window's end); run it later")
	}
	rules := fmt.Sprintf("rules:\n  - {id: per-key, match: {}, algorithm: fixed_window, limit: %d, window: 1d}\n", limit)
	s, err := start(ctx, o, log, rules, o.gateways, false)
	defer s.close()
	if err != nil {
		return err
	}
	var addrs []string
	before := map[string]float64{}
	for _, g := range s.gateways {
		addrs = append(addrs, g.GRPC)
		m, err := fleet.Counters(ctx, g.Metrics, "tollgate_fastpath_total", "result")
		if err != nil {
			return err
		}
		for k, v := range m {
			before[k] += v
		}
	}
	cpu0 := fleetCPU(s.gateways)
	deg0 := degraded(ctx, s.gateways)
	c := &counts{m: map[string]*[2]int64{}}
	cfg := loadtest.DefaultConfig()
	cfg.Target = loadtest.TargetGRPC
	cfg.Addr = join(addrs)
	cfg.Domain = "zipf"
	cfg.Workers = o.workers
	cfg.Keys = o.keys
	cfg.Dist = "zipf"
	cfg.KeyPrefix = "sk_zipf_"
	cfg.Paths = []string{"/v1/items"}
	cfg.Duration = o.duration
	cfg.Redis = []string{s.redis.Addr()}
	cfg.OnAnswer = c.add
	sum, err := loadtest.Run(ctx, cfg, nil)
	if err != nil {
		return err
	}
	cpu := fleetCPU(s.gateways) - cpu0
	deg := degraded(ctx, s.gateways) - deg0
	after := map[string]float64{}
	for _, g := range s.gateways {
		m, err := fleet.Counters(ctx, g.Metrics, "tollgate_fastpath_total", "result")
		if err != nil {
			return err
		}
		for k, v := range m {
			after[k] += v
		}
	}
	local := after["lease"] - before["lease"] + after["negative"] - before["negative"]
	all := local + after["miss"] - before["miss"] + after["bypass"] - before["bypass"]
	// Give the leases back (stop the gateways) so that Redis holds exactly
	// what was admitted, then compare with the oracle.
	var over, overKeys, falseRej, falseKeys, hot, rejUnder90, keys int64
	var worstOver int64
	for _, n := range c.m {
		keys++
		r, a := n[0], n[1]
		if r > limit {
			hot++
		}
		if a > limit {
			over += a - limit
			overKeys++
			worstOver = max(worstOver, a-limit)
		}
		if want := min(r, limit); a < want {
			falseRej += want - a
			falseKeys++
		}
		if r <= limit*9/10 && a < r {
			rejUnder90 += r - a
		}
	}
	scripts := int64(0)
	if sum.Redis != nil {
		scripts = sum.Redis.ByCommand["evalsha"] + sum.Redis.ByCommand["eval"]
	}
	fmt.Fprintf(out, "zipf: %d gateway processes, %d keys drawn Zipf(s=%.1f) (%d distinct seen, %d over the limit of %d per day), %d workers, %v\n",
		len(s.gateways), o.keys, cfg.ZipfS, keys, hot, limit, o.workers, o.duration)
	fmt.Fprintf(out, "zipf: throughput %.0f decisions/s (%d decisions, %d rejected, %d errors)\n",
		sum.ThroughputRPS, sum.Decisions, sum.Statuses["OVER_LIMIT"], sum.Errors)
	fmt.Fprintf(out, "zipf: latency p50 %.2f ms, p99 %.2f ms, p99.9 %.2f ms\n",
		float64(sum.LatencyUS.P50)/1000, float64(sum.LatencyUS.P99)/1000, float64(sum.LatencyUS.P999)/1000)
	fmt.Fprintf(out, "zipf: Redis calls per check %.4f (%d scripts); fast-path hit rate %.1f %% (lease %.0f, negative %.0f, miss %.0f)\n",
		float64(scripts)/float64(max(sum.Decisions, 1)), scripts, 100*local/max(all, 1),
		after["lease"]-before["lease"], after["negative"]-before["negative"], after["miss"]-before["miss"])
	fmt.Fprintf(out, "zipf: gateways' CPU %.1f µs per decision; Redis calls that failed or timed out (decided without Redis, failing open): %.0f\n",
		float64(cpu.Microseconds())/float64(max(sum.Decisions, 1)), deg)
	fmt.Fprintf(out, "zipf: against the exact oracle (at most %d admissions per key and day, the first ones): over-admission %d units on %d keys (worst %d = %.1f %% of the limit); false rejections %d on %d keys; rejections of keys at ≤ 90 %% of the limit %d\n",
		limit, over, overKeys, worstOver, 100*float64(worstOver)/limit, falseRej, falseKeys, rejUnder90)
	if (over > 0 && deg == 0) || rejUnder90 > 0 {
		return fmt.Errorf("zipf: over-admission %d, rejections under 90 %% of the limit %d", over, rejUnder90)
	}
	return nil
}

// degraded sums the gateways' Redis errors (calls that failed or timed
// out: their decisions were made without Redis, failing open).
func degraded(ctx context.Context, ps []*fleet.Process) float64 {
	var n float64
	for _, p := range ps {
		m, _ := fleet.Counters(ctx, p.Metrics, "tollgate_redis_errors_total", "")
		n += m[""]
	}
	return n
}

func join(xs []string) string {
	var b bytes.Buffer
	for i, x := range xs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(x)
	}
	return b.String()
}

func fleetCPU(ps []*fleet.Process) time.Duration {
	var d time.Duration
	for _, p := range ps {
		t, _ := procstat.CPUTime(p.Pid())
		d += t
	}
	return d
}

// hotkey is one key at 100x its limit beside normal traffic.
func hotkey(ctx context.Context, o options, log *slog.Logger, out io.Writer) error {
	const rules = `rules:
  - {id: normal, match: {domain: normal}, algorithm: token_bucket, capacity: 1000, rate: 1000/1h}
  - {id: hot, match: {domain: hot}, algorithm: token_bucket, capacity: 100, rate: 100/1m}
`
	s, err := start(ctx, o, log, rules, 1, false)
	defer s.close()
	if err != nil {
		return err
	}
	gw := s.gateways[0]
	normal := loadtest.DefaultConfig()
	normal.Target = loadtest.TargetGRPC
	normal.Addr = gw.GRPC
	normal.Domain = "normal"
	normal.Rate = 2000
	normal.Keys = 10_000
	normal.KeyPrefix = "sk_normal_"
	normal.Paths = []string{"/v1/items"}
	normal.Duration = o.duration

	hot := normal
	hot.Rate = 0
	hot.Domain = "hot"
	hot.Keys = 1
	hot.KeyPrefix = "sk_hot_"
	hot.Workers = 16

	type phase struct {
		name      string
		hot       bool
		hotRate   float64
		normal    *loadtest.Summary
		hotSum    *loadtest.Summary
		scripts   int64
		cpuPerDec float64
		degraded  float64
	}
	phases := []*phase{
		{name: "normal traffic alone"},
		{name: "with the hot key at 5,000/s (3,000x its limit)", hot: true, hotRate: 5000},
		{name: "with the hot key as fast as it can (closed loop, 16 workers)", hot: true},
		{name: "normal traffic alone, again"},
	}
	for _, ph := range phases {
		s0, err := scriptCalls(ctx, s.redis.Addr())
		if err != nil {
			return err
		}
		c0, _ := procstat.CPUTime(gw.Pid())
		d0 := degraded(ctx, s.gateways)
		var wg sync.WaitGroup
		var herr error
		if ph.hot {
			h := hot
			h.Rate = ph.hotRate
			if h.Rate > 0 {
				h.Workers = 0
				h.MaxInFlight = 256
			} else {
				h.Workers = 16
			}
			wg.Go(func() { ph.hotSum, herr = loadtest.Run(ctx, h, nil) })
		}
		n, err := loadtest.Run(ctx, normal, nil)
		wg.Wait()
		if err = errors.Join(err, herr); err != nil {
			return err
		}
		ph.normal = n
		s1, _ := scriptCalls(ctx, s.redis.Addr())
		c1, _ := procstat.CPUTime(gw.Pid())
		ph.scripts = s1 - s0
		ph.degraded = degraded(ctx, s.gateways) - d0
		decisions := n.Decisions
		if ph.hotSum != nil {
			decisions += ph.hotSum.Decisions
		}
		ph.cpuPerDec = float64((c1 - c0).Microseconds()) / float64(max(decisions, 1))
	}
	fmt.Fprintf(out, "hotkey: normal traffic: 2,000 checks/s (open loop) over 10,000 keys under 1000/h; hot key: one key, 100/min\n")
	for _, ph := range phases {
		n := ph.normal
		fmt.Fprintf(out, "hotkey: %-62s normal p50 %.2f ms p99 %.2f ms p99.9 %.2f ms (%d decisions, %d rejected)",
			ph.name, float64(n.LatencyUS.P50)/1000, float64(n.LatencyUS.P99)/1000, float64(n.LatencyUS.P999)/1000, n.Decisions, n.Statuses["OVER_LIMIT"])
		if h := ph.hotSum; h != nil {
			fmt.Fprintf(out, "; hot key %.0f/s, %d admitted, %d rejected", h.ThroughputRPS, h.Statuses["OK"], h.Statuses["OVER_LIMIT"])
		}
		fmt.Fprintf(out, "; %d Redis calls, %.0f failed or timed out; gateway %.1f µs CPU per decision\n", ph.scripts, ph.degraded, ph.cpuPerDec)
	}
	return nil
}

// scriptCalls reads the scripts (EVALSHA, EVAL) a Redis has run.
func scriptCalls(ctx context.Context, addr string) (int64, error) {
	sm := cmdstats.NewSampler([]string{addr}, cmdstats.Credentials{})
	defer sm.Close()
	st, err := sm.Sample(ctx)
	if err != nil {
		return 0, err
	}
	return st["evalsha"] + st["eval"], nil
}
