package regionstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/internal/guardtest"
	"github.com/tollgate/tollgate/guard/redisstore"
	"github.com/tollgate/tollgate/guard/redisstore/regionstore"
	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/internal/regions"
)

// gate decides admissions through the guard's region script, as a
// gateway decides a global rule's counter, at a pinned time (the script
// reads Redis TIME only when it is given none).
type gate struct {
	store *redisstore.Store
	cfg   regions.Config
	fleet regions.Fleet
}

func newGate(tb testing.TB, client redis.UniversalClient, cfg regions.Config, fleet regions.Fleet, margin time.Duration) *gate {
	s := redisstore.New(client, redisstore.WithTTLMargin(margin), redisstore.WithTimeout(5*time.Second))
	tb.Cleanup(func() { s.Close() })
	return &gate{store: s, cfg: cfg, fleet: fleet}
}

// counter is the guard's counter of a global rule with lim, in region r1.
func (g *gate) counter(name string, lim regions.Limit, cost, lease int64) guard.Counter {
	alg := rules.FixedWindow
	switch lim.Kind {
	case regions.SlidingWindow:
		alg = rules.SlidingWindowCounter
	case regions.Bucket:
		alg = rules.TokenBucket
	}
	return guard.Counter{
		Name: name, Algorithm: alg, Params: rules.Params{Limit: lim.Units, Window: lim.Window, Precision: 1},
		Cost: cost, Lease: lease,
		Ledger: &guard.Ledger{
			Region: "r1", Limit: lim.Units, Static: g.fleet.Static(lim.Units)[g.fleet.Index("r1")],
			Window: lim.Window, Skew: g.cfg.Skew, Period: g.cfg.Period,
		},
	}
}

// check is a guard check of cost with a lease of up to lease units at
// now: the admission and the units leased.
func (g *gate) check(ctx context.Context, name string, lim regions.Limit, cost, lease, now int64) (regions.Admission, int64, error) {
	cs := []guard.Counter{g.counter(name, lim, cost, lease)}
	res := make([]guard.CounterResult, 1)
	if _, err := g.store.Do(ctx, guard.OpCheck, now, cs, res); err != nil {
		return regions.Admission{}, 0, err
	}
	r := res[0]
	return regions.Admission{Allowed: r.Allowed, Remaining: r.Remaining, RetryAfter: r.RetryAfter}, r.Leased, nil
}

// TestGateRefundOnCluster: on a three-node Cluster, a request whose
// global counter (its own slot, decided first) is admitted by the share
// ledger but whose key counter (another slot) rejects takes the ledger's
// charge back with its token, for every kind: the ledger holds what it
// held before, as a single script's rejection would have left it.
func TestGateRefundOnCluster(t *testing.T) {
	cl := redistest.StartClusterTB(t, 3)
	client := guardtest.RedisClient(t, redisstore.Config{Mode: redisstore.ModeCluster, Addrs: cl.Addrs(), Timeout: 2 * time.Second})
	ctx := context.Background()
	cfg := regions.Config{}.WithDefaults()
	fleet := regions.EqualFleet("r1", "r2")
	g := newGate(t, client, cfg, fleet, time.Minute)
	store, err := regionstore.New(client, cfg, fleet, "r1")
	if err != nil {
		t.Fatal(err)
	}
	for i, lim := range []regions.Limit{
		{Kind: regions.FixedWindow, Units: 10, Window: 3_600_000_000},
		{Kind: regions.SlidingWindow, Units: 10, Window: 3_600_000_000},
		{Kind: regions.Bucket, Units: 10, Window: 3_600_000_000},
	} {
		t.Run(lim.Kind.String(), func(t *testing.T) {
			global := g.counter(fmt.Sprintf("tg{g:refund%d}r", i), lim, 2, 0)
			key := guard.Counter{Name: fmt.Sprintf("tg{k:refund%d}r", i), Algorithm: rules.FixedWindow,
				Params: rules.Params{Limit: 1, Window: 3_600_000_000}, Cost: 1}
			if redisstore.Slot(global.Name) == redisstore.Slot(key.Name) {
				t.Fatal("the counters share a slot: the test would not cross slots")
			}
			do := func(cs ...guard.Counter) []guard.CounterResult {
				t.Helper()
				res := make([]guard.CounterResult, len(cs))
				if _, err := g.store.Do(ctx, guard.OpCheck, 0, cs, res); err != nil {
					t.Fatal(err)
				}
				return res
			}
			// One admission of the global counter alone, and the key
			// counter filled.
			if r := do(global); !r[0].Allowed {
				t.Fatalf("first admission: %+v", r[0])
			}
			if r := do(key); !r[0].Allowed {
				t.Fatalf("key counter: %+v", r[0])
			}
			state := func() regions.CounterState {
				t.Helper()
				tm, err := client.Time(ctx).Result()
				if err != nil {
					t.Fatal(err)
				}
				st, err := store.State(ctx, global.Name, lim, tm.UnixMicro())
				if err != nil {
					t.Fatal(err)
				}
				return st
			}
			before := state()
			if before.Used != 2 {
				t.Fatalf("the ledger counts %d used after one admission of 2", before.Used)
			}
			for range 3 {
				r := do(global, key)
				if r[0].Charged || r[1].Allowed {
					t.Fatalf("the key counter did not reject, or the global one stayed charged: %+v", r)
				}
			}
			if after := state(); after.Used != before.Used {
				t.Fatalf("the ledger counts %d used after rejected requests, %d before: the charges were not taken back", after.Used, before.Used)
			}
		})
	}
}

