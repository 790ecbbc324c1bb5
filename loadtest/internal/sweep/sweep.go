package sweep

import (
	"context"
	"fmt"
	"io"
	"math/bits"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/aggregator/costs"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/lease"
	"github.com/tollgate/tollgate/guard/redisstore"
	"github.com/tollgate/tollgate/guard/redisstore/counterbytes"
	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/loadtest/internal/cmdstats"
	"github.com/tollgate/tollgate/loadtest/internal/keyspace"
	"github.com/tollgate/tollgate/loadtest/internal/procstat"
)

// Env is where a sweep runs: a redis-server of its own (every Redis point
// flushes it), and a directory for Pebble's stores.
type Env struct {
	// RedisAddr is the server's host:port; RedisPID its process id, for
	// its CPU per decision (0: not measured).
	RedisAddr string
	RedisPID  int
	// TempDir holds the Pebble stores while they are measured.
	TempDir string
}

// GatewayRule is the rule every gateway point checks: a token bucket per
// key that no key of the sweep exhausts at the machine's rates, so that
// hot keys are answered from leases and cold ones go to Redis.
const GatewayRule = "rules:\n  - {id: per-key, match: {}, algorithm: token_bucket, capacity: 1000, rate: 1000/1s}\n"

// gatewayPath is the endpoint of every gateway decision.
const gatewayPath = "/v1/items"

// gatewaySecret derives key ids in the sweep's guard.
var gatewaySecret = []byte("sweep-key-secret-0123456789abcdef")

// Algorithms are the algorithms of the Redis points.
var Algorithms = []rules.Algorithm{rules.TokenBucket, rules.GCRA, rules.FixedWindow, rules.SlidingWindowCounter, rules.SlidingWindowLog}

// redisSamples is how many counters a Redis point reads MEMORY USAGE of.
const redisSamples = 200

// GatewayPoint is one gateway measure.
type GatewayPoint struct {
	Keys int
	Dist string
	// Decisions made; Distinct keys drawn among them.
	Decisions int64
	Distinct  int
	// CPUPerDecision is the sweep process's CPU (guard, fast path, Redis
	// client, and the load's key draws) per decision, in µs; RedisCPU
	// the redis-server's (NaN when not measured).
	CPUPerDecision, RedisCPU float64
	// Local is the share of decisions answered by the fast path (a lease
	// or the negative cache); EvalSHA the scripts Redis ran per decision
	// (checks, lease grants and returns).
	Local, EvalSHA float64
	// Heap is the live heap the guard added (after a collection), and
	// Tracked the keys it can hold state for: the distinct keys drawn, at
	// most the larger of its tables (fast-path counters, resolutions).
	Heap          int64
	Tracked       int
	BytesPerKey   float64
	LoadAvg       float64
	Errors        int64
	FirstErr      string
	Wall          time.Duration
	ProcessCPU    time.Duration
	DecisionsPerS float64
}

// RedisPoint is one Redis measure.
type RedisPoint struct {
	Keys      int
	Algorithm rules.Algorithm
	// PerCounter is used_memory's growth per counter; Usage the mean
	// MEMORY USAGE of a sample.
	PerCounter, Usage float64
	Encoding          string
	LoadAvg           float64
}

// AggregatorPoint is one aggregator measure.
type AggregatorPoint struct {
	Keys, Events   int
	EventsPerCPU   float64
	CPU, Wall      time.Duration
	LoadAvg        float64
	DistinctEvents int
}

// PebblePoint is one Pebble measure.
type PebblePoint struct {
	Keys                      int
	DiskPerRow, LogicalPerRow float64
	ReportMean, ReportP99     time.Duration
	LoadAvg                   float64
}

// Result is a sweep's figures.
type Result struct {
	Config     Config
	Started    time.Time
	Elapsed    time.Duration
	Gateway    []GatewayPoint
	Redis      []RedisPoint
	Aggregator []AggregatorPoint
	Pebble     []PebblePoint
	// Notes says what was not measured and why.
	Notes []string
}

