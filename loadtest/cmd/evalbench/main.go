// Command evalbench measures the throughput ratio of the guard
// through Redis: guard.Check in-process, many goroutines sharing the store's
// pipelines, against `redis-benchmark -P 16 -c 50` running EVALSHA of the
// guard's own script with the KEYS and ARGV the guard sends for the same
// single token-bucket rule (taken from a real Guard through
// redisstore.ScriptArgs; only the hash tag varies, with -r).
//
// Both run against one redis-server it starts, in one run: on a small
// machine the load generator competes with Redis for the CPUs,
// so only figures taken side by side compare. Phases alternate:
// redis-benchmark, guard, redis-benchmark, guard, ...; each guard phase is
// divided by the mean of the two redis-benchmark phases around it, which
// cancels a slow drift of the machine's speed. Every phase also reports the
// CPU that redis-server, the load generator and all other processes used;
// a ratio whose phases saw other processes use more than -quiet CPUs is
// noisy, and the summary gives the median over the quiet ones apart.
//
// Every phase checks its own setup: the script SHA redis-benchmark calls is
// the store's, a replayed call admits and charges one unit, Redis counted
// one EVALSHA per check (INFO commandstats) and no failed calls, guard
// decisions were admitted and not degraded, and sampled redis-benchmark
// counters still admit at the end.
//
// Usage (make bench runs it with its defaults):
//
//	go run ./loadtest/cmd/evalbench [-rounds 6] [-duration 2s]
//	    [-goroutines 200] [-batch default,32x8] [-procs 0,1] [-keys 10000]
//
// -procs 0,1 measures the guard with GOMAXPROCS unchanged and with 1: on a
// 2-CPU machine a checking process that spreads over both CPUs takes CPU
// time from redis-server (redis-benchmark is one thread).
//
// With -baseline REV it measures instead redis-server's CPU per call of
// the guard's script for each algorithm, against the script of git
// revision REV, side by side in one run (scriptcpu.go):
//
//	go run ./loadtest/cmd/evalbench -baseline f1a8d53 [-rounds 6] [-duration 2s]
//
// It exits 2 when redis-benchmark or redis-server is missing, naming the
// command that installs them, and 1 when a check fails.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/compose/redisserver"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/redisstore"
	"github.com/tollgate/tollgate/guard/rules"
)

// benchRules is the single key-scope token-bucket rule both sides decide.
// A key sees about rate ÷ keys checks per second (≈ 15 at 150 k/s over
// 10 000 keys), below its refill of 1000/1m ≈ 16.7 per second, and the
// capacity absorbs any burst: every check is an admission that writes state.
const benchRules = `
rules:
  - {id: bench, match: {}, algorithm: token_bucket, capacity: 1000, rate: 1000/1m}
`

const benchLimit = 1000

type config struct {
	rounds     int
	duration   time.Duration
	clients    int
	pipeline   int
	goroutines int
	keys       int
	settings   []setting
	timeout    time.Duration
	quiet      float64
}

// batch is one redisstore.WithBatch setting; size 0 means the defaults.
type batch struct{ size, inflight int }

func (b batch) String() string {
	if b.size == 0 {
		return "default"
	}
	return fmt.Sprintf("%dx%d", b.size, b.inflight)
}

func (b batch) options() []redisstore.Option {
	if b.size == 0 {
		return nil
	}
	return []redisstore.Option{redisstore.WithBatch(b.size, b.inflight)}
}

// setting is one guard configuration measured: the store's batching and
// GOMAXPROCS during the phase (0: unchanged).
type setting struct {
	batch batch
	procs int
}

func (s setting) String() string {
	if s.procs == 0 {
		return s.batch.String()
	}
	return fmt.Sprintf("%s/P%d", s.batch, s.procs)
}