// TestGateLimitChangeCarriesOver: a global counter whose limit changes
// (an override, a penalty, a tier: the same counter under another limit)
// keeps what its region admitted: alternating limits never start it
// afresh, so the region admits at most its share of the larger one.
func TestGateLimitChangeCarriesOver(t *testing.T) {
	client, cfg, fleet := twoRegions(t)
	ctx := context.Background()
	g := newGate(t, client, cfg, fleet, time.Minute)
	for i, kind := range kinds {
		t.Run(kind.String(), func(t *testing.T) {
			name := fmt.Sprintf("tg{g:change%d}r", i)
			small := regions.Limit{Kind: kind, Units: 10, Window: 3_600_000_000} // a share of 5
			large := small
			large.Units = 12 // a share of 6
			admitted := 0
			for round := range 4 {
				for _, lim := range []regions.Limit{small, large} {
					for range 10 {
						a, _, err := g.check(ctx, name, lim, 1, 0, 0)
						if err != nil {
							t.Fatal(err)
						}
						if a.Allowed {
							admitted++
						}
					}
				}
				// A bucket's capacity that grows fills at its rate (here 6
				// an hour): it brings no tokens.
				want := 6
				if kind == regions.Bucket {
					want = 5
				}
				if admitted != want {
					t.Fatalf("round %d: %d admitted under limits alternating between 10 and 12, want %d", round, admitted, want)
				}
			}
		})
	}
}

// TestGateQuotaGrantOnFixedWindow: a quota grant on a global fixed
// window's counter gives back units of the window it is made in, wherever
// in the window, or in which of the window's cells (its body, the skew
// bands at its ends), they were counted.
func TestGateQuotaGrantOnFixedWindow(t *testing.T) {
	const sec = 1_000_000
	client, cfg, fleet := twoRegions(t)
	ctx := context.Background()
	g := newGate(t, client, cfg, fleet, time.Hour)
	lim := regions.Limit{Kind: regions.FixedWindow, Units: 20, Window: sec} // a share of 10
	j := int64(1_763_000_000) * sec
	tests := []struct {
		name    string
		admit   []int64 // µs into window j: one admission each
		grantAt int64
	}{
		{"counted in the body, granted in the body", []int64{300_000, 310_000, 320_000, 330_000, 340_000, 350_000, 360_000, 370_000, 380_000, 390_000}, 500_000},
		{"counted in the band at the start, granted in the body", []int64{10_000, 20_000, 30_000, 40_000, 50_000, 60_000, 70_000, 80_000, 90_000, 95_000}, 500_000},
		{"counted in the body, granted in the band at the end", []int64{300_000, 310_000, 320_000, 330_000, 340_000, 350_000, 360_000, 370_000, 380_000, 390_000}, 950_000},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name := fmt.Sprintf("tg{g:grant%d-%d}r", i, time.Now().UnixNano())
			for _, at := range tt.admit {
				if a, _, err := g.check(ctx, name, lim, 1, 0, j+at); err != nil || !a.Allowed {
					t.Fatalf("admission at %dµs: %+v %v", at, a, err)
				}
			}
			if a, _, err := g.check(ctx, name, lim, 1, 0, j+tt.grantAt); err != nil || a.Allowed {
				t.Fatalf("the share is used: an admission at %dµs %+v %v", tt.grantAt, a, err)
			}
			cs := []guard.Counter{g.counter(name, lim, 3, 0)}
			if _, err := g.store.Do(ctx, guard.OpAddQuota, j+tt.grantAt, cs, make([]guard.CounterResult, 1)); err != nil {
				t.Fatal(err)
			}
			admitted := 0
			for range 5 {
				a, _, err := g.check(ctx, name, lim, 1, 0, j+tt.grantAt+1)
				if err != nil {
					t.Fatal(err)
				}
				if a.Allowed {
					admitted++
				}
			}
			if admitted != 3 {
				t.Fatalf("%d admitted after a grant of 3, want 3", admitted)
			}
		})
	}
}