// Run runs the sweep cfg describes in env, writing a line per point to
// progress (nil: none). It stops at the first error, returning what it
// measured so far with it, or when ctx ends (nil error: the points done).
func Run(ctx context.Context, cfg Config, env Env, progress io.Writer) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if progress == nil {
		progress = io.Discard
	}
	res := &Result{Config: cfg, Started: time.Now()}
	defer func() { res.Elapsed = time.Since(res.Started) }()
	var client redis.UniversalClient
	if cfg.Runs(Gateway) || cfg.Runs(Redis) {
		if env.RedisAddr == "" {
			return res, fmt.Errorf("%w: no redis-server to measure against", ErrConfig)
		}
		// A long timeout: FLUSHALL SYNC of ten million counters takes
		// seconds on a busy machine. The stores have their own.
		c, err := redisstore.NewClient(redisstore.Config{Addrs: []string{env.RedisAddr}, Timeout: 2 * time.Minute})
		if err != nil {
			return res, fmt.Errorf("sweep: redis client: %w", err)
		}
		defer c.Close()
		client = c
	}
	if cfg.Runs(Gateway) {
		for _, k := range cfg.Keys {
			for _, d := range cfg.Dists {
				if ctx.Err() != nil {
					return res, nil
				}
				p, err := gatewayPoint(ctx, cfg, env, client, k, d)
				if err != nil {
					return res, fmt.Errorf("sweep: gateway at %s keys (%s): %w", KeyName(k), d, err)
				}
				res.Gateway = append(res.Gateway, p)
				fmt.Fprintf(progress, "gateway %s %s: %d decisions, %.1f µs CPU/decision, %.1f %% local, %.2f EVALSHA/decision, %.0f B per tracked key (%d tracked), load %.1f\n",
					KeyName(k), d, p.Decisions, p.CPUPerDecision, 100*p.Local, p.EvalSHA, p.BytesPerKey, p.Tracked, p.LoadAvg)
			}
		}
	}
	if cfg.Runs(Redis) {
		if err := redisPoints(ctx, cfg, client, res, progress); err != nil {
			return res, err
		}
	}
	if cfg.Runs(Aggregator) {
		for _, k := range cfg.Keys {
			if ctx.Err() != nil {
				return res, nil
			}
			a, err := costs.Apply(k, cfg.Events)
			if err != nil {
				return res, fmt.Errorf("sweep: aggregator at %s keys: %w", KeyName(k), err)
			}
			p := AggregatorPoint{Keys: k, Events: cfg.Events, EventsPerCPU: a.EventsPerCPUSecond(), CPU: a.CPU, Wall: a.Wall,
				LoadAvg: loadAvg(), DistinctEvents: min(k, cfg.Events)}
			res.Aggregator = append(res.Aggregator, p)
			fmt.Fprintf(progress, "aggregator %s: %d events over %d distinct keys, %.0f events per CPU second, load %.1f\n",
				KeyName(k), p.Events, p.DistinctEvents, p.EventsPerCPU, p.LoadAvg)
		}
	}
	if cfg.Runs(Pebble) {
		for _, k := range cfg.Keys {
			if ctx.Err() != nil {
				return res, nil
			}
			if k > cfg.PebbleUpTo {
				res.Notes = append(res.Notes, fmt.Sprintf("pebble: %s keys not run (above -pebble-up-to %s)", KeyName(k), KeyName(cfg.PebbleUpTo)))
				continue
			}
			p, err := pebblePoint(cfg, env, k)
			if err != nil {
				return res, fmt.Errorf("sweep: pebble at %s keys: %w", KeyName(k), err)
			}
			res.Pebble = append(res.Pebble, p)
			fmt.Fprintf(progress, "pebble %s: %.1f B/row on disk (%.0f B written), 10 000-row report mean %v p99 %v, load %.1f\n",
				KeyName(k), p.DiskPerRow, p.LogicalPerRow, p.ReportMean.Round(time.Microsecond), p.ReportP99.Round(time.Microsecond), p.LoadAvg)
		}
	}
	return res, nil
}

