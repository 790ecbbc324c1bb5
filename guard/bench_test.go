package guard_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/memstore"
)

// Benchmarks of Guard.CheckInto through Redis and through memstore. Results
// and the commands that produce them are in docs/benchmarks.md; `make bench`
// runs them, then the EVALSHA ratio
// (loadtest/cmd/evalbench).

const (
	// benchKeys is how many distinct API keys the checks are spread over.
	benchKeys = 10_000
	// benchTenants is how many tenants the key+tenant case spreads them over.
	benchTenants = 100
	// benchGoroutines is about how many goroutines check concurrently
	// through Redis: enough for deep pipelines (with 100 they carry half as
	// many calls and redis-server idles more; see docs/benchmarks.md).
	benchGoroutines = 200
)

// benchCase is one ruleset to benchmark. The per-key rule is always named
// "key". Its parameters are mostly hourly quotas with a wide margin: a
// benchmark run charges each key a few dozen units at most (a few hundred
// with memstore), so every check is an admission that reads and writes
// state (the path that costs the most), and counters outlive the setup
// check.
type benchCase struct {
	name    string
	rules   string
	tenants bool // requests carry a tenant (benchTenants of them)
}

var benchCases = []benchCase{
	{name: "token_bucket", rules: `
rules:
  - {id: key, match: {}, algorithm: token_bucket, capacity: 1000, rate: 1000/1h}
`},
	{name: "gcra", rules: `
rules:
  - {id: key, match: {}, algorithm: gcra, limit: 1000, window: 1h, burst: 1000}
`},
	{name: "fixed_window", rules: `
rules:
  - {id: key, match: {}, algorithm: fixed_window, limit: 1000, window: 1h}
`},
	{name: "sliding_window_counter", rules: `
rules:
  - {id: key, match: {}, algorithm: sliding_window_counter, limit: 1000, window: 1h}
`},
	// The log holds one entry per charge in the window, so its cost grows
	// with them: a 1 s window keeps it at a steady few (tens for
	// memstore) per key instead of growing with b.N.
	{name: "sliding_window_log", rules: `
rules:
  - {id: key, match: {}, algorithm: sliding_window_log, limit: 1000, window: 1s}
`},
	// Two rules, one EVALSHA: the key's counter and its tenant's share a
	// hash tag.
	{name: "key+tenant", tenants: true, rules: `
rules:
  - {id: key, match: {}, algorithm: token_bucket, capacity: 1000, rate: 1000/1h}
  - {id: tenant, scope: tenant, match: {}, algorithm: gcra, limit: 1000000, window: 1h, burst: 100000}
`},
}

// benchRequests returns n requests with distinct keys (and, with tenants,
// benchTenants tenants from a trusted auth layer).
func benchRequests(n int, tenants bool) []guard.Request {
	reqs := make([]guard.Request, n)
	for i := range reqs {
		reqs[i] = guard.Request{Key: fmt.Sprintf("sk_bench_%06d", i), Path: "/v1/items", Method: "GET"}
		if tenants {
			reqs[i].Tenant = fmt.Sprintf("tenant%03d", i%benchTenants)
		}
	}
	return reqs
}

