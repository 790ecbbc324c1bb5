// Command sidebyside measures the gateway's Envoy rate-limit service beside
// envoyproxy/ratelimit in one run: the same load client
// (loadtest, gRPC, closed loop), one local redis-server each, the two
// services run alternately, round after round, so that a drift of the
// shared machine affects both alike. For every scenario it reports each
// side's decisions/s, service CPU per decision, Redis CPU per decision,
// Redis commands the service sent per decision, p50/p99 latency, and the
// ratios Tollgate ÷ envoyproxy/ratelimit (medians over the rounds).
//
// Scenarios (one domain each, the same limit on both sides):
//
//	under  10,000 uniform keys under a 1000/h fixed-window limit: no rejections
//	over   the same keys over a 1/h limit, exhausted before measuring:
//	       every decision a rejection
//
//	sidebyside -ratelimit /tmp/rl/ratelimit -gateway bin/gateway [-rounds 3] [-duration 10s]
//
// Equal offered load: -rate N runs both sides open loop at N requests/s;
// -fractions 0.5,0.25 first measures envoyproxy/ratelimit's closed-loop
// maximum in each scenario (with -workers), then runs the rounds open loop
// at those fractions of it, both sides at the same rate. -warmup D runs
// each side D at each load before its rounds, unmeasured, so that the
// gateway's leases are in their steady state.
//
// scripts/sidebyside.sh builds both binaries (envoyproxy/ratelimit from
// its public repository, into a temporary directory) and runs it.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tollgate/tollgate/compose/redisserver"
	"github.com/tollgate/tollgate/loadtest"
	"github.com/tollgate/tollgate/loadtest/internal/fleet"
	"github.com/tollgate/tollgate/loadtest/internal/procstat"
)

// scenario is one limit both sides enforce, in a domain of its own.
type scenario struct {
	name, domain string
	limit        int // per hour
	warm         bool
}

var scenarios = []scenario{
	{name: "under", domain: "under", limit: 1000},
	{name: "over", domain: "over", limit: 1, warm: true},
}

type options struct {
	ratelimit, gateway string
	rounds             int
	duration           time.Duration
	workers, keys      int
	rate               float64
	fractions          []float64
	only               string
	jsonOut            string
	gatewayEnv         string
	warmup             time.Duration
	keep               bool
}

func main() {
	var o options
	flag.StringVar(&o.ratelimit, "ratelimit", "", "envoyproxy/ratelimit binary (go build ./src/service_cmd in its repository); required")
	flag.StringVar(&o.gateway, "gateway", "bin/gateway", "Tollgate gateway binary (make build)")
	flag.IntVar(&o.rounds, "rounds", 3, "rounds per scenario; each round runs both sides once, alternating which goes first")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "length of one side's run")
	flag.IntVar(&o.workers, "workers", 50, "closed-loop workers of the load client (one gRPC connection)")
	flag.IntVar(&o.keys, "keys", 10000, "distinct API keys, drawn uniformly")
	flag.Float64Var(&o.rate, "rate", 0, "open loop at this many requests/s (latency from each request's scheduled time) instead of closed-loop workers; pick a rate both sides carry")
	flag.Func("fractions", "open loop at these fractions of envoyproxy/ratelimit's closed-loop maximum, comma-separated (e.g. 0.5,0.25): each scenario first measures that maximum with -workers, then runs -rounds alternating rounds at each rate; overrides -rate", func(v string) error {
		fs, err := parseFractions(v)
		o.fractions = fs
		return err
	})
	flag.StringVar(&o.only, "scenarios", "under,over", "scenarios to run, comma-separated")
	flag.StringVar(&o.jsonOut, "json", "", "also write every run's figures as JSON to this file")
	flag.StringVar(&o.gatewayEnv, "gateway-env", "", "extra KEY=VALUE,... for the gateway's environment (e.g. TOLLGATE_FAST_PATH_DISABLED=true)")
	flag.DurationVar(&o.warmup, "warmup", 0, "before the rounds of each load, run each side this long at that load, unmeasured: the gateway's leases reach their steady state (a key at a fraction of a request per second needs minutes, not one 10 s round)")
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary directory (configs, logs)")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if o.ratelimit == "" {
		fmt.Fprintln(os.Stderr, "sidebyside: -ratelimit is required (build it with scripts/sidebyside.sh or go build ./src/service_cmd)")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, log, os.Stdout); err != nil {
		log.Error("sidebyside failed", "error", err)
		os.Exit(1)
	}
}

