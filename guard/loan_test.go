package guard_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/internal/guardtest"
	"github.com/tollgate/tollgate/guard/lease"
	"github.com/tollgate/tollgate/guard/redisstore/regionstore"
	"github.com/tollgate/tollgate/internal/regions"
	"github.com/tollgate/tollgate/internal/testwait"
)

// region is one region of a loan test: its Redis, its gateway (a guard on
// the local fast path) and its share ledger as the region's agent holds it.
type loanRegion struct {
	client redis.UniversalClient
	fast   *lease.Store
	g      *guard.Guard
	ledger *regionstore.Store
}

func newLoanRegion(t *testing.T, rs string, name string) *loanRegion {
	t.Helper()
	c := guardtest.Client(t, redistest.StartTB(t).Addr())
	fast := lease.New(newStoreOn(t, c))
	t.Cleanup(func() { fast.Close() })
	st, err := regionstore.New(c, regionsConfig, regionsFleet, name)
	if err != nil {
		t.Fatal(err)
	}
	return &loanRegion{client: c, fast: fast, g: mustGuard(t, fast, mustRules(t, rs), guard.WithRegion(name)), ledger: st}
}

// now is the region's clock: its Redis's, which its gateways admit by.
func (r *loanRegion) now(t *testing.T) int64 {
	t.Helper()
	tm, err := r.client.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return tm.UnixMicro()
}

func (r *loanRegion) check(t *testing.T, req *guard.Request) *guard.Decision {
	t.Helper()
	d, err := r.g.Check(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if d.Degraded {
		t.Fatalf("decided without Redis: %+v", d)
	}
	return d
}

// admitN checks req until a rejection and returns how many were admitted.
func (r *loanRegion) admitN(t *testing.T, req *guard.Request) int {
	t.Helper()
	for n := 0; n < 100; n++ {
		if !r.check(t, req).Allowed {
			return n
		}
	}
	t.Fatal("never rejected")
	return 0
}

// TestLoanMovesUnitsBetweenRegions: units given by region eu (its ledger's
// Give, as its agent will) and received by region us (Receive) are
// admitted through us's gateway and no longer through eu's, for a fixed
// and a sliding window (a bucket's loan brings capacity and rate, no
// tokens: the model test checks it). The loan landing in us drops the
// negative cache there once the gateway is told the counter changed (the
// counters-changed notice a reset or a quota grant sends, ForgetNames):
// the client rejected against the smaller share is not kept waiting for
// its Retry-After.
func TestLoanMovesUnitsBetweenRegions(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		alg string
		lim regions.Limit
	}{
		// Windows long enough that a run never crosses a boundary.
		{"algorithm: fixed_window\n    limit: 4\n    window: 1h", regions.Limit{Kind: regions.FixedWindow, Units: 4, Window: 3_600_000_000}},
		{"algorithm: sliding_window_counter\n    limit: 4\n    window: 1h", regions.Limit{Kind: regions.SlidingWindow, Units: 4, Window: 3_600_000_000}},
	} {
		t.Run(tc.lim.Kind.String(), func(t *testing.T) {
			t.Parallel()
			rs := "regions: [{name: eu}, {name: us}]\nrules:\n  - id: r\n    match: {}\n    regions: global\n    " + tc.alg + "\n"
			eu, us := newLoanRegion(t, rs, "eu"), newLoanRegion(t, rs, "us")
			ctx := context.Background()
			req := &guard.Request{Key: "sk_moving", Path: "/"}
			name := us.g.CounterNames(req)[0]

			// us uses its static share (2 of 4) and is then answered
			// from its negative cache.
			if n := us.admitN(t, req); n != 2 {
				t.Fatalf("us admitted %d against a static share of 2", n)
			}
			neg := us.fast.Stats().Negative
			if d := us.check(t, req); d.Allowed {
				t.Fatalf("us admitted beyond its share: %+v", d.Rules[0])
			}
			if us.fast.Stats().Negative == neg {
				t.Fatal("the negative cache answered nothing: the test would not show it dropped")
			}

			// eu gives its whole share to us; us receives it.
			slot := func(now int64) int64 {
				if tc.lim.Kind == regions.FixedWindow {
					return now / tc.lim.Window
				}
				return now / regionsConfig.Period
			}
			o := regions.Order{Epoch: regions.NewEpoch(1, 0), Loan: regions.Loan{
				ID: regions.LoanID{Epoch: regions.NewEpoch(1, 0), Seq: 1}, Counter: name, Limit: tc.lim,
				From: "eu", To: "us", Units: 2,
			}}
			o.Loan.First = slot(eu.now(t))
			o.Loan.Last = o.Loan.First + 2
			loan, reason, err := eu.ledger.Give(ctx, &o, 0, eu.now(t))
			if err != nil || loan.Units != 2 {
				t.Fatalf("give: %+v %q %v", loan, reason, err)
			}
			// A sliding window's and a bucket's loan counts at the
			// receiver from the start of its first period + the skew.
			if tc.lim.Kind != regions.FixedWindow {
				testwait.Eventually(t, 5*time.Second, func() error {
					if now := us.now(t); now < o.Loan.First*regionsConfig.Period+regionsConfig.Skew {
						return fmt.Errorf("the loan counts from %d, now %d", o.Loan.First*regionsConfig.Period+regionsConfig.Skew, now)
					}
					return nil
				})
			}
			applied, reason, err := us.ledger.Receive(ctx, &regions.Transfer{Loan: loan}, us.now(t))
			if err != nil || !applied {
				t.Fatalf("receive: %v %q %v", applied, reason, err)
			}

			// Until the gateway is told, its negative cache still answers.
			if d := us.check(t, req); d.Allowed {
				t.Fatalf("admitted from a stale negative cache?: %+v", d.Rules[0])
			}
			us.g.ForgetNames(false, []string{name})
			if n := us.admitN(t, req); n != 2 {
				t.Fatalf("us admitted %d of the 2 units lent to it", n)
			}
			// eu lent its whole share: it admits nothing.
			if n := eu.admitN(t, req); n != 0 {
				t.Fatalf("eu admitted %d after lending its whole share", n)
			}
			d := eu.check(t, req)
			if d.Status != 429 || d.RetryAfter < 1 {
				t.Fatalf("eu: %+v", d)
			}
		})
	}
}