// benchSetup builds the guard for bc and checks the setup before anything
// is timed: the keys have distinct key_ids (so distinct counters: a key
// without tenant is its own hash tag), and one warm-up check per key is
// admitted, not degraded, and finds its key counter fresh (remaining =
// limit − 1: no two keys share a counter). calls, when not nil, counts the
// store's script calls: the warm-up must cost exactly one per check.
func benchSetup(b *testing.B, store guard.Store, calls func() int64, bc benchCase) (*guard.Guard, []guard.Request) {
	b.Helper()
	g := mustGuard(b, store, mustRules(b, bc.rules))
	reqs := benchRequests(benchKeys, bc.tenants)
	ids := make(map[string]bool, len(reqs))
	for i := range reqs {
		ids[g.KeyID(reqs[i].Key)] = true
	}
	if len(ids) != len(reqs) {
		b.Fatalf("setup: %d keys have only %d distinct key_ids", len(reqs), len(ids))
	}

	var before int64
	if calls != nil {
		before = calls()
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		faults []string
	)
	workers := 32
	for w := range workers {
		wg.Go(func() {
			var d guard.Decision
			for i := w; i < len(reqs); i += workers {
				err := g.CheckInto(context.Background(), &reqs[i], &d)
				fault := ""
				switch {
				case err != nil:
					fault = err.Error()
				case !d.Allowed || d.Degraded:
					fault = fmt.Sprintf("allowed=%v degraded=%v reason=%s", d.Allowed, d.Degraded, d.Reason)
				default:
					if r := ruleResult(&d, "key"); r == nil || r.Remaining != r.Limit-1 {
						fault = fmt.Sprintf("key counter not fresh: %+v", r)
					}
				}
				if fault != "" {
					mu.Lock()
					faults = append(faults, fmt.Sprintf("key %d: %s", i, fault))
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if len(faults) > 0 {
		b.Fatalf("setup: %d of %d warm-up checks went wrong, first: %s", len(faults), len(reqs), faults[0])
	}
	if calls != nil {
		if n := calls() - before; n != int64(len(reqs)) {
			b.Fatalf("setup: %d checks sent %d scripts, want one each", len(reqs), n)
		}
	}
	return g, reqs
}

func ruleResult(d *guard.Decision, id string) *guard.RuleResult {
	for i := range d.Rules {
		if d.Rules[i].ID == id {
			return &d.Rules[i]
		}
	}
	return nil
}

// runChecks times b.N checks spread over reqs from parallel goroutines
// (parallelism × GOMAXPROCS of them), each reusing its Decision, and reports
// checks/s and the admitted fraction. A degraded decision (the store failed
// and the guard failed open) fails the benchmark: it would be counted as a
// check that never reached Redis.
func runChecks(b *testing.B, g *guard.Guard, reqs []guard.Request, parallelism int) {
	b.ReportAllocs()
	b.SetParallelism(parallelism)
	var start, admitted, degraded atomic.Int64
	ctx := context.Background()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		// Goroutines start far apart in the key list and walk it in order.
		i := int(start.Add(7919))
		var d guard.Decision
		var ok, deg int64
		for pb.Next() {
			if err := g.CheckInto(ctx, &reqs[i%len(reqs)], &d); err != nil {
				b.Error(err)
				return
			}
			i++
			if d.Allowed {
				ok++
			}
			if d.Degraded {
				deg++
			}
		}
		admitted.Add(ok)
		degraded.Add(deg)
	})
	elapsed := b.Elapsed()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "checks/s")
	frac := float64(admitted.Load()) / float64(b.N)
	b.ReportMetric(frac, "admitted")
	if n := degraded.Load(); n > 0 {
		b.Fatalf("%d of %d decisions were degraded (store errors): not a measure of the store", n, b.N)
	}
	if frac < 0.9 {
		b.Fatalf("only %.1f%% of checks admitted: the benchmark would measure rejections", 100*frac)
	}
}

// BenchmarkCheckRedis measures Guard.CheckInto through one local
// redis-server with the store's default batching, about benchGoroutines
// goroutines checking at once over benchKeys keys. Each case is set up once
// and its counters carry over between its runs (b.N steps and -count): a
// run charges each key a few dozen units of its 1000. On a small machine
// the benchmark process and redis-server share the CPUs; compare figures
// only within one run (see docs/benchmarks.md).
func BenchmarkCheckRedis(b *testing.B) {
	store := newRedisStore(b)
	parallelism := max(1, benchGoroutines/runtime.GOMAXPROCS(0))
	for _, bc := range benchCases {
		var (
			g    *guard.Guard
			reqs []guard.Request
		)
		b.Run(bc.name, func(b *testing.B) {
			if g == nil {
				g, reqs = benchSetup(b, store, store.Calls, bc)
			}
			runChecks(b, g, reqs, parallelism)
		})
	}
}

// BenchmarkCheckMemstore is BenchmarkCheckRedis with the in-memory store
// (the fail-closed fallback and reference model): the guard's own cost
// without a network, one goroutine per CPU. Every run starts from a fresh
// store: at this speed the runs of one -count would otherwise drain the
// hourly quotas.
func BenchmarkCheckMemstore(b *testing.B) {
	for _, bc := range benchCases {
		b.Run(bc.name, func(b *testing.B) {
			g, reqs := benchSetup(b, memstore.New(), nil, bc)
			runChecks(b, g, reqs, 1)
		})
	}
}