// gatewayPoint checks keys keys drawn from dist through a fresh guard
// with its fast path over a flushed Redis for cfg.Point.
func gatewayPoint(ctx context.Context, cfg Config, env Env, client redis.UniversalClient, keys int, dist string) (GatewayPoint, error) {
	p := GatewayPoint{Keys: keys, Dist: dist, RedisCPU: nan}
	if err := client.Do(ctx, "FLUSHALL", "SYNC").Err(); err != nil {
		return p, fmt.Errorf("flushall: %w", err)
	}
	rs, err := rules.Load([]byte(GatewayRule))
	if err != nil {
		return p, fmt.Errorf("rules: %w", err)
	}
	pickers := make([]*keyspace.Picker, cfg.Workers)
	seen := make([][]uint64, cfg.Workers)
	for w := range pickers {
		if pickers[w], err = keyspace.New(keyspace.Config{Keys: keys, Prefix: "sk_sweep_", Dist: dist, ZipfS: cfg.ZipfS, Paths: []string{gatewayPath}},
			cfg.Seed+uint64(w)*7919); err != nil {
			return p, err
		}
		seen[w] = make([]uint64, (keys+63)/64)
	}
	base := liveHeap()
	store := redisstore.New(client, redisstore.WithTimeout(2*time.Second))
	defer store.Close()
	fast := lease.New(store)
	defer fast.Close()
	g, err := guard.New(fast, gatewaySecret, rs)
	if err != nil {
		return p, fmt.Errorf("guard: %w", err)
	}
	sampler := cmdstats.NewSampler([]string{env.RedisAddr}, cmdstats.Credentials{})
	defer sampler.Close()
	before, err := sampler.Sample(ctx)
	if err != nil {
		return p, err
	}
	redis0 := redisCPU(env.RedisPID)
	cpu0 := processCPU()
	t0 := time.Now()

	var stop atomic.Bool
	timer := time.AfterFunc(cfg.Point, func() { stop.Store(true) })
	defer timer.Stop()
	done := context.AfterFunc(ctx, func() { stop.Store(true) })
	defer done()
	counts := make([]int64, cfg.Workers)
	errs := make([]int64, cfg.Workers)
	firstErr := make([]error, cfg.Workers)
	var wg sync.WaitGroup
	for w := range cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pk, mark := pickers[w], seen[w]
			var d guard.Decision
			req := guard.Request{Path: gatewayPath}
			for !stop.Load() {
				i := pk.Index()
				mark[i>>6] |= 1 << (i & 63)
				req.Key = pk.Key(i)
				if err := g.CheckInto(context.Background(), &req, &d); err != nil {
					if errs[w]++; firstErr[w] == nil {
						firstErr[w] = err
					}
				}
				counts[w]++
			}
		}()
	}
	wg.Wait()
	p.Wall = time.Since(t0)
	p.ProcessCPU = processCPU() - cpu0
	redis1 := redisCPU(env.RedisPID)
	after, err := sampler.Sample(ctx)
	if err != nil {
		return p, err
	}
	st := fast.Stats()
	for w := range counts {
		p.Decisions += counts[w]
		p.Errors += errs[w]
		if firstErr[w] != nil && p.FirstErr == "" {
			p.FirstErr = firstErr[w].Error()
		}
	}
	if p.Decisions == 0 {
		return p, fmt.Errorf("no decision made in %v", cfg.Point)
	}
	if p.Errors*100 > p.Decisions {
		return p, fmt.Errorf("%d of %d checks failed, first: %s", p.Errors, p.Decisions, p.FirstErr)
	}
	n := float64(p.Decisions)
	p.DecisionsPerS = n / p.Wall.Seconds()
	p.CPUPerDecision = float64(p.ProcessCPU.Microseconds()) / n
	if redis0 >= 0 && redis1 >= 0 {
		p.RedisCPU = float64((redis1 - redis0).Microseconds()) / n
	}
	p.Local = float64(st.Lease+st.Negative) / n
	p.EvalSHA = float64(after.Sub(before).EvalSHA()) / n
	// The guard's state, with the load's bitmaps already in base.
	p.Heap = int64(liveHeap()) - int64(base)
	for w := range seen {
		for i, word := range seen[w] {
			if w > 0 {
				seen[0][i] |= word
			}
		}
	}
	for _, word := range seen[0] {
		p.Distinct += bits.OnesCount64(word)
	}
	p.Tracked = min(p.Distinct, max(lease.DefaultCounters, guard.DefaultResolutionCache))
	p.BytesPerKey = float64(p.Heap) / float64(max(p.Tracked, 1))
	p.LoadAvg = loadAvg()
	runtime.KeepAlive(g)
	return p, nil
}

