package regionstore_test

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/tollgate/tollgate/guard/redisstore/regionstore"
	"github.com/tollgate/tollgate/internal/regions"
)

// TestStoreScenarios replays chosen sequences through the Redis store and
// the Ledger: paths random sequences reach rarely. Each step's answers
// must be identical, and the last admission's answer is also checked
// against the value the scenario expects.
func TestStoreScenarios(t *testing.T) {
	const sec = 1_000_000
	lim := regions.Limit{Kind: regions.FixedWindow, Units: 10, Window: sec} // static shares 5 and 5
	j := int64(1_763_000_000)                                               // a window
	in := func(id uint64, units, first, last int64) *regions.Transfer {
		return &regions.Transfer{Loan: regions.Loan{ID: regions.LoanID{Epoch: regions.NewEpoch(1, 1), Seq: id},
			Counter: "c", Limit: lim, From: "r2", To: "r1", Units: units, First: first, Last: last}}
	}
	type step struct {
		at       int64 // µs into window j
		receive  *regions.Transfer
		admit    int64 // cost, when receive is nil
		retryEnd int64 // if > 0: the admission is refused until this µs into window j
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"retry skips the next window the guard band filled, inside a long loan", []step{
			{at: 0, receive: in(1, 5, j, j+5)},
			{at: 950_000, admit: 10}, // within the skew of the boundary: counts in j and j+1
			{at: 950_000, admit: 1, retryEnd: 2*sec + 100_000},
		}},
		{"a duplicate transfer adds nothing", []step{
			{at: 200_000, receive: in(1, 5, j, j)},
			{at: 200_000, receive: in(1, 5, j, j)},
			{at: 300_000, admit: 10},
			{at: 300_000, admit: 1, retryEnd: sec + 100_000},
		}},
		{"an extension moves the end, a reordered copy does not shorten it", []step{
			{at: 200_000, receive: in(1, 5, j, j)},
			{at: 200_000, receive: in(1, 5, j, j+1)},
			{at: 200_000, receive: in(1, 5, j, j)},
			{at: sec + 300_000, admit: 10},
			{at: sec + 300_000, admit: 1, retryEnd: 2*sec + 100_000},
		}},
	}
	client := startRedis(t)
	ctx := context.Background()
	cfg := regions.Config{}.WithDefaults()
	fleet := regions.EqualFleet("r1", "r2")
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ledger, err := regions.NewLedger(cfg, fleet, "r1")
			if err != nil {
				t.Fatal(err)
			}
			store, err := regionstore.New(client, cfg, fleet, "r1", regionstore.WithKeyPrefix(fmt.Sprintf("sc%d-%d", i, time.Now().UnixNano())))
			if err != nil {
				t.Fatal(err)
			}
			name := fmt.Sprintf("tg{g:sc%d-%d}c", i, time.Now().UnixNano())
			for k, s := range tt.steps {
				now := j*sec + s.at
				if s.receive != nil {
					tr := *s.receive
					tr.Loan.Counter = name
					ga, gr, e1 := store.Receive(ctx, &tr, now)
					wa, wr, e2 := ledger.Receive(ctx, &tr, now)
					if ga != wa || gr != wr || e1 != nil || e2 != nil {
						t.Fatalf("step %d: receive: redis %v %q %v, model %v %q %v", k, ga, gr, e1, wa, wr, e2)
					}
					continue
				}
				got, e1 := store.Admit(ctx, name, lim, s.admit, now)
				want, e2 := ledger.Admit(name, lim, s.admit, now)
				if e1 != nil || e2 != nil || !reflect.DeepEqual(got, want) {
					t.Fatalf("step %d: admit %d: redis %+v %v, model %+v %v", k, s.admit, got, e1, want, e2)
				}
				if s.retryEnd > 0 && (got.Allowed || now+got.RetryAfter != j*sec+s.retryEnd) {
					t.Fatalf("step %d: admit %d: %+v, want refused until %d µs into the window", k, s.admit, got, s.retryEnd)
				}
			}
		})
	}
}
