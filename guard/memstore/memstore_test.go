package memstore

import (
	"context"
	"fmt"
	"math/big"
	"math/rand/v2"
	"testing"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/internal/guardtest"
	"github.com/tollgate/tollgate/guard/rules"
)

func params(alg rules.Algorithm, limit, window, prec, rateN int64) rules.Params {
	p := rules.Params{Limit: limit, Window: window, Precision: prec}
	if alg.Bucket() {
		p.FullNum, p.FullDen = guardtest.FullRefill(limit, window, rateN)
		if alg == rules.TokenBucket {
			p.Window = 0
		}
	}
	return p
}

var allAlgs = []rules.Algorithm{rules.TokenBucket, rules.GCRA, rules.FixedWindow, rules.SlidingWindowCounter, rules.SlidingWindowLog}

// probe answers, without changing anything, whether cost would be admitted
// at time at and how many units remain.
func probe(s *Store, c guard.Counter, at, cost int64) guard.CounterResult {
	c.Cost = cost
	res := make([]guard.CounterResult, 1)
	s.Do(context.Background(), guard.OpState, at, []guard.Counter{c}, res)
	return res[0]
}

// TestTimesAreExact checks the model's promises about time, independently
// of the Redis scripts: a rejected cost is admitted exactly RetryAfter µs
// later and not a microsecond sooner; one more unit is available exactly
// NextAfter µs later and not sooner; the counter is full exactly ResetAfter
// µs later and not sooner.
func TestTimesAreExact(t *testing.T) {
	t.Parallel()
	for _, alg := range allAlgs {
		t.Run(string(alg), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(11, uint64(len(alg))))
			for trial := 0; trial < 40; trial++ {
				s := New()
				L := 1 + rng.Int64N(12)
				p := params(alg, L, []int64{1_000_000, 3_000_000, 700_000}[rng.IntN(3)], []int64{1, 2, 5, 10}[rng.IntN(4)], 1+rng.Int64N(L+3))
				if alg == rules.SlidingWindowCounter && p.Window%p.Precision != 0 {
					p.Precision = 1
				}
				c := guard.Counter{Name: "c", Algorithm: alg, Params: p}
				now := int64(1_763_000_000_000_000) + rng.Int64N(10_000_000)
				for step := 0; step < 60; step++ {
					now += rng.Int64N(300_000)
					c.Cost = 1 + rng.Int64N(L)
					res := make([]guard.CounterResult, 1)
					s.Do(context.Background(), guard.OpCheck, now, []guard.Counter{c}, res)
					r := res[0]
					check := func(what string, after int64, ok func(guard.CounterResult) bool) {
						if after == 0 {
							return
						}
						if before := probe(s, c, now+after-1, c.Cost); ok(before) {
							t.Fatalf("%s: %+v: holds 1µs before %d µs (step %d, %+v)", what, p, after, step, r)
						}
						if at := probe(s, c, now+after, c.Cost); !ok(at) {
							t.Fatalf("%s: %+v: does not hold after %d µs (step %d, %+v, then %+v)", what, p, after, step, r, at)
						}
					}
					if !r.Allowed {
						check("retry", r.RetryAfter, func(x guard.CounterResult) bool { return x.Allowed })
					}
					rem := r.Remaining
					check("next", r.NextAfter, func(x guard.CounterResult) bool { return x.Remaining > rem })
					check("reset", r.ResetAfter, func(x guard.CounterResult) bool { return x.Remaining == L })
				}
			}
		})
	}
}

