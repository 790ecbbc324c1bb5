package regionstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/guard/internal/guardtest"
	"github.com/tollgate/tollgate/guard/redisstore/regionstore"
	"github.com/tollgate/tollgate/internal/regions"
)

// TestGiveWhenActiveSetUnwritable: a give whose counter could not be added
// to the active set is an error, and asked again by id once the set is
// writable it answers the same loan, gives nothing twice, and the counter
// is listed as active.
func TestGiveWhenActiveSetUnwritable(t *testing.T) {
	client, cfg, fleet := twoRegions(t)
	ctx := context.Background()
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

// TestExpiryCoversWhatCounts: after each case's calls, a counter's keys
// expire no earlier than the last moment something in them can still
// count (then the counter is as a new one), and not much later. The
// margin is a millisecond; the times are the caller's, the expiry Redis's.
func TestExpiryCoversWhatCounts(t *testing.T) {
	const sec, ms = 1_000_000, 1_000
	cfg := regions.Config{}.WithDefaults() // period 1 s, skew 100 ms
	fleet := regions.EqualFleet("r1", "r2")
	fixed := regions.Limit{Kind: regions.FixedWindow, Units: 10, Window: 10 * sec}
	sliding := regions.Limit{Kind: regions.SlidingWindow, Units: 10, Window: 10 * sec}
	bucket := regions.Limit{Kind: regions.Bucket, Units: 10, Window: 10 * sec}
	base := int64(1_763_000_000) * sec // a boundary of every window and period
	id := func(n uint64) regions.LoanID { return regions.LoanID{Epoch: regions.NewEpoch(1, 0), Seq: n} }
	type call func(ctx context.Context, s *regionstore.Store, name string) error
	admit := func(lim regions.Limit, cost, at int64) call {
		return func(ctx context.Context, s *regionstore.Store, name string) error {
			_, err := s.Admit(ctx, name, lim, cost, base+at)
			return err
		}
	}
	give := func(lim regions.Limit, units, first, last, at int64) call {
		return func(ctx context.Context, s *regionstore.Store, name string) error {
			o := &regions.Order{Epoch: regions.NewEpoch(1, 0), Loan: regions.Loan{ID: id(1), Counter: name, Limit: lim,
				From: "r1", To: "r2", Units: units, First: first, Last: last}}
			l, _, err := s.Give(ctx, o, 0, base+at)
			if err == nil && l.Units != units {
				err = fmt.Errorf("gave %d units, want %d", l.Units, units)
			}
			return err
		}
	}
	receive := func(lim regions.Limit, units, first, last, at int64) call {
		return func(ctx context.Context, s *regionstore.Store, name string) error {
			tr := &regions.Transfer{Loan: regions.Loan{ID: id(2), Counter: name, Limit: lim,
				From: "r2", To: "r1", Units: units, First: first, Last: last}}
			ok, why, err := s.Receive(ctx, tr, base+at)
			if err == nil && !ok {
				err = fmt.Errorf("not applied: %s", why)
			}
			return err
		}
	}
	w := base / (10 * sec) // the fixed window starting at base
	p := base / sec        // the period starting at base
	tests := []struct {
		name  string
		calls []call
		now   int64 // of the last call, µs after base
		until int64 // µs after base: the last moment something counts
	}{
		{"a fixed window's count, into the next window's guard band", []call{admit(fixed, 1, 5*sec)}, 5 * sec, 10*sec + 100*ms},
		{"a fixed window's loan received", []call{receive(fixed, 2, w, w+2, 0)}, 0, 30*sec + 100*ms},
		{"a fixed window's loan given", []call{give(fixed, 2, w, w+1, 0)}, 0, 20*sec + 100*ms},
		{"a Retry-After the region sent", []call{admit(fixed, 5, 0), admit(fixed, 1, 200*ms)}, 200 * ms, 10*sec + 100*ms},
		{"a sliding window's admissions", []call{admit(sliding, 1, 0), admit(sliding, 1, 3*sec)}, 3 * sec, 13 * sec},
		{"a sliding window's loan given, back a window after its end", []call{give(sliding, 2, p, p+1, 0)}, 0, 2*sec + 100*ms + 10*sec},
		{"a sliding window's loan received, forgotten after the window and twice the skew", []call{receive(sliding, 2, p, p+1, 0)}, 0, 2*sec + 200*ms + 10*sec},
		{"a bucket that admitted, until it is full again", []call{admit(bucket, 1, 0)}, 0, 10 * sec},
		{"a bucket's loan given, until a refill time after it comes back", []call{give(bucket, 2, p, p+1, 0)}, 0, 2*sec + 100*ms + 10*sec},
	}
	client := guardtest.Client(t, redistest.StartTB(t).Addr())
	ctx := context.Background()
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store, err := regionstore.New(client, cfg, fleet, "r1", regionstore.WithExpiryMargin(time.Millisecond),
				regionstore.WithKeyPrefix(fmt.Sprintf("exp%d", i)))
			if err != nil {
				t.Fatal(err)
			}
			name := fmt.Sprintf("tg{g:exp%d-%d}c", i, time.Now().UnixNano())
			var start time.Time
			for k, c := range tt.calls {
				start = time.Now()
				if err := c(ctx, store, name); err != nil {
					t.Fatalf("call %d: %v", k, err)
				}
			}
			ttl, err := client.PTTL(ctx, name+":region:r1").Result()
			if err != nil {
				t.Fatal(err)
			}
			elapsed := time.Since(start)
			want := time.Duration(tt.until-tt.now) * time.Microsecond
			// The key lives the time left, rounded up to a millisecond,
			// plus the 1 ms margin, less the real time since the script
			// ran (at most elapsed).
			if ttl < want-elapsed || ttl > want+2*time.Millisecond {
				t.Fatalf("expires in %v, want %v (+1 ms margin, less at most %v elapsed)", ttl, want, elapsed)
			}
		})
	}
}