// redisPoints measures Redis bytes per counter at every key count.
func redisPoints(ctx context.Context, cfg Config, client redis.UniversalClient, res *Result, progress io.Writer) error {
	store := redisstore.New(client, redisstore.WithTimeout(5*time.Second))
	defer store.Close()
	if err := counterbytes.LoadScripts(ctx, client, store, Algorithms); err != nil {
		return fmt.Errorf("sweep: redis: %w", err)
	}
	defer client.Do(context.Background(), "FLUSHALL", "ASYNC")
	for _, k := range cfg.Keys {
		algs := Algorithms
		if k > cfg.AllAlgorithmsUpTo {
			algs = Algorithms[:1]
			res.Notes = append(res.Notes, fmt.Sprintf("redis: %s keys: token_bucket only (above -all-algorithms-up-to %s)", KeyName(k), KeyName(cfg.AllAlgorithmsUpTo)))
		}
		for _, alg := range algs {
			if ctx.Err() != nil {
				return nil
			}
			r, err := counterbytes.Measure(ctx, client, store, alg, k, redisSamples)
			if err != nil {
				return fmt.Errorf("sweep: redis %s at %s keys: %w", alg, KeyName(k), err)
			}
			p := RedisPoint{Keys: k, Algorithm: alg, PerCounter: r.PerCounter, Usage: r.Usage, Encoding: r.Type + "/" + r.Encoding, LoadAvg: loadAvg()}
			res.Redis = append(res.Redis, p)
			fmt.Fprintf(progress, "redis %s %s: %.1f B per counter (used_memory), MEMORY USAGE %.0f B, %s, load %.1f\n",
				KeyName(k), alg, p.PerCounter, p.Usage, p.Encoding, p.LoadAvg)
		}
	}
	return nil
}

// pebblePoint measures Pebble rows of keys keys in a store of its own.
func pebblePoint(cfg Config, env Env, keys int) (PebblePoint, error) {
	dir, err := os.MkdirTemp(env.TempDir, "sweep-pebble-")
	if err != nil {
		return PebblePoint{}, fmt.Errorf("temp dir: %w", err)
	}
	defer os.RemoveAll(dir)
	r, err := costs.RowCost(dir, keys, cfg.Reports)
	if err != nil {
		return PebblePoint{}, err
	}
	return PebblePoint{Keys: keys, DiskPerRow: r.DiskPerRow, LogicalPerRow: r.LogicalPerRow, ReportMean: r.Mean(), ReportP99: r.P99(), LoadAvg: loadAvg()}, nil
}

// liveHeap returns the bytes of live heap objects after a collection.
func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// processCPU returns this process's user + system CPU so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// redisCPU returns the CPU of process pid so far, or -1 when pid is 0 or
// its CPU cannot be read.
func redisCPU(pid int) time.Duration {
	if pid <= 0 {
		return -1
	}
	d, err := procstat.CPUTime(pid)
	if err != nil {
		return -1
	}
	return d
}

// loadAvg returns the machine's one-minute load average (0 when unknown).
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// numCPU is the CPUs the process may use.
func numCPU() int { return runtime.NumCPU() }