func parseProcs(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("-procs: %q is not a number ≥ 0", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func parseBatches(s string) ([]batch, error) {
	var out []batch
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "default" {
			out = append(out, batch{})
			continue
		}
		a, b, ok := strings.Cut(f, "x")
		size, err1 := strconv.Atoi(a)
		inflight, err2 := strconv.Atoi(b)
		if !ok || err1 != nil || err2 != nil || size < 1 || inflight < 1 {
			return nil, fmt.Errorf("-batch: %q is not default or SIZExINFLIGHT", f)
		}
		out = append(out, batch{size, inflight})
	}
	return out, nil
}

func main() {
	var cfg config
	var batches, procs, baseline, cases string
	flag.IntVar(&cfg.rounds, "rounds", 6, "rounds; each runs every setting once, each guard phase between two redis-benchmark phases")
	flag.DurationVar(&cfg.duration, "duration", 2*time.Second, "length of each phase (redis-benchmark -n is sized to last about as long)")
	flag.IntVar(&cfg.clients, "clients", 50, "redis-benchmark -c")
	flag.IntVar(&cfg.pipeline, "pipeline", 16, "redis-benchmark -P")
	flag.IntVar(&cfg.goroutines, "goroutines", 200, "goroutines calling guard.Check")
	flag.IntVar(&cfg.keys, "keys", 10_000, "distinct API keys (redis-benchmark -r)")
	flag.StringVar(&batches, "batch", "default", "comma-separated redisstore.WithBatch settings, SIZExINFLIGHT or default")
	flag.StringVar(&procs, "procs", "0,1", "comma-separated GOMAXPROCS values for guard phases (0: unchanged)")
	flag.DurationVar(&cfg.timeout, "timeout", 50*time.Millisecond, "deadline of one Redis call (redisstore.WithTimeout)")
	flag.Float64Var(&cfg.quiet, "quiet", 0.15, "a ratio is quiet when other processes used at most this many CPUs in its phases")
	flag.StringVar(&baseline, "baseline", "", "a git revision: measure Redis CPU per call of its script against this tree's, per algorithm (scriptcpu.go), instead of the ratio")
	flag.StringVar(&cases, "cases", "", "with -baseline: comma-separated case names to measure (default: all)")
	flag.Parse()
	bs, err := parseBatches(batches)
	if err == nil {
		var ps []int
		if ps, err = parseProcs(procs); err == nil {
			for _, p := range ps {
				for _, b := range bs {
					cfg.settings = append(cfg.settings, setting{b, p})
				}
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "evalbench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	run := run
	if baseline != "" {
		run = func(ctx context.Context, cfg config) error { return runBaseline(ctx, cfg, baseline, cases) }
	}
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "evalbench:", err)
		var me missingError
		if errors.As(err, &me) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

type missingError struct{ what string }

func (e missingError) Error() string {
	return fmt.Sprintf("%s is not installed; install it with\n    %s            (as root)\n    sudo %s       (otherwise)\nor run `make deps`",
		e.what, redisserver.InstallCommand, redisserver.InstallCommand)
}

// benchRig is what both modes measure with: redis-benchmark's path, a
// redis-server of their own, an admin client and the store's client on it.
type benchRig struct {
	rb     string
	srv    *redisserver.Server
	admin  *redis.Client
	client redis.UniversalClient
}

// startBench finds redis-benchmark and starts a redis-server with its
// clients, or says what to install.
func startBench(ctx context.Context, cfg config) (*benchRig, error) {
	rb, err := exec.LookPath("redis-benchmark")
	if err != nil {
		return nil, missingError{"redis-benchmark"}
	}
	srv, err := redisserver.Start(ctx)
	if errors.Is(err, redisserver.ErrNotFound) {
		return nil, missingError{"redis-server"}
	}
	if err != nil {
		return nil, err
	}
	client, err := redisstore.NewClient(redisstore.Config{Addrs: []string{srv.Addr()}, Timeout: cfg.timeout})
	if err != nil {
		srv.Stop()
		return nil, err
	}
	return &benchRig{rb: rb, srv: srv, admin: redis.NewClient(srv.ClientOptions()), client: client}, nil
}

func (b *benchRig) close() {
	b.client.Close()
	b.admin.Close()
	b.srv.Stop()
}

func run(ctx context.Context, cfg config) error {
	b, err := startBench(ctx, cfg)
	if err != nil {
		return err
	}
	defer b.close()
	rb, srv, admin, client := b.rb, b.srv, b.admin, b.client
	rs, err := rules.Load([]byte(benchRules))
	if err != nil {
		return err
	}
	secret := []byte("evalbench-secret")

	// The guard's own call: the counters a real Guard builds for one
	// request, as the store lays them out.
	store := redisstore.New(client, redisstore.WithTimeout(cfg.timeout))
	defer store.Close()
	capture := &captureStore{Store: store}
	g, err := guard.New(capture, secret, rs)
	if err != nil {
		return err
	}
	if _, err := g.Check(ctx, &guard.Request{Key: "sk_evalbench_capture"}); err != nil {
		return err
	}
	if len(capture.counters) != 1 {
		return fmt.Errorf("guard sent %d counters, want 1", len(capture.counters))
	}
	// The store's TTL margin is its default, 1000 ms.
	keys, args := redisstore.ScriptArgs(guard.OpCheck, 0, 1000, capture.counters)
	sha := redisstore.DecideScript().SHA
	loaded, err := admin.ScriptLoad(ctx, redisstore.DecideScript().Source).Result()
	if err != nil {
		return err
	}
	if loaded != sha {
		return fmt.Errorf("SCRIPT LOAD answered %s, the store calls %s", loaded, sha)
	}
	pattern, err := randKey(keys[0])
	if err != nil {
		return err
	}
	if err := checkReplay(ctx, admin, sha, pattern, args); err != nil {
		return err
	}

	fmt.Printf("evalbench: redis-server %s at %s (pid %d), %d CPUs, GOMAXPROCS %d (guard phases: /P<n> sets it), %d goroutines\n",
		serverVersion(ctx, admin), srv.Addr(), srv.Pid(), runtime.NumCPU(), runtime.GOMAXPROCS(0), cfg.goroutines)
	fmt.Printf("evalbench: guard key   %s\n", keys[0])
	fmt.Printf("evalbench: bench key   %s (redis-benchmark -r %d)\n", pattern, cfg.keys)

	bench := &rbench{path: rb, host: "127.0.0.1", port: srv.Port(), cfg: cfg, sha: sha, keys: []string{pattern}, args: args}
	// Warm up and calibrate -n on a short run.
	warm, err := bench.run(ctx, admin, 100_000)
	if err != nil {
		return err
	}
	n := max(100_000, int(warm.rate*cfg.duration.Seconds()))
	fmt.Printf("evalbench: %s %s\n", rb, quoteArgs(bench.argv(n)))

	reqs := make([]guard.Request, cfg.keys)
	for i := range reqs {
		reqs[i] = guard.Request{Key: fmt.Sprintf("sk_evalbench_%07d", i), Path: "/v1/items", Method: "GET"}
	}
	// Each guard phase sits between two redis-benchmark phases and is
	// compared with their mean, which cancels a slow drift of the
	// machine's speed; a phase during which other processes used more
	// than cfg.quiet CPUs makes its sample noisy.
	type sample struct {
		rate, ratio float64
		quiet       bool
	}
	results := make([][]sample, len(cfg.settings))
	var rbRates []float64
	prev, err := bench.run(ctx, admin, n)
	if err != nil {
		return err
	}
	printPhase(0, "redis-benchmark", prev, 0)
	rbRates = append(rbRates, prev.rate)
	for r := range cfg.rounds {
		for i, st := range cfg.settings {
			p, err := guardPhase(ctx, admin, client, secret, rs, reqs, cfg, st)
			if err != nil {
				return err
			}
			next, err := bench.run(ctx, admin, n)
			if err != nil {
				return err
			}
			ratio := p.rate / ((prev.rate + next.rate) / 2)
			printPhase(r+1, "guard "+st.String(), p, ratio)
			printPhase(r+1, "redis-benchmark", next, 0)
			rbRates = append(rbRates, next.rate)
			quiet := max(prev.other, p.other, next.other) <= cfg.quiet
			results[i] = append(results[i], sample{p.rate, ratio, quiet})
			prev = next
		}
	}
	if err := checkAdmits(ctx, admin, sha, pattern, args, cfg.keys); err != nil {
		return err
	}

	fmt.Printf("\nsummary: redis-benchmark -P %d -c %d EVALSHA: median %.0f ops/s over %d runs\n",
		cfg.pipeline, cfg.clients, median(rbRates), len(rbRates))
	for i, st := range cfg.settings {
		var all, quiet, rates []float64
		for _, x := range results[i] {
			all = append(all, x.ratio)
			rates = append(rates, x.rate)
			if x.quiet {
				quiet = append(quiet, x.ratio)
			}
		}
		line := fmt.Sprintf("summary: guard.Check %-12s %d goroutines: median %.0f checks/s; ratio median %.1f%% over %d rounds",
			st, cfg.goroutines, median(rates), 100*median(all), len(all))
		if len(quiet) < len(all) {
			if len(quiet) > 0 {
				line += fmt.Sprintf(", %.1f%% over the %d quiet ones", 100*median(quiet), len(quiet))
			} else {
				line += ", NO quiet round: other processes used the CPUs"
			}
		}
		fmt.Println(line)
	}
	return nil
}

// captureStore records the counters of the last call it forwards; it
// names counters as the Redis store does.
type captureStore struct {
	*redisstore.Store
	counters []guard.Counter
}

func (c *captureStore) Do(ctx context.Context, op guard.Op, now int64, counters []guard.Counter, res []guard.CounterResult) (int64, error) {
	c.counters = append(c.counters[:0], counters...)
	return c.Store.Do(ctx, op, now, counters, res)
}

// randKey turns the guard's counter key <prefix>{<key_id>}<tag> into a
// redis-benchmark pattern of the same length: the key_id's first 10
// characters and __rand_int__ (12 digits once replaced).
func randKey(key string) (string, error) {
	i := strings.IndexByte(key, '{')
	j := strings.IndexByte(key, '}')
	if i < 0 || j-i-1 != 22 {
		return "", fmt.Errorf("counter key %q is not <prefix>{<22-character key_id>}<tag>", key)
	}
	return key[:i+1] + key[i+1:i+11] + "__rand_int__" + key[j:], nil
}

// checkReplay runs the call redis-benchmark will make once, on a key of its
// own, and checks that it admits and charges one unit of a fresh bucket.
func checkReplay(ctx context.Context, c *redis.Client, sha, pattern string, args []string) error {
	key := strings.Replace(pattern, "__rand_int__", "replaycheck!", 1)
	defer c.Del(ctx, key)
	v, err := c.EvalSha(ctx, sha, []string{key}, toAny(args)...).Slice()
	if err != nil {
		return fmt.Errorf("replayed EVALSHA: %w", err)
	}
	if len(v) != 10 || v[1] != int64(1) || v[3] != int64(1) || v[4] != int64(benchLimit-1) {
		return fmt.Errorf("replayed EVALSHA answered %v, want an admission charging 1 of %d", v, benchLimit)
	}
	return nil
}

// checkAdmits peeks 100 of redis-benchmark's counters after the run: each
// must still admit (the load never ran a bucket dry).
func checkAdmits(ctx context.Context, c *redis.Client, sha, pattern string, args []string, keys int) error {
	peek := slices.Clone(args)
	peek[0] = "2" // ARGV[1]: op peek
	for i := 0; i < keys; i += max(1, keys/100) {
		key := strings.Replace(pattern, "__rand_int__", fmt.Sprintf("%012d", i), 1)
		v, err := c.EvalSha(ctx, sha, []string{key}, toAny(peek)...).Slice()
		if err != nil {
			return fmt.Errorf("peek: %w", err)
		}
		if len(v) != 10 || v[1] != int64(1) {
			return fmt.Errorf("redis-benchmark counter %s no longer admits: %v", key, v)
		}
	}
	return nil
}

// phase is one measured phase.
type phase struct {
	rate     float64 // successful calls per second
	calls    int64   // calls measured
	elapsed  time.Duration
	usec     float64 // Redis's usec_per_call of EVALSHA
	perRead  float64 // EVALSHA per socket read: the pipelines' depth
	server   float64 // redis-server CPU use (1 = one core)
	client   float64 // load generator CPU use (1 = one core)
	other    float64 // CPU used by every other process (noise)
	admitted float64 // fraction admitted (guard phases)
}

func printPhase(r int, name string, p phase, ratio float64) {
	fmt.Printf("round %d  %-18s %9.0f ops/s  (%d calls in %.2fs; redis %.2f µs/call, %.1f calls/read; CPU: redis-server %.2f, client %.2f, other %.2f",
		r, name, p.rate, p.calls, p.elapsed.Seconds(), p.usec, p.perRead, p.server, p.client, p.other)
	if ratio > 0 {
		fmt.Printf(", admitted %.3f)  ratio %.1f%%\n", p.admitted, 100*ratio)
	} else {
		fmt.Println(")")
	}
}

// rbench runs redis-benchmark.
type rbench struct {
	path string
	host string
	port int
	cfg  config
	sha  string
	keys []string // KEYS, each with __rand_int__ for -r
	args []string
}

// argv returns redis-benchmark's arguments for n calls.
func (b *rbench) argv(n int) []string {
	argv := []string{
		"-h", b.host, "-p", strconv.Itoa(b.port),
		"-c", strconv.Itoa(b.cfg.clients), "-P", strconv.Itoa(b.cfg.pipeline),
		"-n", strconv.Itoa(n), "-r", strconv.Itoa(b.cfg.keys), "-e", "--csv",
		"EVALSHA", b.sha, strconv.Itoa(len(b.keys)),
	}
	argv = append(argv, b.keys...)
	return append(argv, b.args...)
}

func (b *rbench) run(ctx context.Context, admin *redis.Client, n int) (phase, error) {
	argv := b.argv(n)
	if err := admin.ConfigResetStat(ctx).Err(); err != nil {
		return phase{}, err
	}
	cmd := exec.CommandContext(ctx, b.path, argv...)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	cpu0, busy0 := procCPU(ctx, admin), busyCPU()
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return phase{}, fmt.Errorf("redis-benchmark: %w\n%s%s", err, out.String(), stderr.String())
	}
	elapsed := time.Since(start)
	cpu1, busy1 := procCPU(ctx, admin), busyCPU()
	if bytes.Contains(out.Bytes(), []byte("Error from server")) {
		return phase{}, fmt.Errorf("redis-benchmark reported errors:\n%s", out.String())
	}
	rate, err := parseCSV(out.Bytes())
	if err != nil {
		return phase{}, err
	}
	st, err := evalStats(ctx, admin)
	if err != nil {
		return phase{}, err
	}
	// redis-benchmark may send up to one pipeline per client beyond -n.
	if slack := int64(b.cfg.clients * b.cfg.pipeline); st.calls < int64(n) || st.calls > int64(n)+slack || st.failed != 0 {
		return phase{}, fmt.Errorf("redis-benchmark: Redis counted %d EVALSHA (%d failed), want %d", st.calls, st.failed, n)
	}
	ps := cmd.ProcessState
	return phase{
		rate: rate, calls: int64(n), elapsed: elapsed, usec: st.usec,
		perRead: float64(st.calls) / float64(max(st.reads, 1)),
		server:  (cpu1 - cpu0) / elapsed.Seconds(),
		client:  (ps.UserTime() + ps.SystemTime()).Seconds() / elapsed.Seconds(),
		other:   max(0, busy1-busy0-(cpu1-cpu0)-(ps.UserTime()+ps.SystemTime()).Seconds()) / elapsed.Seconds(),
	}, nil
}

// parseCSV reads the requests per second from redis-benchmark --csv output:
// a header line, then "<test>","<rps>",...
func parseCSV(out []byte) (float64, error) {
	recs, err := csv.NewReader(bytes.NewReader(out)).ReadAll()
	if err != nil || len(recs) < 2 || len(recs[len(recs)-1]) < 2 {
		return 0, fmt.Errorf("redis-benchmark: unexpected output %q", out)
	}
	return strconv.ParseFloat(recs[len(recs)-1][1], 64)
}

type cmdStats struct {
	calls, failed int64
	usec          float64
	reads         int64 // socket reads Redis processed
}

// evalStats reads EVALSHA's line of INFO commandstats and the reads
// processed (INFO stats), since the last CONFIG RESETSTAT.
func evalStats(ctx context.Context, c *redis.Client) (cmdStats, error) {
	info, err := c.Info(ctx, "commandstats", "stats").Result()
	if err != nil {
		return cmdStats{}, err
	}
	var st cmdStats
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "total_reads_processed:"); ok {
			st.reads, _ = strconv.ParseInt(v, 10, 64)
		}
		rest, ok := strings.CutPrefix(sc.Text(), "cmdstat_evalsha:")
		if !ok {
			continue
		}
		for _, kv := range strings.Split(strings.TrimSpace(rest), ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "calls":
				st.calls, _ = strconv.ParseInt(v, 10, 64)
			case "failed_calls":
				st.failed, _ = strconv.ParseInt(v, 10, 64)
			case "usec_per_call":
				st.usec, _ = strconv.ParseFloat(v, 64)
			}
		}
	}
	return st, nil
}