// TestSteadyTrafficBelowShare offers a region steady traffic below its
// share of a global fixed window, spread evenly, through the share ledger
// in Redis and through the gateways' region script: every request is
// admitted. Counting an admission within the skew bound of a boundary in
// both windows rejected about 4 % of them (45 % of L against a share of
// half of L, 1 s windows, the default 100 ms skew).
func TestSteadyTrafficBelowShare(t *testing.T) {
	const sec = 1_000_000
	client := guardtest.Client(t, redistest.StartTB(t).Addr())
	ctx := context.Background()
	cfg := regions.Config{}.WithDefaults()
	tests := []struct {
		name  string
		fleet regions.Fleet
		units int64
		rate  float64 // per second
	}{
		{"45 % of L, two regions", regions.EqualFleet("r1", "r2"), 50, 22.5},
		{"30 % of L, three regions", regions.EqualFleet("r1", "r2", "r3"), 50, 15},
	}
	for i, tt := range tests {
		for _, via := range []string{"store", "gate"} {
			t.Run(tt.name+" through the "+via, func(t *testing.T) {
				tag := fmt.Sprintf("%d-%s-%d", i, via, time.Now().UnixNano())
				store, err := regionstore.New(client, cfg, tt.fleet, "r1", regionstore.WithKeyPrefix("tg"+tag))
				if err != nil {
					t.Fatal(err)
				}
				gate := newGate(t, client, cfg, tt.fleet, time.Hour)
				name := fmt.Sprintf("tg{g:split-%s}split", tag)
				lim := regions.Limit{Kind: regions.FixedWindow, Units: tt.units, Window: sec}
				start := int64(1_763_000_000)*sec + 3_333
				n, rejected := int(tt.rate*20), 0
				for k := range n {
					now := start + int64(float64(k)*sec/tt.rate)
					var a regions.Admission
					if via == "store" {
						a, err = store.Admit(ctx, name, lim, 1, now)
					} else {
						a, _, err = gate.check(ctx, name, lim, 1, 0, now)
					}
					if err != nil {
						t.Fatal(err)
					}
					if !a.Allowed {
						rejected++
					}
				}
				if rejected > 0 {
					t.Fatalf("%d of %d rejected at %.1f per second against a share of %d per second",
						rejected, n, tt.rate, tt.fleet.Static(tt.units)[0])
				}
			})
		}
	}
}
