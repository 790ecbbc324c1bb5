package regionstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/redisstore"
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
