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
	// Static shares are 5 and 5 of 10; windows and periods are a second.
	lim := regions.Limit{Kind: regions.FixedWindow, Units: 10, Window: sec}
	bucket := regions.Limit{Kind: regions.Bucket, Units: 10, Window: 10 * sec}
	j := int64(1_763_000_000) // a window, and a period
	loan := func(lim regions.Limit, id uint64, from, to string, units, first, last int64) regions.Loan {
		return regions.Loan{ID: regions.LoanID{Epoch: regions.NewEpoch(1, 1), Seq: id},
			Counter: "c", Limit: lim, From: from, To: to, Units: units, First: first, Last: last}
	}
	in := func(id uint64, units, first, last int64) *regions.Transfer {
		return &regions.Transfer{Loan: loan(lim, id, "r2", "r1", units, first, last)}
	}
	type step struct {
		at       int64 // µs into window j
		give     *regions.Order
		receive  *regions.Transfer
		admit    int64 // cost, when give and receive are nil
		retryEnd int64 // if > 0: the admission is refused until this µs into window j
	}
	tests := []struct {
		name  string
		lim   regions.Limit
		steps []step
	}{
		{"a bucket's retry counts neither units coming back nor loans running out", bucket, []step{
			{at: 0, give: &regions.Order{Epoch: regions.NewEpoch(1, 1), Loan: loan(bucket, 1, "r1", "r2", 2, j, j)}},
			{at: 0, receive: &regions.Transfer{Loan: loan(bucket, 2, "r2", "r1", 4, j, j+2)}},
			// Tokens 30.7 of a capacity of 7 refilling at 0.7/s: 5 are
			// there before the loan received ends at 2.9 s, but then the
			// rate the region is sure of is its own 0.3/s and capacity 3
			// (the 2 lent come back at 1.1 s, but count as gone).
			{at: 200_000, admit: 5, retryEnd: 200_000 + 10*sec},
		}},
		{"retry skips the next window the guard band filled, inside a long loan", lim, []step{
			{at: 0, receive: in(1, 5, j, j+5)},
			{at: 950_000, admit: 10}, // within the skew of the boundary: counts in j and j+1
			{at: 950_000, admit: 1, retryEnd: 2*sec + 100_000},
		}},
		{"a duplicate transfer adds nothing", lim, []step{
			{at: 200_000, receive: in(1, 5, j, j)},
			{at: 200_000, receive: in(1, 5, j, j)},
			{at: 300_000, admit: 10},
			{at: 300_000, admit: 1, retryEnd: sec + 100_000},
		}},
		{"an extension moves the end, a reordered copy does not shorten it", lim, []step{
			{at: 200_000, receive: in(1, 5, j, j)},
			{at: 200_000, receive: in(1, 5, j, j+1)},
			{at: 200_000, receive: in(1, 5, j, j)},
			{at: sec + 300_000, admit: 10},
			{at: sec + 300_000, admit: 1, retryEnd: 2*sec + 100_000},
		}},
	}
	client, cfg, fleet := twoRegions(t)
	ctx := context.Background()
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
				if s.give != nil {
					o := *s.give
					o.Loan.Counter = name
					gl, gr, e1 := store.Give(ctx, &o, 0, now)
					wl, wr, e2 := ledger.Give(ctx, &o, 0, now)
					if gl != wl || gr != wr || e1 != nil || e2 != nil || wl.Units == 0 {
						t.Fatalf("step %d: give: redis %+v %q %v, model %+v %q %v", k, gl, gr, e1, wl, wr, e2)
					}
					continue
				}
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
				got, e1 := store.Admit(ctx, name, tt.lim, s.admit, now)
				want, e2 := ledger.Admit(name, tt.lim, s.admit, now)
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
