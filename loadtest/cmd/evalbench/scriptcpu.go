package main

// The -baseline mode: Redis CPU per call of the guard's script, per
// algorithm, against the script of an earlier commit, in one run.
//
// For each case (one key-scope rule of each algorithm, a token bucket that
// asks for a lease, and a key rule beside a tenant rule decided by the same
// call) it takes the KEYS and ARGV a real Guard sends (as the -P 16 ratio
// run does), loads the baseline script (the lua/ files of a git revision,
// assembled as that revision's script.go did) and the store's script into
// one redis-server, checks that both answer the same to a few replayed
// calls with an explicit clock, and then runs redis-benchmark -P 16 of each
// script in turn, round after round (old then new, new then old, …), each
// script on keys of its own: only figures taken side by side compare on a
// shared machine. Every phase reports
// redis-server's CPU per call (INFO cpu, user + sys, over the calls made:
// what a Redis shard pays per decision, I/O included) and Redis's
// usec_per_call of EVALSHA (the command's own wall time, which a busy
// machine inflates when it deschedules redis-server).

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/redisstore"
	"github.com/tollgate/tollgate/guard/rules"
)

// baselineParts are the lua/ files the one script was assembled from, in
// order, before the per-algorithm slim paths (branch lean, f1a8d53).
var baselineParts = []string{
	"prelude.lua", "bucket.lua", "fixed_window.lua",
	"sliding_window_counter.lua", "sliding_window_log.lua", "decide.lua",
}

// cpuCase is one call shape measured.
type cpuCase struct {
	name  string
	rules string
	lease int64 // Counter.Lease set on every counter (0: none)
}

// Limits are high enough that no counter runs dry during a run (about 50
// calls per key per phase over 10,000 keys); the log's 1 s window keeps a
// few entries per key.
var cpuCases = []cpuCase{
	{name: "token_bucket", rules: `{id: b, match: {}, algorithm: token_bucket, capacity: 1000, rate: 1000/1m}`},
	{name: "gcra", rules: `{id: b, match: {}, algorithm: gcra, limit: 1000, window: 1m, burst: 1000}`},
	{name: "fixed_window", rules: `{id: b, match: {}, algorithm: fixed_window, limit: 100000, window: 1h}`},
	{name: "sliding_window_counter", rules: `{id: b, match: {}, algorithm: sliding_window_counter, limit: 100000, window: 1h}`},
	{name: "sliding_window_log", rules: `{id: b, match: {}, algorithm: sliding_window_log, limit: 1000, window: 1s}`},
	{name: "token_bucket+lease", lease: 8,
		rules: `{id: b, match: {}, algorithm: token_bucket, capacity: 1000000, rate: 1000000/1m}`},
	{name: "key tb+tenant gcra", rules: `{id: b, match: {}, algorithm: token_bucket, capacity: 1000, rate: 1000/1m}
  - {id: t, scope: tenant, match: {}, algorithm: gcra, limit: 1000000, window: 1h, burst: 100000}`},
}

// baselineScript assembles the script of revision ref from its lua/ files.
func baselineScript(ctx context.Context, ref string) (redisstore.Script, error) {
	var b strings.Builder
	for _, f := range baselineParts {
		out, err := exec.CommandContext(ctx, "git", "show", ref+":guard/redisstore/lua/"+f).Output()
		if err != nil {
			return redisstore.Script{}, fmt.Errorf("git show %s:guard/redisstore/lua/%s: %w", ref, f, err)
		}
		b.Write(out)
		b.WriteByte('\n')
	}
	return redisstore.NewScript(b.String()), nil
}

// caseCounters returns the counters a real Guard sends for one request
// under c's rules, named as the store names them.
func caseCounters(ctx context.Context, c cpuCase, store *redisstore.Store) ([]guard.Counter, error) {
	rs, err := rules.Load([]byte("rules:\n  - " + c.rules + "\n"))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.name, err)
	}
	capture := &captureStore{Store: store}
	g, err := guard.New(capture, []byte("evalbench-secret"), rs)
	if err != nil {
		return nil, err
	}
	if _, err := g.Check(ctx, &guard.Request{Key: "sk_evalbench_capture"}); err != nil {
		return nil, err
	}
	cs := slices.Clone(capture.counters)
	for i := range cs {
		cs[i].Lease = c.lease
	}
	return cs, nil
}

