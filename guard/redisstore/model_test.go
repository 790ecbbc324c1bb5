package redisstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/internal/guardtest"
	"github.com/tollgate/tollgate/guard/memstore"
	"github.com/tollgate/tollgate/guard/redisstore"
	"github.com/tollgate/tollgate/guard/rules"
)

var algorithms = []rules.Algorithm{
	rules.TokenBucket, rules.GCRA, rules.FixedWindow,
	rules.SlidingWindowCounter, rules.SlidingWindowLog,
}

// randomParams draws parameters for alg: small limits (so that counters fill
// and empty often), windows and rates that do and do not divide evenly.
func randomParams(rng *rand.Rand, alg rules.Algorithm) rules.Params {
	limit := int64(1 + rng.IntN(40))
	windows := []int64{250_000, 1_000_000, 3_000_000, 10_000_000, 60_000_000}
	w := windows[rng.IntN(len(windows))]
	p := rules.Params{Limit: limit, Window: w, Precision: 1}
	switch alg {
	case rules.TokenBucket, rules.GCRA:
		// rate: n units per w, n need not divide anything.
		n := int64(1 + rng.IntN(int(limit)+5))
		p.FullNum, p.FullDen = guardtest.FullRefill(limit, w, n)
		if alg == rules.TokenBucket {
			p.Window = 0
		}
	case rules.SlidingWindowCounter:
		precs := []int64{1, 2, 4, 5, 10}
		p.Precision = precs[rng.IntN(len(precs))]
	}
	return p
}

// TestScriptsMatchModel runs random sequences of operations through the
// Redis script and the memstore reference model, with the same explicit
// times, and requires identical answers for every counter: admitted,
// charged, remaining, reset, next (`t`), retry-after, refund token and
// lease granted. Checks ask for leases and give back parts of earlier ones;
// OpReturn gives back parts of leases on its own.
// Limits, rates and overrides change between steps (same counter names) to
// check that consumed units carry over the same way in both.
func TestScriptsMatchModel(t *testing.T) {
	client := guardtest.Client(t, redistest.StartTB(t).Addr())
	for _, batch := range []int{1, 16} {
		for seed := uint64(1); seed <= 6; seed++ {
			t.Run(fmt.Sprintf("batch=%d/seed=%d", batch, seed), func(t *testing.T) {
				store := redisstore.New(client, redisstore.WithTTLMargin(time.Hour),
					redisstore.WithTimeout(2*time.Second), redisstore.WithBatch(batch, 2))
				t.Cleanup(func() { store.Close() })
				runModelSequence(t, store, seed+uint64(batch)*100, 1500)
			})
		}
	}
}

type modelCounter struct {
	c      guard.Counter
	tokens []string // refund tokens of earlier charges
	leases []lease  // leases granted by earlier charges
}

type lease struct {
	token string
	units int64
}