// side is one rate-limit service under test with its own Redis.
type side struct {
	*fleet.Process
	redis *redisserver.Server
}

func (s *side) stop() {
	s.Stop()
	if s.redis != nil {
		_ = s.redis.Stop()
	}
}

// result is one side's run of one scenario.
type result struct {
	Scenario      string  `json:"scenario"`
	Load          string  `json:"load"`
	Workers       int     `json:"workers,omitempty"`
	Side          string  `json:"side"`
	Round         int     `json:"round"`
	Decisions     int64   `json:"decisions"`
	Rejected      int64   `json:"rejected"`
	Errors        int64   `json:"errors"`
	PerSecond     float64 `json:"decisions_per_second"`
	CPUus         float64 `json:"service_cpu_us_per_decision"`
	RedisCPUus    float64 `json:"redis_cpu_us_per_decision"`
	RedisCalls    float64 `json:"redis_calls_per_decision"`
	RedisCommands float64 `json:"redis_commands_per_decision"`
	P50ms, P99ms  float64 `json:"-"`
	P50us, P99us  int64
	// SendLagP99us is the load generator's own lateness (open loop),
	// part of the latency.
	SendLagP99us   int64   `json:"send_lag_p99_us,omitempty"`
	LoadtestCPUus  float64 `json:"loadtest_cpu_us_per_request"`
	ByCommand      map[string]int64
	ElapsedSeconds float64 `json:"elapsed_seconds"`
}

