package guard

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/guard/rules"
)

// ledgerStore records the share ledgers of the counters it is asked to
// decide, and decides like countingStore.
type ledgerStore struct {
	countingStore
	ledgers []*Ledger
}

func (s *ledgerStore) Do(ctx context.Context, op Op, now int64, cs []Counter, res []CounterResult) (int64, error) {
	for _, c := range cs {
		s.ledgers = append(s.ledgers, c.Ledger)
	}
	return s.countingStore.Do(ctx, op, now, cs, res)
}

// TestRegionsPeriodReachesTheLedger: a global counter's ledger is kept in
// the period the guard is given (the one the regions' agents lend by),
// the protocol's default without one; a regional counter has no ledger.
func TestRegionsPeriodReachesTheLedger(t *testing.T) {
	t.Parallel()
	rs, err := rules.Load([]byte(`
regions:
  - {name: eu}
  - {name: us}
rules:
  - {id: g, match: {endpoint: "^/g"}, algorithm: sliding_window_log, limit: 100, window: 1m, regions: global}
  - {id: r, match: {endpoint: "^/r"}, algorithm: sliding_window_log, limit: 100, window: 1m}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		opts   []Option
		path   string
		period int64 // 0: no ledger
	}{
		{"default", []Option{WithRegion("eu")}, "/g", 1_000_000},
		{"set", []Option{WithRegion("eu"), WithRegionsPeriod(2 * time.Second)}, "/g", 2_000_000},
		{"regional rule", []Option{WithRegion("eu"), WithRegionsPeriod(2 * time.Second)}, "/r", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := &ledgerStore{countingStore: countingStore{counts: map[string]int64{}}}
			g, err := New(store, []byte("test-secret-0123456789"), rs, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := g.Check(t.Context(), &Request{Key: "sk_period_1", Path: tc.path}); err != nil {
				t.Fatal(err)
			}
			if len(store.ledgers) != 1 {
				t.Fatalf("%d counters decided, want 1", len(store.ledgers))
			}
			l := store.ledgers[0]
			switch {
			case tc.period == 0 && l != nil:
				t.Errorf("a regional counter has a ledger: %+v", *l)
			case tc.period != 0 && (l == nil || l.Period != tc.period):
				t.Errorf("ledger %+v, want period %d µs", l, tc.period)
			}
		})
	}
}