func runModelSequence(t *testing.T, store guard.Store, seed uint64, steps int) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, seed*7919))
	model := memstore.New()
	now := int64(1_763_000_000_000_000) + rng.Int64N(1_000_000_000)

	// One hash tag per sequence so every subset is one script call.
	tag := fmt.Sprintf("{model-%d-%d}", seed, time.Now().UnixNano())
	pool := make([]*modelCounter, 8)
	for i := range pool {
		alg := algorithms[(i+int(seed))%len(algorithms)]
		if i >= len(algorithms) {
			alg = algorithms[rng.IntN(len(algorithms))]
		}
		pool[i] = &modelCounter{c: guard.Counter{
			Name:      fmt.Sprintf("tg%sc%d", tag, i),
			Algorithm: alg,
			Params:    randomParams(rng, alg),
		}}
	}

	leased := 0
	defer func() {
		if !t.Failed() && leased == 0 {
			t.Errorf("no lease was granted in %d steps: the sequence does not test leases", steps)
		}
	}()
	for step := 0; step < steps; step++ {
		// Time moves: often not at all or by microseconds, sometimes by a
		// large part of a window.
		switch r := rng.IntN(10); {
		case r < 2:
		case r < 5:
			now += rng.Int64N(1000)
		case r < 8:
			now += rng.Int64N(500_000)
		default:
			now += rng.Int64N(20_000_000)
		}
		// Rule changes: a new limit or rate keeps the counter (same name).
		if rng.IntN(40) == 0 {
			mc := pool[rng.IntN(len(pool))]
			p := randomParams(rng, mc.c.Algorithm)
			p.Window, p.Precision = mc.c.Params.Window, mc.c.Params.Precision
			if rng.IntN(2) == 0 {
				p = rules.Override{Factor: []float64{0.5, 2, 0.1}[rng.IntN(3)]}.Apply(mc.c.Params)
			}
			mc.c.Params = p
		}

		n := 1 + rng.IntN(3)
		picked := rng.Perm(len(pool))[:n]
		counters := make([]guard.Counter, n)
		var op guard.Op
		switch r := rng.IntN(21); {
		case r == 20:
			op = guard.OpReturn
		case r < 13:
			op = guard.OpCheck
		case r < 15:
			op = guard.OpPeek
		case r < 17:
			op = guard.OpReport
		case r < 18:
			op = guard.OpAddQuota
		case r < 19:
			op = guard.OpRefund
		case r < 20 && rng.IntN(2) == 0:
			op = guard.OpState
		default:
			op = guard.OpReset
		}
		for j, idx := range picked {
			mc := pool[idx]
			c := mc.c
			c.Cost = 1 + rng.Int64N(max(c.Params.Limit/3, 1))
			if op == guard.OpPeek {
				c.Cost = 1
			}
			c.Shadow = op == guard.OpCheck && rng.IntN(5) == 0
			if op == guard.OpCheck && !c.Shadow && rng.IntN(3) == 0 {
				c.Lease = 1 + rng.Int64N(c.Params.Limit)
			}
			if (op == guard.OpCheck && rng.IntN(4) == 0 || op == guard.OpReturn) && len(mc.leases) > 0 {
				k := rng.IntN(len(mc.leases))
				l := mc.leases[k]
				mc.leases = append(mc.leases[:k], mc.leases[k+1:]...)
				c.Token, c.Return = l.token, 1+rng.Int64N(l.units)
			}
			if op == guard.OpRefund {
				if len(mc.tokens) > 0 {
					k := rng.IntN(len(mc.tokens))
					c.Token = mc.tokens[k]
					mc.tokens = append(mc.tokens[:k], mc.tokens[k+1:]...)
				} else {
					c.Token = "1"
				}
			}
			counters[j] = c
		}

		got := make([]guard.CounterResult, n)
		want := make([]guard.CounterResult, n)
		tg, err := store.Do(ctx, op, now, counters, got)
		if err != nil {
			t.Fatalf("step %d: redis: %v", step, err)
		}
		tw, _ := model.Do(ctx, op, now, counters, want)
		if tg != tw {
			t.Fatalf("step %d: time %d != %d", step, tg, tw)
		}
		for j := range counters {
			if got[j] != want[j] {
				t.Fatalf("step %d (%s, t=%d): counter %s %s %+v cost %d shadow %v:\nredis %+v\nmodel %+v",
					step, op, now, counters[j].Name, counters[j].Algorithm, counters[j].Params,
					counters[j].Cost, counters[j].Shadow, got[j], want[j])
			}
			if got[j].Charged && got[j].Token != "" && op == guard.OpCheck {
				mc := pool[picked[j]]
				mc.tokens = append(mc.tokens, got[j].Token)
				if len(mc.tokens) > 4 {
					mc.tokens = mc.tokens[1:]
				}
				if got[j].Leased > 0 {
					mc.leases = append(mc.leases, lease{got[j].Token, got[j].Leased})
					leased++
				}
			}
		}
	}
}