func run(ctx context.Context, o options, log *slog.Logger, out io.Writer) error {
	dir, err := os.MkdirTemp("", "tollgate-sidebyside-")
	if err != nil {
		return err
	}
	if o.keep {
		log.Info("temporary directory kept", "dir", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	var sides []*side
	defer func() {
		for _, s := range sides {
			s.stop()
		}
	}()
	envoy, err := startRatelimit(ctx, o.ratelimit, dir, log)
	if envoy != nil {
		sides = append(sides, envoy)
	}
	if err != nil {
		return err
	}
	tollgate, err := startGateway(ctx, o, dir, log)
	if tollgate != nil {
		sides = append(sides, tollgate)
	}
	if err != nil {
		return err
	}

	var all []result
	for _, sc := range scenarios {
		if !slices.Contains(strings.Split(o.only, ","), sc.name) {
			continue
		}
		if sc.warm {
			for _, s := range sides {
				if err := warm(ctx, o, s, sc); err != nil {
					return err
				}
			}
		}
		loads := []load{{rate: o.rate}}
		if len(o.fractions) > 0 {
			// envoy's closed-loop maximum, measured now, on this machine
			// as it is, sets the open-loop rates of this scenario.
			co := o
			co.rate = 0
			res, err := measure(ctx, co, sides[0], sc, 0)
			if err != nil {
				return err
			}
			res.Load = "closed-loop maximum"
			log.Info("closed-loop maximum", "scenario", sc.name, "side", sides[0].Name, "decisions_per_s", int(res.PerSecond))
			all = append(all, res)
			loads = loads[:0]
			for _, f := range o.fractions {
				loads = append(loads, load{rate: math.Round(f * res.PerSecond), fraction: f})
			}
		}
		for _, l := range loads {
			lo := o
			lo.rate = l.rate
			if o.warmup > 0 {
				for _, s := range sides {
					wo := lo
					wo.duration = o.warmup
					if _, err := measure(ctx, wo, s, sc, 0); err != nil {
						return fmt.Errorf("warm-up: %w", err)
					}
				}
				log.Info("warmed up", "scenario", sc.name, "load", l.String(), "for", o.warmup)
			}
			for r := 1; r <= o.rounds; r++ {
				order := []*side{sides[0], sides[1]}
				if r%2 == 0 {
					order[0], order[1] = order[1], order[0]
				}
				for _, s := range order {
					res, err := measure(ctx, lo, s, sc, r)
					if err != nil {
						return err
					}
					res.Load = l.String()
					log.Info("run", "scenario", sc.name, "load", res.Load, "side", s.Name, "round", r,
						"decisions_per_s", int(res.PerSecond), "cpu_us", round1(res.CPUus),
						"redis_cpu_us", round1(res.RedisCPUus), "redis_calls", round3(res.RedisCalls), "p99_ms", res.P99ms)
					all = append(all, res)
				}
			}
		}
	}
	report(out, all)
	if o.jsonOut != "" {
		b, err := json.MarshalIndent(all, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(o.jsonOut, b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// startRatelimit starts envoyproxy/ratelimit with its defaults (no local
// cache, statsd off), a Redis of its own and the scenarios' limits.
func startRatelimit(ctx context.Context, bin, dir string, log *slog.Logger) (*side, error) {
	rd, err := fleet.StartRedis(ctx, log)
	if err != nil {
		return nil, err
	}
	s := &side{redis: rd}
	confs := map[string]string{}
	for _, sc := range scenarios {
		confs[sc.domain] = fmt.Sprintf(`domain: %s
descriptors:
  - key: api_key
    descriptors:
      - key: path
        rate_limit:
          unit: hour
          requests_per_unit: %d
`, sc.domain, sc.limit)
	}
	s.Process, err = fleet.StartRatelimit(ctx, fleet.Ratelimit{Bin: bin, Dir: dir, Redis: rd.Addr(), Configs: confs})
	return s, err
}

// startGateway starts the Tollgate gateway with only its Envoy RLS
// listener, a Redis of its own and the scenarios' limits.
func startGateway(ctx context.Context, o options, dir string, log *slog.Logger) (*side, error) {
	rd, err := fleet.StartRedis(ctx, log)
	if err != nil {
		return nil, err
	}
	s := &side{redis: rd}
	var b strings.Builder
	b.WriteString("rules:\n")
	for _, sc := range scenarios {
		fmt.Fprintf(&b, "  - {id: %s, match: {domain: %s}, algorithm: fixed_window, limit: %d, window: 1h}\n", sc.name, sc.domain, sc.limit)
	}
	var env []string
	if o.gatewayEnv != "" {
		env = strings.Split(o.gatewayEnv, ",")
	}
	s.Process, err = fleet.StartGateway(ctx, fleet.Gateway{
		Bin: o.gateway, Dir: dir, Name: "tollgate", Rules: b.String(), Redis: rd.Addr(), Env: env,
	})
	return s, err
}

// loadConfig is the load of one run against s.
func loadConfig(o options, s *side, sc scenario) loadtest.Config {
	cfg := loadtest.DefaultConfig()
	cfg.Target = loadtest.TargetGRPC
	cfg.Addr = s.GRPC
	cfg.Domain = sc.domain
	cfg.Workers = o.workers
	cfg.Rate = o.rate
	cfg.Keys = o.keys
	cfg.KeyPrefix = "sk_sbs_"
	cfg.Paths = []string{"/v1/items"}
	return cfg
}

// warm exhausts every key of an over-limit scenario before it is measured.
func warm(ctx context.Context, o options, s *side, sc scenario) error {
	cfg := loadConfig(o, s, sc)
	cfg.Rate = 0 // exhausted as fast as it goes, whatever the measured load
	cfg.Requests = int64(o.keys) * int64(sc.limit+1) * 3
	cfg.Duration = time.Minute
	sum, err := loadtest.Run(ctx, cfg, nil)
	if err != nil {
		return fmt.Errorf("warm %s %s: %w", s.Name, sc.name, err)
	}
	if sum.Errors > 0 {
		return fmt.Errorf("warm %s %s: %d errors", s.Name, sc.name, sum.Errors)
	}
	return nil
}

// measure runs one side once.
func measure(ctx context.Context, o options, s *side, sc scenario, round int) (result, error) {
	cfg := loadConfig(o, s, sc)
	cfg.Duration = o.duration
	cfg.PID = s.Pid()
	cfg.Redis = []string{s.redis.Addr()}
	rb, err := procstat.CPUTime(s.redis.Pid())
	if err != nil {
		return result{}, err
	}
	sum, err := loadtest.Run(ctx, cfg, nil)
	if err != nil {
		return result{}, fmt.Errorf("%s %s round %d: %w", s.Name, sc.name, round, err)
	}
	ra, err := procstat.CPUTime(s.redis.Pid())
	if err != nil {
		return result{}, err
	}
	r := result{
		Scenario: sc.name, Side: s.Name, Round: round, Workers: cfg.Workers,
		Decisions: sum.Decisions, Rejected: sum.Statuses["OVER_LIMIT"], Errors: sum.Errors,
		PerSecond:      float64(sum.Decisions) / sum.ElapsedSeconds,
		P50us:          int64(sum.LatencyUS.P50),
		P99us:          int64(sum.LatencyUS.P99),
		P50ms:          float64(sum.LatencyUS.P50) / 1000,
		P99ms:          float64(sum.LatencyUS.P99) / 1000,
		LoadtestCPUus:  sum.LoadtestCPUMicrosPerRequest,
		ElapsedSeconds: sum.ElapsedSeconds,
	}
	if sum.SendLagUS != nil {
		r.SendLagP99us = sum.SendLagUS.P99
	}
	if sum.Decisions > 0 {
		r.RedisCPUus = float64((ra - rb).Microseconds()) / float64(sum.Decisions)
	}
	if sum.Gateway != nil {
		r.CPUus = sum.Gateway.MicrosPerDecision
	}
	if sum.Redis != nil && sum.Decisions > 0 {
		r.ByCommand = sum.Redis.ByCommand
		r.RedisCommands = sum.Redis.CommandsPerDecision
		r.RedisCalls = float64(clientCalls(s.Name, sum.Redis.ByCommand)) / float64(sum.Decisions)
	}
	if sum.Errors > 0 {
		return r, fmt.Errorf("%s %s round %d: %d errors (%v)", s.Name, sc.name, round, sum.Errors, sum.ErrorSamples)
	}
	return r, nil
}

// clientCalls counts the commands the service itself sent: for Tollgate
// its scripts (Redis also counts the commands a script runs, under their
// own names), for envoyproxy/ratelimit every command.
func clientCalls(name string, by map[string]int64) int64 {
	if name == "tollgate" {
		return by["evalsha"] + by["eval"] + by["evalsha_ro"] + by["fcall"]
	}
	var n int64
	for _, v := range by {
		n += v
	}
	return n
}

// load is the offered load of a series of rounds: closed loop (rate 0)
// or open loop at rate, which is fraction × envoy's maximum when set.
type load struct {
	rate, fraction float64
}

func (l load) String() string {
	switch {
	case l.rate == 0:
		return "closed loop"
	case l.fraction > 0:
		return fmt.Sprintf("open loop %.0f/s (%.2f × envoy's maximum)", l.rate, l.fraction)
	}
	return fmt.Sprintf("open loop %.0f/s", l.rate)
}

// parseFractions reads -fractions: numbers in (0, 1], comma-separated.
func parseFractions(v string) ([]float64, error) {
	var fs []float64
	for _, f := range strings.Split(v, ",") {
		x, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || !(x > 0 && x <= 1) {
			return nil, fmt.Errorf("parse fractions: %q is not a number in (0, 1]", f)
		}
		fs = append(fs, x)
	}
	return fs, nil
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func round1(x float64) float64 { return float64(int64(x*10+0.5)) / 10 }
func round3(x float64) float64 { return float64(int64(x*1000+0.5)) / 1000 }

// report prints the medians of each side and the ratios, per scenario, as
// a Markdown table.
func report(w io.Writer, all []result) {
	type col struct {
		name string
		get  func(result) float64
		fmt  func(float64) string
	}
	f0 := func(x float64) string { return strconv.FormatFloat(x, 'f', 0, 64) }
	f1 := func(x float64) string { return strconv.FormatFloat(x, 'f', 1, 64) }
	f3 := func(x float64) string { return strconv.FormatFloat(x, 'f', 3, 64) }
	f2 := func(x float64) string { return strconv.FormatFloat(x, 'f', 2, 64) }
	cols := []col{
		{"decisions/s", func(r result) float64 { return r.PerSecond }, f0},
		{"service CPU µs/decision", func(r result) float64 { return r.CPUus }, f1},
		{"Redis CPU µs/decision", func(r result) float64 { return r.RedisCPUus }, f2},
		{"Redis calls/decision", func(r result) float64 { return r.RedisCalls }, f3},
		{"p50 ms", func(r result) float64 { return r.P50ms }, f2},
		{"p99 ms", func(r result) float64 { return r.P99ms }, f2},
	}
	var names []string
	for _, r := range all {
		if r.Load == "closed-loop maximum" {
			fmt.Fprintf(w, "\nscenario %s: %s's closed-loop maximum %.0f/s (%d workers), p99 %.2f ms\n", r.Scenario, r.Side, r.PerSecond, r.Workers, r.P99ms)
			continue
		}
		if !slices.Contains(names, group(r)) {
			names = append(names, group(r))
		}
	}
	for _, sc := range names {
		fmt.Fprintf(w, "\nscenario %s (medians of %d rounds)\n\n", sc, countRounds(all, sc))
		fmt.Fprint(w, "| side |")
		for _, c := range cols {
			fmt.Fprintf(w, " %s |", c.name)
		}
		fmt.Fprint(w, "\n|---|")
		for range cols {
			fmt.Fprint(w, "---|")
		}
		fmt.Fprintln(w)
		med := map[string][]float64{}
		for _, sideName := range []string{"envoyproxy/ratelimit", "tollgate"} {
			fmt.Fprintf(w, "| %s |", sideName)
			for _, c := range cols {
				var xs []float64
				for _, r := range all {
					if group(r) == sc && r.Side == sideName {
						xs = append(xs, c.get(r))
					}
				}
				m := median(xs)
				med[sideName] = append(med[sideName], m)
				fmt.Fprintf(w, " %s |", c.fmt(m))
			}
			fmt.Fprintln(w)
		}
		fmt.Fprint(w, "| ratio tollgate ÷ envoy |")
		for i := range cols {
			e, t := med["envoyproxy/ratelimit"][i], med["tollgate"][i]
			if e == 0 {
				fmt.Fprint(w, " – |")
				continue
			}
			fmt.Fprintf(w, " %s |", f2(t/e))
		}
		fmt.Fprintln(w)
		fmt.Fprintln(w, "\nper round:")
		for _, r := range all {
			if group(r) == sc {
				fmt.Fprintf(w, "  round %d %-22s %8.0f/s cpu %6.1f µs redis cpu %6.2f µs calls %.3f cmds %.2f rejected %d p50 %.2f ms p99 %.2f ms (send lag p99 %.2f ms) loadtest %.1f µs/req\n",
					r.Round, r.Side, r.PerSecond, r.CPUus, r.RedisCPUus, r.RedisCalls, r.RedisCommands, r.Rejected, r.P50ms, r.P99ms,
					float64(r.SendLagP99us)/1000, r.LoadtestCPUus)
			}
		}
	}
}

// group names the scenario and load a result belongs to.
func group(r result) string {
	if r.Load == "" {
		return r.Scenario
	}
	return r.Scenario + ", " + r.Load
}

func countRounds(all []result, sc string) int {
	n := 0
	for _, r := range all {
		if group(r) == sc {
			n++
		}
	}
	return n / 2
}