// TestTokenBucketAgainstRationals compares the token bucket with a
// straightforward simulation in exact rational arithmetic (tokens as a
// big.Rat, refilled continuously, capped at capacity).
func TestTokenBucketAgainstRationals(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(5, 5))
	for trial := 0; trial < 50; trial++ {
		L := 1 + rng.Int64N(30)
		period := []int64{1_000_000, 60_000_000, 7_000_000}[rng.IntN(3)]
		n := 1 + rng.Int64N(2*L)
		p := params(rules.TokenBucket, L, period, 1, n)
		c := guard.Counter{Name: "tb", Algorithm: rules.TokenBucket, Params: p}
		s := New()
		tokens := big.NewRat(L, 1)
		rate := big.NewRat(n, period) // tokens per µs
		now := int64(1_763_000_000_000_000)
		last := now
		for step := 0; step < 400; step++ {
			now += rng.Int64N(period / 4)
			el := new(big.Rat).Mul(rate, big.NewRat(now-last, 1))
			tokens.Add(tokens, el)
			if tokens.Cmp(big.NewRat(L, 1)) > 0 {
				tokens.SetInt64(L)
			}
			last = now
			cost := 1 + rng.Int64N(L)
			want := tokens.Cmp(big.NewRat(cost, 1)) >= 0
			if want {
				tokens.Sub(tokens, big.NewRat(cost, 1))
			}
			c.Cost = cost
			res := make([]guard.CounterResult, 1)
			s.Do(context.Background(), guard.OpCheck, now, []guard.Counter{c}, res)
			if res[0].Allowed != want {
				t.Fatalf("trial %d step %d: cap %d rate %d/%dµs cost %d: model %v, rationals %v (tokens %s)",
					trial, step, L, n, period, cost, res[0].Allowed, want, tokens.FloatString(6))
			}
			fl, _ := new(big.Rat).Set(tokens).Float64()
			if res[0].Remaining != int64(fl) && !(fl < 0) {
				t.Fatalf("remaining %d, rationals %s", res[0].Remaining, tokens.FloatString(6))
			}
		}
	}
}

// TestCarryOver: changing a limit keeps what was consumed; a
// lower limit can leave a counter in debt (the guard shows 0). gcra keeps
// one value and carries its debt time: the fraction of the burst consumed.
func TestCarryOver(t *testing.T) {
	t.Parallel()
	for _, alg := range allAlgs {
		t.Run(string(alg), func(t *testing.T) {
			t.Parallel()
			s := New()
			now := int64(1_763_000_000_000_000)
			c := guard.Counter{Name: "c", Algorithm: alg, Params: params(alg, 10, 3_600_000_000, 1, 10), Cost: 7}
			res := make([]guard.CounterResult, 1)
			s.Do(context.Background(), guard.OpCheck, now, []guard.Counter{c}, res)
			if res[0].Remaining != 3 {
				t.Fatalf("remaining %d after 7 of 10", res[0].Remaining)
			}
			cases := []struct{ limit, want int64 }{{20, 13}, {8, 1}, {5, -2}}
			if alg == rules.GCRA {
				cases = []struct{ limit, want int64 }{{20, 6}, {8, 2}, {5, 1}}
			}
			for _, tc := range cases {
				c.Params = rules.Override{Limit: tc.limit}.Apply(params(alg, 10, 3_600_000_000, 1, 10))
				r := probe(s, c, now, 1)
				if r.Remaining != tc.want {
					t.Fatalf("limit %d: remaining %d, want %d", tc.limit, r.Remaining, tc.want)
				}
			}
		})
	}
}

// TestReportDebt: reports charge after the fact, down to one limit below
// zero and no further.
func TestReportDebt(t *testing.T) {
	t.Parallel()
	for _, alg := range allAlgs {
		t.Run(string(alg), func(t *testing.T) {
			s := New()
			now := int64(1_763_000_000_000_000)
			c := guard.Counter{Name: "c", Algorithm: alg, Params: params(alg, 10, 3_600_000_000, 1, 10), Cost: 6}
			res := make([]guard.CounterResult, 1)
			for _, want := range []int64{4, -2, -8, -10, -10} {
				s.Do(context.Background(), guard.OpReport, now, []guard.Counter{c}, res)
				if res[0].Remaining != want {
					t.Fatalf("remaining %d, want %d", res[0].Remaining, want)
				}
			}
			c.Cost = 15
			s.Do(context.Background(), guard.OpAddQuota, now, []guard.Counter{c}, res)
			if res[0].Remaining != 5 {
				t.Fatalf("after quota of 15: remaining %d, want 5", res[0].Remaining)
			}
			c.Cost = 100
			s.Do(context.Background(), guard.OpAddQuota, now, []guard.Counter{c}, res)
			if res[0].Remaining != 10 {
				t.Fatalf("quota above full: remaining %d, want 10", res[0].Remaining)
			}
		})
	}
}

func TestBoundedCounters(t *testing.T) {
	t.Parallel()
	s := New(WithMaxCounters(100))
	now := int64(1_763_000_000_000_000)
	res := make([]guard.CounterResult, 1)
	for i := range 1000 {
		c := guard.Counter{Name: fmt.Sprint("k", i), Algorithm: rules.FixedWindow, Params: params(rules.FixedWindow, 5, 60_000_000, 1, 0), Cost: 1}
		s.Do(context.Background(), guard.OpCheck, now, []guard.Counter{c}, res)
	}
	if n := s.Len(); n > 100 {
		t.Fatalf("%d counters kept, bound 100", n)
	}
}
