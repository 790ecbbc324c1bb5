package regionstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate/tollgate/guard/redisstore/regionstore"
	"github.com/tollgate/tollgate/internal/regions"
)

// TestGiveWhenActiveSetUnwritable: a give whose counter could not be added
// to the active set is an error, and asked again by id once the set is
// writable it answers the same loan, gives nothing twice, and the counter
// is listed as active.
func TestGiveWhenActiveSetUnwritable(t *testing.T) {
	client := startRedis(t)
	ctx := context.Background()
	cfg := regions.Config{}.WithDefaults()
	fleet := regions.EqualFleet("r1", "r2")
	prefix := fmt.Sprintf("act%d", time.Now().UnixNano())
	store, err := regionstore.New(client, cfg, fleet, "r1", regionstore.WithKeyPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	activeKey := prefix + ":regions:r1:active"
	if err := client.Set(ctx, activeKey, "not a set", 0).Err(); err != nil {
		t.Fatal(err)
	}
	lim := regions.Limit{Kind: regions.FixedWindow, Units: 10, Window: 1_000_000}
	now := int64(1_763_000_000_200_000)
	o := &regions.Order{Epoch: regions.NewEpoch(1, 0), Loan: regions.Loan{
		ID: regions.LoanID{Epoch: regions.NewEpoch(1, 0), Seq: 1}, Counter: "tg{g:a}a", Limit: lim,
		From: "r1", To: "r2", Units: 3, First: now / 1_000_000, Last: now / 1_000_000,
	}}
	if _, _, err := store.Give(ctx, o, 0, now); err == nil {
		t.Fatal("give with an unwritable active set: no error")
	}
	if err := client.Del(ctx, activeKey).Err(); err != nil {
		t.Fatal(err)
	}
	loan, why, err := store.Give(ctx, o, 0, now)
	if err != nil || loan.Units != 3 || why != "" {
		t.Fatalf("give asked again: %+v %q %v, want the same 3 units", loan, why, err)
	}
	st, err := store.State(ctx, o.Loan.Counter, lim, now)
	if err != nil || st.Share != 2 || len(st.Out) != 1 {
		t.Fatalf("state %+v %v: want a share of 5 − 3 and one loan out", st, err)
	}
	active, err := store.Active(ctx, now)
	if err != nil || len(active) != 1 || active[0].Counter != o.Loan.Counter {
		t.Fatalf("active %+v %v: want the counter", active, err)
	}
}
