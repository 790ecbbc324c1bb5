package redisstore_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/internal/guardtest"
	"github.com/tollgate/tollgate/guard/redisstore"
	"github.com/tollgate/tollgate/guard/rules"
)

// benchCounters is how many distinct counters the calls are spread over.
const benchCounters = 10_000

// BenchmarkDo measures Store.Do with OpCheck on one counter per call (the
// miss path of a gateway: the call a decision makes when the fast path
// cannot answer it) through one local redis-server, with the store's
// default batching, at a given number of concurrent callers: 200 (deep
// pipelines, as BenchmarkCheckRedis in guard), 50 (the side-by-side load's
// workers) and 1 (every call its own round trip).
//
// Besides checks/s it reports client-µs/op: the CPU time of this process
// (the store, its Redis client and the benchmark loop; redis-server is a
// process of its own) per call, the figure a gateway pays per miss. Every
// call must be admitted and not fail; the setup checks that each counter
// is distinct and fresh and that every call sends exactly one script.
func BenchmarkDo(b *testing.B) {
	client := guardtest.Client(b, redistest.StartTB(b).Addr())
	store := redisstore.New(client)
	b.Cleanup(func() { store.Close() })
	algs := []struct {
		name   string
		alg    rules.Algorithm
		params rules.Params
	}{
		// A quota no run exhausts: every call an admission that reads and
		// writes the counter.
		{"token_bucket", rules.TokenBucket, rules.Params{Limit: 1_000_000, FullNum: 3_600_000_000, FullDen: 1}},
		{"fixed_window", rules.FixedWindow, rules.Params{Limit: 1_000_000, Window: 3_600_000_000}},
	}
	for _, a := range algs {
		var counters []guard.Counter
		for _, callers := range []int{200, 50, 1} {
			b.Run(fmt.Sprintf("%s/callers=%d", a.name, callers), func(b *testing.B) {
				if counters == nil {
					counters = benchSetup(b, store, a.name, a.alg, a.params)
				}
				runDo(b, store, counters, callers)
			})
		}
	}
}

// benchSetup names benchCounters counters of alg, charges each once and
// checks that every one was fresh (remaining = limit − 1) and that each
// call sent one script.
func benchSetup(b *testing.B, store *redisstore.Store, name string, alg rules.Algorithm, p rules.Params) []guard.Counter {
	b.Helper()
	counters := make([]guard.Counter, benchCounters)
	stamp := time.Now().UnixNano()
	for i := range counters {
		// As the guard names a key-scope counter of a key without tenant:
		// prefix, a 22-character key_id in the hash tag, a 3-character tag.
		id := fmt.Sprintf("%s%06d%016x", name[:2], i, stamp)[:22]
		counters[i] = guard.Counter{Name: "tg{" + id + "}aaC", Algorithm: alg, Params: p, Cost: 1}
	}
	ctx := context.Background()
	calls := store.Calls()
	res := make([]guard.CounterResult, 1)
	for i := range counters {
		if _, err := store.Do(ctx, guard.OpCheck, 0, counters[i:i+1], res); err != nil {
			b.Fatal(err)
		}
		if !res[0].Allowed || res[0].Remaining != p.Limit-1 {
			b.Fatalf("setup: counter %d: %+v, want a fresh counter admitted", i, res[0])
		}
	}
	if n := store.Calls() - calls; n != benchCounters {
		b.Fatalf("setup: %d scripts for %d calls", n, benchCounters)
	}
	return counters
}

// runDo checks counters from callers goroutines, each walking them from a
// different start.
func runDo(b *testing.B, store *redisstore.Store, counters []guard.Counter, callers int) {
	ctx := context.Background()
	var start atomic.Int64
	var failed, rejected atomic.Int64
	walk := func(next func() bool) {
		i := int(start.Add(7919)) % len(counters)
		res := make([]guard.CounterResult, 1)
		for next() {
			if _, err := store.Do(ctx, guard.OpCheck, 0, counters[i:i+1], res); err != nil {
				failed.Add(1)
			} else if !res[0].Allowed {
				rejected.Add(1)
			}
			if i++; i == len(counters) {
				i = 0
			}
		}
	}
	b.ReportAllocs()
	cpu0 := processCPU()
	b.ResetTimer()
	if callers == 1 {
		n := 0
		walk(func() bool { n++; return n <= b.N })
	} else {
		// SetParallelism multiplies by GOMAXPROCS.
		b.SetParallelism(max(1, callers/runtime.GOMAXPROCS(0)))
		b.RunParallel(func(pb *testing.PB) { walk(pb.Next) })
	}
	b.StopTimer()
	cpu := processCPU() - cpu0
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "checks/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "client-µs/op")
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d of %d calls failed", n, b.N)
	}
	if n := rejected.Load(); n > 0 {
		b.Fatalf("%d of %d calls rejected: the quota ran dry", n, b.N)
	}
}

// processCPU returns the user and system CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
