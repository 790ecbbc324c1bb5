package memstore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/rules"
)

// TestEvictionPrefersFullSoonest: at the bound, a new counter evicts the
// sampled counter nearest to being full. With the store no larger than the
// sample, that is the nearest of all.
func TestEvictionPrefersFullSoonest(t *testing.T) {
	t.Parallel()
	s := New(WithMaxCounters(evictSample))
	now := int64(1_763_000_000_000_000)
	res := make([]guard.CounterResult, 1)
	for i := range evictSample {
		// Token buckets of 5 refilling in i+7 minutes: one unit used is
		// full again after (i+7)/5 minutes, a distinct time for each.
		c := guard.Counter{Name: "k" + strconv.Itoa(i), Algorithm: rules.TokenBucket,
			Params: params(rules.TokenBucket, 5, int64(i+7)*60_000_000, 1, 5), Cost: 1}
		s.Do(context.Background(), guard.OpCheck, now, []guard.Counter{c}, res)
	}
	s.mu.Lock()
	want, soonest := "", int64(1<<62)
	if len(s.counters) != evictSample {
		t.Fatalf("%d counters before the new one", len(s.counters))
	}
	for k, st := range s.counters {
		if st.expires < soonest {
			want, soonest = k, st.expires
		}
	}
	s.mu.Unlock()
	c := guard.Counter{Name: "new", Algorithm: rules.FixedWindow, Params: params(rules.FixedWindow, 5, 3_600_000_000, 1, 0), Cost: 1}
	s.Do(context.Background(), guard.OpCheck, now, []guard.Counter{c}, res)
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.counters) != evictSample {
		t.Fatalf("%d counters, bound %d", len(s.counters), evictSample)
	}
	if _, ok := s.counters["new"]; !ok {
		t.Fatal("new counter not kept")
	}
	if _, ok := s.counters[want]; ok {
		t.Fatalf("%s, the counter nearest to full, was kept", want)
	}
}

// BenchmarkDistinctKeysAtBound: a flood of distinct keys into a full store
// costs bounded work per key (a sampled eviction), not a periodic sort of
// every counter under the lock.
func BenchmarkDistinctKeysAtBound(b *testing.B) {
	const bound = 200_000
	s := New(WithMaxCounters(bound))
	p := params(rules.FixedWindow, 5, 3_600_000_000, 1, 0)
	res := make([]guard.CounterResult, 1)
	now := int64(1_763_000_000_000_000)
	do := func(i int) {
		c := guard.Counter{Name: "k" + strconv.Itoa(i), Algorithm: rules.FixedWindow, Params: p, Cost: 1}
		s.Do(context.Background(), guard.OpCheck, now, []guard.Counter{c}, res)
	}
	for i := range bound {
		do(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	var worst time.Duration
	for i := 0; b.Loop(); i++ {
		t0 := time.Now()
		do(bound + i)
		worst = max(worst, time.Since(t0))
	}
	b.StopTimer()
	if n := s.Len(); n > bound {
		b.Fatalf("%d counters, bound %d", n, bound)
	}
	b.ReportMetric(float64(worst.Microseconds()), "worst-µs")
}
