package lease_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/lease"
	"github.com/tollgate/tollgate/guard/memstore"
)

// fastPathKeys is how many keys the fast-path benchmark spreads its checks
// over: each is a hot counter with a lease (or a negative entry) of its
// own, so parallel goroutines rarely contend on one counter.
const fastPathKeys = 1000

// BenchmarkFastPath measures the local fast path (target ≥ 5 M checks/s per core): Guard.CheckInto
// for hot counters answered from their lease (admissions) or their
// negative-cache entry (rejections), with rules resolved through the
// guard's resolution cache. The wrapped store is the in-memory one; the
// benchmark checks its setup before timing (every key resolved, leased or
// rejected, a check allocating nothing and reaching no store) and after
// (at most 1 check in 1,000 reached the store: a lease is renewed when
// used up), and reports checks/s per core (GOMAXPROCS) and the share of
// checks that missed.
func BenchmarkFastPath(b *testing.B) {
	for _, bc := range []struct {
		name  string
		rules string
		allow bool
	}{
		{"lease", "rules:\n  - {id: r, match: {}, algorithm: fixed_window, limit: 1000000000000, window: 1h}\n", true},
		{"lease/token_bucket", "rules:\n  - {id: r, match: {}, algorithm: token_bucket, capacity: 1000000000000, rate: 1000000000000/1h}\n", true},
		{"negative", "rules:\n  - {id: r, match: {}, algorithm: fixed_window, limit: 1, window: 1h}\n", false},
	} {
		b.Run(bc.name, func(b *testing.B) {
			inner := &storeCalls{Store: memstore.New()}
			ls := lease.New(inner)
			b.Cleanup(func() { ls.Close() })
			g, err := guard.New(ls, secret, mustRules(b, bc.rules))
			if err != nil {
				b.Fatal(err)
			}
			reqs := make([]guard.Request, fastPathKeys)
			for i := range reqs {
				reqs[i] = guard.Request{Key: fmt.Sprintf("sk_fast_%04d", i), Path: "/v1/items", Method: "GET"}
			}
			fastPathSetup(b, g, ls, inner, reqs, bc.allow)

			var start, wrong atomic.Int64
			misses := ls.Stats().Miss
			calls := inner.calls.Load()
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := int(start.Add(7919))
				var d guard.Decision
				ctx := context.Background()
				for pb.Next() {
					if err := g.CheckInto(ctx, &reqs[i%len(reqs)], &d); err != nil || d.Allowed != bc.allow {
						wrong.Add(1)
					}
					i++
				}
			})
			b.StopTimer()
			perCore := float64(b.N) / b.Elapsed().Seconds() / float64(runtime.GOMAXPROCS(0))
			b.ReportMetric(perCore, "checks/s/core")
			if n := wrong.Load(); n > 0 {
				b.Fatalf("%d of %d checks were not %v", n, b.N, map[bool]string{true: "admitted", false: "rejected"}[bc.allow])
			}
			missed := ls.Stats().Miss - misses
			reached := inner.calls.Load() - calls
			b.ReportMetric(float64(missed)/float64(b.N), "misses/op")
			if missed*1000 > int64(b.N) {
				b.Fatalf("%d of %d checks missed the fast path (%d store calls): not a measure of it", missed, b.N, reached)
			}
		})
	}
}

// fastPathSetup warms every key up until its counter is answered locally,
// then requires that a check reaches no store and allocates nothing.
func fastPathSetup(b *testing.B, g *guard.Guard, ls *lease.Store, inner *storeCalls, reqs []guard.Request, allow bool) {
	b.Helper()
	ctx := context.Background()
	var d guard.Decision
	for round := 0; ; round++ {
		misses := ls.Stats().Miss
		for i := range reqs {
			if err := g.CheckInto(ctx, &reqs[i], &d); err != nil {
				b.Fatal(err)
			}
		}
		if ls.Stats().Miss == misses {
			break
		}
		if round == 50 {
			b.Fatalf("setup: after %d rounds over %d keys, checks still miss the fast path", round, len(reqs))
		}
	}
	calls := inner.calls.Load()
	// One check of each key in turn: well within every key's lease.
	next := 0
	allocs := testing.AllocsPerRun(len(reqs)-1, func() {
		if err := g.CheckInto(ctx, &reqs[next], &d); err != nil || d.Allowed != allow {
			b.Fatalf("setup: %v %+v", err, d)
		}
		next++
	})
	if allocs != 0 {
		b.Fatalf("setup: a fast-path check allocates (%.2f allocations per check)", allocs)
	}
	if n := inner.calls.Load() - calls; n != 0 {
		b.Fatalf("setup: %d fast-path checks reached the store", n)
	}
}

// storeCalls counts the calls reaching a store.
type storeCalls struct {
	guard.Store
	calls atomic.Int64
}

func (s *storeCalls) Do(ctx context.Context, op guard.Op, now int64, cs []guard.Counter, res []guard.CounterResult) (int64, error) {
	s.calls.Add(1)
	return s.Store.Do(ctx, op, now, cs, res)
}
