package guard_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/internal/guardtest"
	"github.com/tollgate/tollgate/guard/lease"
	"github.com/tollgate/tollgate/guard/memstore"
	"github.com/tollgate/tollgate/guard/redisstore/regionstore"
	"github.com/tollgate/tollgate/internal/regions"
)

// The regions of the tests' rules (eu and us, equal weights), as a
// region's agent holds them.
var (
	regionsConfig = regions.Config{}.WithDefaults()
	regionsFleet  = regions.EqualFleet("eu", "us")
)

// regionAlgorithms are the algorithms' parameters, L = 7 per 500 ms (a
// bucket: capacity 7, refilled in 500 ms).
var regionAlgorithms = []string{
	"algorithm: fixed_window\n    limit: 7\n    window: 500ms",
	"algorithm: sliding_window_log\n    limit: 7\n    window: 500ms",
	"algorithm: sliding_window_counter\n    limit: 7\n    window: 500ms\n    precision: 4",
	"algorithm: token_bucket\n    capacity: 7\n    rate: 7/500ms",
	"algorithm: gcra\n    limit: 7\n    window: 500ms\n    burst: 7",
}

// TestGlobalRuleAcrossRegions: two regions, each its own redis-server and
// gateway (guard) told its region, and a client rotating between them at a
// check a millisecond (about 70 × L) for 2.5 windows. A global rule admits
// at most L across both: every admission, in time order, is one that a
// single region holding the whole limit admits too (memstore, the exact
// model of the Redis scripts, judges). A regional rule gives each region
// the whole limit: 2 × L per fixed window. Nothing here, nor anything on
// the request path, calls the other region: each guard holds only its own
// store.
func TestGlobalRuleAcrossRegions(t *testing.T) {
	t.Parallel()
	const fleet = "regions: [{name: eu}, {name: us}]\n"
	for _, alg := range regionAlgorithms {
		name, _, _ := strings.Cut(strings.TrimPrefix(alg, "algorithm: "), "\n")
		for _, mode := range []string{"global", "global-leases", "regional"} {
			if mode == "regional" && name != "fixed_window" {
				continue // one algorithm shows the regional N × L
			}
			t.Run(name+"/"+mode, func(t *testing.T) {
				t.Parallel()
				regionsMode, leases := strings.CutSuffix(mode, "-leases")
				rule := "rules:\n  - id: r\n    match: {}\n    regions: " + regionsMode + "\n    " + alg + "\n"
				rs := mustRules(t, fleet+rule)
				ctx := context.Background()
				clients := []redis.UniversalClient{guardtest.Client(t, redistest.StartTB(t).Addr()), guardtest.Client(t, redistest.StartTB(t).Addr())}
				store := func(i int) guard.Store {
					if !leases {
						return newStoreOn(t, clients[i])
					}
					// The local fast path: leases and the negative cache
					// against the share.
					s := lease.New(newStoreOn(t, clients[i]))
					t.Cleanup(func() { s.Close() })
					return s
				}
				regions := []*guard.Guard{
					mustGuard(t, store(0), rs, guard.WithRegion("eu")),
					mustGuard(t, store(1), rs, guard.WithRegion("us")),
				}
				type admission struct {
					at     int64
					region int
				}
				var admitted []admission
				req := &guard.Request{Key: "sk_rotating", Path: "/"}
				var start int64
				// A check a millisecond (about 70 × L per window) for 2.5
				// windows.
				end := time.Now().Add(1250 * time.Millisecond)
				tick := time.NewTicker(time.Millisecond)
				defer tick.Stop()
				for i := 0; time.Now().Before(end); i++ {
					<-tick.C
					d, err := regions[i%2].Check(ctx, req)
					if err != nil {
						t.Fatal(err)
					}
					if d.Degraded {
						t.Fatalf("decided without Redis: %+v", d)
					}
					if start == 0 {
						start = d.Time
					}
					rr := d.Rules[0]
					wantLimit := int64(7)
					if regionsMode == "global" {
						wantLimit = []int64{4, 3}[i%2] // 7 split equally, the odd unit to the first
					}
					if rr.Limit != wantLimit || rr.Remaining > wantLimit {
						t.Fatalf("region %d: limit %d remaining %d, want the region's share %d", i%2, rr.Limit, rr.Remaining, wantLimit)
					}
					if !d.Allowed && (d.RetryAfter < 1 || d.Status != 429) {
						t.Fatalf("rejected with status %d, Retry-After %d", d.Status, d.RetryAfter)
					}
					if d.Allowed {
						admitted = append(admitted, admission{d.Time, i % 2})
					}
				}
				slices.SortStableFunc(admitted, func(a, b admission) int { return int(a.at - b.at) })
				if mode == "regional" {
					// A whole window: 7 in each region.
					per := map[int64]int{}
					for _, a := range admitted {
						per[a.at/500_000]++
					}
					first := start/500_000 + 1
					if got := per[first]; got != 14 {
						t.Fatalf("regional: %d admitted in window %d, want 2 × 7 (per window %v)", got, first, per)
					}
					return
				}
				// The judge: one region alone with the whole limit. Across
				// regions a sliding window is exact (the share ledger keeps
				// every admission of the trailing window): at most L in
				// every interval of the window's length, the log's rule.
				judged := rule
				if name == "sliding_window_counter" {
					judged = strings.Replace(rule, "sliding_window_counter", "sliding_window_log", 1)
					judged = strings.Replace(judged, "\n    precision: 4", "", 1)
				}
				whole := mustRules(t, judged)
				var now int64
				judge := mustGuard(t, memstore.New(memstore.WithClock(func() int64 { return now })), whole)
				for k, a := range admitted {
					now = a.at
					d, err := judge.Check(ctx, req)
					if err != nil {
						t.Fatal(err)
					}
					if !d.Allowed {
						t.Fatalf("admission %d (region %d at +%dµs) exceeds the global limit: %s", k, a.region, a.at-start, describeAdmissions(admitted, start))
					}
				}
				if len(admitted) < 7 {
					t.Fatalf("only %d admitted in 2.5 windows", len(admitted))
				}
				// Each region decided against its share ledger, where the
				// region's agent gives and receives loans.
				for i, region := range []string{"eu", "us"} {
					st, err := regionstore.New(clients[i], regionsConfig, regionsFleet, region)
					if err != nil {
						t.Fatal(err)
					}
					name := regions[i].CounterNames(req)[0]
					if _, ok, err := st.Inspect(ctx, name, time.Now().UnixMicro()); err != nil || !ok {
						t.Fatalf("region %s: no share ledger for %s (%v): the rule was not decided against it", region, name, err)
					}
				}
			})
		}
	}
}