// TestRetryAfterBlocksGive: a region that answered a Retry-After gives
// nothing away until it ends (so the Retry-After is never early), and
// gives again after.
func TestRetryAfterBlocksGive(t *testing.T) {
	t.Parallel()
	// A bucket of 4 refilled in 2 s: each region holds 2, refilled in
	// 2 s, one unit a second.
	lim := regions.Limit{Kind: regions.Bucket, Units: 4, Window: 2_000_000}
	eu := newLoanRegion(t, "regions: [{name: eu}, {name: us}]\nrules:\n  - id: r\n    match: {}\n    regions: global\n    algorithm: token_bucket\n    capacity: 4\n    rate: 4/2s\n", "eu")
	ctx := context.Background()
	req := &guard.Request{Key: "sk_waiting", Path: "/"}
	name := eu.g.CounterNames(req)[0]
	if n := eu.admitN(t, req); n != 2 {
		t.Fatalf("eu admitted %d against a share of 2", n)
	}
	d := eu.check(t, req)
	if d.Allowed {
		t.Fatal("admitted beyond the share")
	}
	var seq uint64
	give := func() (regions.Loan, string, int64) {
		seq++
		now := eu.now(t)
		first := now / regionsConfig.Period
		o := regions.Order{Epoch: regions.NewEpoch(1, 0), Loan: regions.Loan{
			ID: regions.LoanID{Epoch: regions.NewEpoch(1, 0), Seq: seq}, Counter: name, Limit: lim,
			From: "eu", To: "us", Units: 1, First: first, Last: first + 1,
		}}
		loan, reason, err := eu.ledger.Give(ctx, &o, 0, now)
		if err != nil {
			t.Fatal(err)
		}
		return loan, reason, now
	}
	if loan, reason, _ := give(); loan.Units != 0 || reason != "promised" {
		t.Fatalf("gave %d units (%q) while a Retry-After it sent runs", loan.Units, reason)
	}
	testwait.Eventually(t, 10*time.Second, func() error {
		loan, reason, now := give()
		if loan.Units == 0 {
			return fmt.Errorf("nothing given (%q)", reason)
		}
		if now < d.Time+d.Rules[0].RetryAfter*1_000_000-1_000_000 {
			t.Fatalf("gave at %d, before the Retry-After sent at %d (%d s) ended", now, d.Time, d.Rules[0].RetryAfter)
		}
		return nil
	})
}

// TestLoanDropsLeases: when a gateway is told a global counter's share
// grew (a loan landed), it drops the counter's lease as well as its
// negative cache, and gives the lease's unused units back to the share
// ledger: the ledger then counts only what was admitted, and the next
// request is decided against the share as it is now.
func TestLoanDropsLeases(t *testing.T) {
	t.Parallel()
	lim := regions.Limit{Kind: regions.FixedWindow, Units: 400, Window: 3_600_000_000}
	us := newLoanRegion(t, "regions: [{name: eu}, {name: us}]\nrules:\n  - id: r\n    match: {}\n    regions: global\n    algorithm: fixed_window\n    limit: 400\n    window: 1h\n", "us")
	ctx := context.Background()
	req := &guard.Request{Key: "sk_leasing", Path: "/"}
	name := us.g.CounterNames(req)[0]
	for range 5 {
		if !us.check(t, req).Allowed {
			t.Fatal("rejected within the share")
		}
	}
	granted := us.fast.Stats().Granted
	if granted == 0 {
		t.Fatal("no lease was taken: the test would not show it dropped")
	}
	used := func() int64 {
		t.Helper()
		st, err := us.ledger.State(ctx, name, lim, us.now(t))
		if err != nil {
			t.Fatal(err)
		}
		return st.Used
	}
	if u := used(); u <= 5 {
		t.Fatalf("the ledger counts %d used: the lease's units are not in it", u)
	}
	us.g.ForgetNames(false, []string{name})
	testwait.Eventually(t, 10*time.Second, func() error {
		if u := used(); u != 5 {
			return fmt.Errorf("the ledger counts %d used, want the 5 admitted (granted %d, stats %+v)", u, granted, us.fast.Stats())
		}
		return nil
	})
}