func runBaseline(ctx context.Context, cfg config, ref, only string) error {
	old, err := baselineScript(ctx, ref)
	if err != nil {
		return err
	}
	b, err := startBench(ctx, cfg)
	if err != nil {
		return err
	}
	defer b.close()
	rb, srv, admin := b.rb, b.srv, b.admin
	store := redisstore.New(b.client, redisstore.WithTimeout(cfg.timeout))
	defer store.Close()

	type variant struct {
		name   string
		script redisstore.Script
		bench  *rbench
		cpu    []float64 // redis-server CPU µs per call, one per round
		usec   []float64 // usec_per_call
	}
	type cell struct {
		c        cpuCase
		variants []*variant
	}
	var cells []*cell
	for _, c := range cpuCases {
		if only != "" && !slices.Contains(strings.Split(only, ","), c.name) {
			continue
		}
		cs, err := caseCounters(ctx, c, store)
		if err != nil {
			return err
		}
		keys, args := redisstore.ScriptArgs(guard.OpCheck, 0, 1000, cs)
		patterns := make([]string, len(keys))
		for i, k := range keys {
			if patterns[i], err = randKey(k); err != nil {
				return err
			}
		}
		cur := redisstore.DecideScript()
		for _, s := range []redisstore.Script{old, cur} {
			if sha, err := admin.ScriptLoad(ctx, s.Source).Result(); err != nil || sha != s.SHA {
				return fmt.Errorf("SCRIPT LOAD: %v (sha %s, want %s)", err, sha, s.SHA)
			}
		}
		if err := sameAnswers(ctx, admin, old.SHA, cur.SHA, patterns, args); err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		ce := &cell{c: c}
		for vi, v := range []struct {
			name string
			s    redisstore.Script
		}{{"baseline " + ref, old}, {"this tree", cur}} {
			// Each script has keys of its own (the key_id's first
			// character differs), so neither starts on state the other
			// left: a log left by the phase before is longer to read.
			own := make([]string, len(patterns))
			for i, p := range patterns {
				j := strings.IndexByte(p, '{') + 1
				own[i] = p[:j] + string(rune('A'+vi)) + p[j+1:]
			}
			ce.variants = append(ce.variants, &variant{name: v.name, script: v.s,
				bench: &rbench{path: rb, host: "127.0.0.1", port: srv.Port(), cfg: cfg, sha: v.s.SHA, keys: own, args: args}})
		}
		cells = append(cells, ce)
		fmt.Printf("evalbench: %-22s EVALSHA <sha> %d %s %s\n", c.name, len(patterns), strings.Join(patterns, " "), quoteArgs(args))
	}
	if len(cells) == 0 {
		return fmt.Errorf("-cases %q names no case", only)
	}
	fmt.Printf("evalbench: baseline %s sha %s; this tree: see each case\n", ref, old.SHA)
	// Warm up and size -n to cfg.duration at the baseline's rate.
	warm, err := cells[0].variants[0].bench.run(ctx, admin, 100_000)
	if err != nil {
		return err
	}
	n := max(100_000, int(warm.rate*cfg.duration.Seconds()))
	fmt.Printf("evalbench: %s %s (and likewise per case and script)\n", rb, quoteArgs(cells[0].variants[0].bench.argv(n)))
	for r := range cfg.rounds {
		for _, ce := range cells {
			// Old, new in odd rounds; new, old in even ones.
			vs := slices.Clone(ce.variants)
			if r%2 == 1 {
				slices.Reverse(vs)
			}
			for _, v := range vs {
				p, err := v.bench.run(ctx, admin, n)
				if err != nil {
					return fmt.Errorf("%s, %s: %w", ce.c.name, v.name, err)
				}
				cpu := p.server / p.rate * 1e6
				v.cpu = append(v.cpu, cpu)
				v.usec = append(v.usec, p.usec)
				fmt.Printf("round %d  %-22s %-16s %8.0f calls/s  redis CPU %5.2f µs/call  usec_per_call %5.2f  other CPU %.2f\n",
					r+1, ce.c.name, v.name, p.rate, cpu, p.usec, p.other)
			}
		}
	}
	fmt.Printf("\nsummary: redis-server CPU per call (µs), median (min–max) over %d rounds, -P %d -c %d -n %d -r %d\n",
		cfg.rounds, cfg.pipeline, cfg.clients, n, cfg.keys)
	for _, ce := range cells {
		o, c := ce.variants[0], ce.variants[1]
		fmt.Printf("summary: %-22s baseline %5.2f (%5.2f–%5.2f)  this tree %5.2f (%5.2f–%5.2f)  %+.0f%%   usec_per_call %5.2f → %5.2f\n",
			ce.c.name, median(o.cpu), slices.Min(o.cpu), slices.Max(o.cpu),
			median(c.cpu), slices.Min(c.cpu), slices.Max(c.cpu),
			100*(median(c.cpu)/median(o.cpu)-1), median(o.usec), median(c.usec))
	}
	return nil
}

// sameAnswers replays a few calls of both scripts, each on fresh keys of
// its own, with one explicit clock, and requires identical replies.
func sameAnswers(ctx context.Context, c *redis.Client, oldSHA, newSHA string, patterns, args []string) error {
	const now = 1_795_000_000_123_456
	a := slices.Clone(args)
	a[1] = strconv.FormatInt(now, 10) // ARGV[2]: the decision time
	var replies [2][]string
	for i, sha := range []string{oldSHA, newSHA} {
		keys := make([]string, len(patterns))
		for j, p := range patterns {
			keys[j] = strings.Replace(p, "__rand_int__", fmt.Sprintf("replay%06d", i), 1)
		}
		for step := range 3 {
			a[1] = strconv.FormatInt(now+int64(step)*1000, 10)
			v, err := c.EvalSha(ctx, sha, keys, toAny(a)...).Slice()
			if err != nil {
				return fmt.Errorf("replayed EVALSHA %s: %w", sha, err)
			}
			replies[i] = append(replies[i], fmt.Sprint(v))
		}
		c.Del(ctx, keys...)
	}
	if !slices.Equal(replies[0], replies[1]) {
		return fmt.Errorf("the scripts answer differently:\nbaseline  %v\nthis tree %v", replies[0], replies[1])
	}
	return nil
}
