package counterbytes

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/guard/internal/guardtest"
	"github.com/tollgate/tollgate/guard/redisstore"
	"github.com/tollgate/tollgate/guard/rules"
)

// TestCountersOutliveTheMeasure: the counters a measure creates live for
// hours, so that none expires while millions more are created (which
// would leave fewer keys than counters), and a measure reads one key per
// counter and plausible sizes.
func TestCountersOutliveTheMeasure(t *testing.T) {
	srv := redistest.StartTB(t)
	client := guardtest.RedisClient(t, redisstore.Config{Addrs: []string{srv.Addr()}, Timeout: 5 * time.Second})
	store := redisstore.New(client, redisstore.WithTimeout(5*time.Second))
	defer store.Close()
	ctx := context.Background()
	algs := []rules.Algorithm{rules.TokenBucket, rules.GCRA, rules.FixedWindow, rules.SlidingWindowCounter, rules.SlidingWindowLog}
	if err := LoadScripts(ctx, client, store, algs); err != nil {
		t.Fatal(err)
	}
	for _, alg := range algs {
		stamp := time.Now().UnixNano()
		if err := Create(ctx, store, alg, Params(), 3, stamp); err != nil {
			t.Fatal(err)
		}
		ttl, err := client.PTTL(ctx, Name(2, stamp)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl < 5*time.Hour {
			t.Errorf("%s: a counter expires in %v, want hours", alg, ttl)
		}
		r, err := Measure(ctx, client, store, alg, 500, 10)
		if err != nil {
			t.Fatal(err)
		}
		if r.UsedBefore <= 0 || r.UsedAfter <= 0 || r.Usage < 50 || r.Usage > 400 || r.Type == "" {
			t.Errorf("%s: implausible %+v", alg, r)
		}
	}
	if _, err := Measure(ctx, client, store, rules.GCRA, 0, 1); err == nil {
		t.Error("a measure of no counter passed")
	}
}