// procCPU returns redis-server's CPU time in seconds (INFO cpu).
func procCPU(ctx context.Context, c *redis.Client) float64 {
	info, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		return 0
	}
	var total float64
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	return total
}

// busyCPU returns the CPU time, in seconds, every process on the machine
// has used since boot (Linux /proc/stat; 0 elsewhere).
func busyCPU() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	// user nice system idle iowait irq softirq steal (guest is in user).
	var busy float64
	for i, v := range f[1:9] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, _ := strconv.ParseFloat(v, 64)
		busy += n
	}
	return busy / 100 // USER_HZ
}

// selfCPU returns this process's CPU time in seconds.
func selfCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime) + tv(ru.Stime)
}

// guardPhase runs cfg.goroutines goroutines calling guard.CheckInto over
// reqs for cfg.duration, through a fresh Store with batch settings b.
func guardPhase(ctx context.Context, admin *redis.Client, client redis.UniversalClient, secret []byte,
	rs *rules.Ruleset, reqs []guard.Request, cfg config, st setting) (phase, error) {
	b := st.batch
	store := redisstore.New(client, append(b.options(), redisstore.WithTimeout(cfg.timeout))...)
	defer store.Close()
	g, err := guard.New(store, secret, rs)
	if err != nil {
		return phase{}, err
	}
	if st.procs > 0 {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(st.procs))
	}
	if err := admin.ConfigResetStat(ctx).Err(); err != nil {
		return phase{}, err
	}
	var (
		stop                       atomic.Bool
		checks, admitted, degraded atomic.Int64
		wg                         sync.WaitGroup
		errMu                      sync.Mutex
		firstErr                   error
	)
	calls0 := store.Calls()
	cpu0, self0, busy0 := procCPU(ctx, admin), selfCPU(), busyCPU()
	start := time.Now()
	for w := range cfg.goroutines {
		wg.Go(func() {
			var d guard.Decision
			var n, ok, deg int64
			for i := w * len(reqs) / cfg.goroutines; !stop.Load(); i++ {
				if err := g.CheckInto(context.Background(), &reqs[i%len(reqs)], &d); err != nil {
					errMu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					errMu.Unlock()
					break
				}
				n++
				if d.Allowed {
					ok++
				}
				if d.Degraded {
					deg++
				}
			}
			checks.Add(n)
			admitted.Add(ok)
			degraded.Add(deg)
		})
	}
	select {
	case <-time.After(cfg.duration):
	case <-ctx.Done():
	}
	stop.Store(true)
	wg.Wait()
	elapsed := time.Since(start)
	cpu1, self1, busy1 := procCPU(ctx, admin), selfCPU(), busyCPU()
	if firstErr != nil {
		return phase{}, firstErr
	}
	if err := ctx.Err(); err != nil {
		return phase{}, err
	}
	n, deg := checks.Load(), degraded.Load()
	ok := n - deg
	if deg > 0 {
		// A degraded decision failed open without an answer from Redis in
		// time: it is not counted as a check.
		fmt.Printf("evalbench: warning: guard %s: %d of %d decisions degraded (deadline %v); not counted\n", st, deg, n, cfg.timeout)
	}
	stats, err := evalStats(ctx, admin)
	if err != nil {
		return phase{}, err
	}
	// Every decided check is one EVALSHA that Redis ran; a degraded one
	// may or may not have been sent and run.
	if sent := store.Calls() - calls0; stats.calls < ok || stats.calls > sent || sent > n || stats.failed != 0 {
		return phase{}, fmt.Errorf("guard %s: %d checks (%d degraded), store sent %d scripts, Redis counted %d EVALSHA (%d failed): want one each",
			st, n, deg, sent, stats.calls, stats.failed)
	}
	if adm := admitted.Load() - deg; adm < ok*99/100 {
		return phase{}, fmt.Errorf("guard %s: only %d of %d checks admitted: the buckets ran dry", st, adm, ok)
	}
	return phase{
		rate: float64(ok) / elapsed.Seconds(), calls: ok, elapsed: elapsed, usec: stats.usec,
		perRead:  float64(stats.calls) / float64(max(stats.reads, 1)),
		server:   (cpu1 - cpu0) / elapsed.Seconds(),
		client:   (self1 - self0) / elapsed.Seconds(),
		other:    max(0, busy1-busy0-(cpu1-cpu0)-(self1-self0)) / elapsed.Seconds(),
		admitted: float64(admitted.Load()-deg) / float64(max(ok, 1)),
	}, nil
}

func median(xs []float64) float64 {
	v := slices.Clone(xs)
	slices.Sort(v)
	if len(v) == 0 {
		return 0
	}
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// quoteArgs joins args for a shell, quoting those that need it.
func quoteArgs(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, "{}$*?'\" \\") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		q[i] = a
	}
	return strings.Join(q, " ")
}

func serverVersion(ctx context.Context, c *redis.Client) string {
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return "?"
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return v
		}
	}
	return "?"
}