func describeAdmissions[T any](as []T, start int64) string {
	return fmt.Sprintf("%d admissions from %d: %+v", len(as), start, as)
}

// TestGlobalRuleShareOfZero: with a limit below the number of regions
// some regions hold a share of 0. There every request is a 429 with a
// Retry-After (a cost within the whole limit is never a 400: units may be
// lent to the region), in Redis and in memory alike.
func TestGlobalRuleShareOfZero(t *testing.T) {
	t.Parallel()
	const fleet = "regions: [{name: eu}, {name: us}, {name: ap}]\n"
	zero := []string{
		"algorithm: fixed_window\n    limit: 2\n    window: 500ms",
		"algorithm: sliding_window_log\n    limit: 2\n    window: 500ms",
		"algorithm: sliding_window_counter\n    limit: 2\n    window: 500ms\n    precision: 4",
		"algorithm: token_bucket\n    capacity: 2\n    rate: 2/500ms",
		"algorithm: gcra\n    limit: 2\n    window: 500ms\n    burst: 2",
	}
	for _, alg := range zero {
		name, _, _ := strings.Cut(strings.TrimPrefix(alg, "algorithm: "), "\n")
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			rs := mustRules(t, fleet+"rules:\n  - id: r\n    match: {}\n    regions: global\n    "+alg+"\n")
			for _, store := range []struct {
				name string
				s    guard.Store
			}{{"redis", newRedisStore(t)}, {"memory", memstore.New()}} {
				g := mustGuard(t, store.s, rs, guard.WithRegion("ap"))
				for i := 0; i < 3; i++ {
					d, err := g.Check(context.Background(), &guard.Request{Key: "sk_zero", Path: "/"})
					if err != nil {
						t.Fatal(err)
					}
					if d.Allowed || d.Status != 429 || d.RetryAfter < 1 || d.Rules[0].Limit != 0 || d.Rules[0].Remaining != 0 {
						t.Fatalf("%s: share of 0 answered %+v", store.name, d)
					}
				}
			}
		})
	}
}

// TestGrownShareLiftsNegativeCache: a counter rejected against its share
// is answered from the negative cache until its Retry-After (here up to a
// minute); a share table that grows its share has it decided against the
// new share by the very next request, and one that leaves it alone does
// not.
func TestGrownShareLiftsNegativeCache(t *testing.T) {
	t.Parallel()
	// One region holding half of every global limit: no other region to
	// lend to or borrow from, so no share ledger; the share table moves
	// the share (with several regions the ledger does, and a received
	// loan lifts the cache: TestLoanMovesUnitsBetweenRegions).
	rs := mustRules(t, "regions: [{name: eu, weight: 0.5}]\nrules:\n  - id: r\n    match: {}\n    regions: global\n    algorithm: fixed_window\n    limit: 4\n    window: 1m\n")
	fast := lease.New(newRedisStore(t))
	t.Cleanup(func() { fast.Close() })
	g := mustGuard(t, fast, rs, guard.WithRegion("eu"))
	ctx := context.Background()
	req := &guard.Request{Key: "sk_grow", Path: "/"}
	other := &guard.Request{Key: "sk_other", Path: "/"}
	check := func(r *guard.Request) *guard.Decision {
		t.Helper()
		d, err := g.Check(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	admitted := 0
	for i := 0; i < 6; i++ {
		if check(req).Allowed {
			admitted++
		}
	}
	if admitted != 2 {
		t.Fatalf("%d admitted against a static share of 2 (half of 4)", admitted)
	}
	if fast.Stats().Negative == 0 {
		t.Fatal("the negative cache answered nothing: the test would not show it lifted")
	}
	names := g.CounterNames(req)
	if len(names) != 1 {
		t.Fatalf("counter names %v", names)
	}
	// Another counter's share changes: this one stays rejected.
	g.SetShares(map[string]int64{g.CounterNames(other)[0]: 4})
	if d := check(req); d.Allowed || d.Rules[0].Limit != 2 {
		t.Fatalf("another counter's share changed this one's: %+v", d.Rules[0])
	}
	g.SetShares(map[string]int64{names[0]: 3})
	d := check(req)
	if !d.Allowed || d.Rules[0].Limit != 3 || d.Rules[0].Remaining != 0 {
		t.Fatalf("after the share grew to 3: allowed %v, %+v", d.Allowed, d.Rules[0])
	}
	if d := check(req); d.Allowed {
		t.Fatalf("admitted beyond the grown share: %+v", d.Rules[0])
	}
	// A share above the limit is held to the limit.
	g.SetShares(map[string]int64{names[0]: 40})
	if d := check(req); !d.Allowed || d.Rules[0].Limit != 4 {
		t.Fatalf("share of 40 of a limit of 4: allowed %v, %+v", d.Allowed, d.Rules[0])
	}
}
