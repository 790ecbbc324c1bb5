package regionstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/guard/internal/guardtest"
	"github.com/tollgate/tollgate/guard/redisstore"
	"github.com/tollgate/tollgate/guard/redisstore/regionstore"
	"github.com/tollgate/tollgate/internal/regions"
)

// twoRegions starts a redis-server for the test and returns a client
// built the way production builds it, the default configuration and a
// fleet of two equal regions, r1 and r2.
func twoRegions(tb testing.TB) (redis.UniversalClient, regions.Config, regions.Fleet) {
	tb.Helper()
	return guardtest.Client(tb, redistest.StartTB(tb).Addr()), regions.Config{}.WithDefaults(), regions.EqualFleet("r1", "r2")
}

// errClass is the sentinel an error of the store or the ledger wraps.
func errClass(err error) string {
	for _, s := range []error{regions.ErrInvalid, regions.ErrLimitMismatch, regions.ErrNotMine} {
		if errors.Is(err, s) {
			return s.Error()
		}
	}
	if err != nil {
		return "other: " + err.Error()
	}
	return ""
}

// TestStoreMatchesLedger runs random sequences of admissions, gives,
// receives, states, actives and time steps through the Redis store and the
// Ledger (the reference model), with the same explicit times, and requires
// identical answers and identical inspections of every counter touched.
// Orders and transfers are duplicated, reordered, extended, late,
// contradictory and addressed to the wrong region; limits change under a
// counter's name.
func TestStoreMatchesLedger(t *testing.T) {
	client := guardtest.Client(t, redistest.StartTB(t).Addr())
	for seed := uint64(1); seed <= 6; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			runLedgerSequence(t, client, seed, 1500, false, false)
		})
	}
}

// TestStoreMatchesLedgerInTheBands is the same with time moving in steps
// shorter than a band's slot, and jumping to the bands around the fixed
// windows' boundaries: where a fixed window counts an admission in its
// slot of the band.
func TestStoreMatchesLedgerInTheBands(t *testing.T) {
	client := guardtest.Client(t, redistest.StartTB(t).Addr())
	for seed := uint64(21); seed <= 24; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			runLedgerSequence(t, client, seed, 1500, false, true)
		})
	}
}

// TestStoreForgetsLikeNew runs sequences in which a counter's keys expire
// as soon as Redis would let them (a margin of a second, the time of the
// sequence standing for Redis's clock): every answer after must be what the
// Ledger, which never forgets, answers. So a counter is only forgotten
// once nothing in it can count any more.
func TestStoreForgetsLikeNew(t *testing.T) {
	client := guardtest.Client(t, redistest.StartTB(t).Addr())
	for seed := uint64(11); seed <= 13; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			runLedgerSequence(t, client, seed, 1000, true, false)
		})
	}
}

type modelCounter struct {
	name string
	lim  regions.Limit
}

// kinds are the kinds the store holds.
var kinds = []regions.Kind{regions.FixedWindow, regions.SlidingWindow, regions.Bucket}

// randomLimit draws a limit, its window scale times one of a few lengths.
func randomLimit(rng *rand.Rand, scale int64) regions.Limit {
	units := []int64{1, 2, 3, 5, 10, 40, 100}[rng.IntN(7)]
	kind := kinds[rng.IntN(len(kinds))]
	windows := []int64{400_000, 1_000_000, 1_500_000, 3_000_000, 10_000_000}
	if kind != regions.FixedWindow {
		windows = []int64{250_000, 1_000_000, 2_500_000, 10_000_000}
	}
	return regions.Limit{Kind: kind, Units: units, Window: scale * windows[rng.IntN(len(windows))]}
}

// runLedgerSequence runs steps random operations through a Store and a
// Ledger and compares them. With expire, a counter's keys are deleted once
// the time of the sequence passes their expiry (read after every step),
// and the limit changes are left out while a counter is forgotten (the
// Ledger would refuse them: it never forgets a limit). With bands, time
// moves in short steps and jumps into the skew bands of the boundaries
// of whole seconds.
func runLedgerSequence(t *testing.T, client redis.UniversalClient, seed uint64, steps int, expire, bands bool) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, seed*7919))
	// With expire, windows, periods and the skew are 50 times longer, so
	// the time steps are short beside them and the one-second expiry
	// margin hides little.
	scale := int64(1)
	if expire {
		scale = 50
	}
	cfg := regions.Config{Period: scale * regions.DefaultPeriod, Skew: scale * regions.DefaultSkew}.WithDefaults()
	fleet := regions.EqualFleet("r1", "r2", "r3")
	if seed%2 == 0 {
		fleet = regions.Fleet{Members: []regions.Member{{Name: "r1", Weight: 200_000}, {Name: "r2", Weight: 500_000}, {Name: "r3", Weight: 300_000}}}
	}
	ledger, err := regions.NewLedger(cfg, fleet, "r1")
	if err != nil {
		t.Fatal(err)
	}
	tag := fmt.Sprintf("%d-%d", seed, time.Now().UnixNano())
	margin := time.Hour
	if expire {
		margin = time.Second
	}
	store, err := regionstore.New(client, cfg, fleet, "r1", regionstore.WithKeyPrefix("tg"+tag), regionstore.WithExpiryMargin(margin))
	if err != nil {
		t.Fatal(err)
	}
	// Admissions go, at random, through the store or through the guard's
	// region script (as the gateways decide a global rule), at the same
	// pinned time: both must answer as the Ledger.
	gate := newGate(t, client, cfg, fleet, margin)
	now := int64(1_763_000_000_000_000) + rng.Int64N(1_000_000_000)
	pool := make([]*modelCounter, 6)
	for i := range pool {
		pool[i] = &modelCounter{name: fmt.Sprintf("tg{g:rule%d-%s}rule%d", i, tag, i), lim: randomLimit(rng, scale)}
	}
	epochs := []regions.Epoch{regions.NewEpoch(1, 0), regions.NewEpoch(2, 1), regions.NewEpoch(7, 2)}
	var seq uint64
	newID := func() regions.LoanID {
		seq++
		return regions.LoanID{Epoch: epochs[rng.IntN(len(epochs))], Seq: seq}
	}
	var orders []regions.Order
	var transfers []regions.Transfer
	others := []string{"r2", "r3"}
	// slot is now's slot of a counter's loans (a window, or a period),
	// plus d.
	slot := func(mc *modelCounter, d int64) int64 {
		if mc.lim.Kind == regions.FixedWindow {
			return max(now/mc.lim.Window+d, 0)
		}
		return max(now/cfg.Period+d, 0)
	}

	var given, applied, admitted, forgotten int
	expireAt := map[*modelCounter]int64{} // the sequence's time at which its keys expire
	gone := map[*modelCounter]bool{}      // its keys were deleted, and not written since
	held := func(c *modelCounter) bool {
		_, ok := ledger.Inspect(c.name, now)
		return ok
	}
	keysOf := func(c *modelCounter) []string {
		k := c.name + ":region:r1"
		return []string{k, k + ":log"}
	}
	// forgottenUnder: a message of an earlier limit of a counter Redis
	// forgot (or never made) since its limit changed, which Redis would
	// make anew under that limit: not comparable, as for a limit change.
	forgottenUnder := func(l regions.Loan) bool {
		for _, c := range pool {
			if c.name == l.Counter {
				return l.Limit != c.lim && (gone[c] || expire && !held(c))
			}
		}
		return false
	}
	paths := map[string]int{}
	for step := range steps {
		switch r := rng.IntN(10); {
		case bands && r < 3:
			now += rng.Int64N(cfg.Skew / 8)
		case bands && r < 5:
			// into the band of the next boundary of a whole second
			now = max(now, (now/1_000_000+1)*1_000_000-cfg.Skew+rng.Int64N(2*cfg.Skew))
		case bands:
			now += rng.Int64N(cfg.Skew)
		case r < 2:
		case r < 5:
			now += rng.Int64N(1000)
		case r < 9:
			now += rng.Int64N(500_000)
		default:
			now += rng.Int64N(20_000_000)
		}
		for _, c := range pool {
			if at, ok := expireAt[c]; ok && now >= at {
				if err := client.Del(ctx, keysOf(c)...).Err(); err != nil {
					t.Fatal(err)
				}
				delete(expireAt, c)
				gone[c] = true
				forgotten++
			}
		}
		mc := pool[rng.IntN(len(pool))]
		var what string
		kind := mc.lim.Kind // the kind of the counter the step is about
		var got, want any
		var gerr, werr error
		switch r := rng.IntN(100); {
		case r < 40:
			cost := rng.Int64N(max(mc.lim.Units/3, 1) + 1)
			if rng.IntN(20) == 0 {
				cost = mc.lim.Units + rng.Int64N(3)
			}
			what = fmt.Sprintf("admit %s cost %d", mc.name, cost)
			switch g := rng.IntN(3); {
			case g == 0:
				got, gerr = store.Admit(ctx, mc.name, mc.lim, cost, now)
				want, werr = ledger.Admit(mc.name, mc.lim, cost, now)
			default:
				// The guard's check, asking for a lease half of the time:
				// an admission of the cost and the units leased.
				lease := int64(0)
				if g == 2 {
					lease = 1 + rng.Int64N(mc.lim.Units)
				}
				what = fmt.Sprintf("check %s cost %d lease %d", mc.name, cost, lease)
				var leased int64
				got, leased, gerr = gate.check(ctx, mc.name, mc.lim, cost, lease, now)
				if a, ok := got.(regions.Admission); ok && a.Allowed {
					want, werr = ledger.Admit(mc.name, mc.lim, cost+leased, now)
				} else {
					want, werr = ledger.Admit(mc.name, mc.lim, cost, now)
				}
			}
			if a, ok := want.(regions.Admission); ok && a.Allowed {
				admitted++
			}
		case r < 60:
			var o regions.Order
			switch k := rng.IntN(10); {
			case k < 5 || len(orders) == 0:
				first := slot(mc, rng.Int64N(6)-2)
				o = regions.Order{Epoch: epochs[0], Loan: regions.Loan{
					ID: newID(), Counter: mc.name, Limit: mc.lim, From: "r1", To: others[rng.IntN(2)],
					Units: 1 + rng.Int64N(mc.lim.Units), First: first, Last: first + rng.Int64N(4),
				}}
				if rng.IntN(15) == 0 {
					o.Extend = true // an extension of a loan never given
				}
				if rng.IntN(30) == 0 {
					o.Loan.From = "r2" // not this region's to give
				}
			case k < 7:
				o = recent(rng, orders) // a duplicate
			default:
				o = recent(rng, orders)
				o.Extend = true
				o.Loan.Last += 1 + rng.Int64N(3)
				if o.Loan.Limit.Kind != regions.FixedWindow && rng.IntN(2) == 0 {
					o.Loan.Units += rng.Int64N(o.Loan.Limit.Units - o.Loan.Units + 1) // and grow
				}
				if rng.IntN(10) == 0 {
					o.Loan.To = others[rng.IntN(2)] // maybe another receiver: refused
				}
			}
			if forgottenUnder(o.Loan) {
				continue
			}
			keep := rng.Int64N(o.Loan.Limit.Units + 2)
			what, kind = fmt.Sprintf("give %+v keep %d", o, keep), o.Loan.Limit.Kind
			type giveAnswer struct {
				Loan   regions.Loan
				Reason string
			}
			gl, gr, e1 := store.Give(ctx, &o, keep, now)
			wl, wr, e2 := ledger.Give(ctx, &o, keep, now)
			got, want, gerr, werr = giveAnswer{gl, gr}, giveAnswer{wl, wr}, e1, e2
			if e2 == nil && wl.Units > 0 {
				given++
				orders = append(orders, o)
			} else if e2 == nil && rng.IntN(3) == 0 {
				orders = append(orders, o)
			}
		case r < 85:
			var tr regions.Transfer
			switch k := rng.IntN(10); {
			case k < 5 || len(transfers) == 0:
				first := slot(mc, rng.Int64N(6)-3)
				tr = regions.Transfer{Loan: regions.Loan{
					ID: newID(), Counter: mc.name, Limit: mc.lim, From: others[rng.IntN(2)], To: "r1",
					Units: rng.Int64N(mc.lim.Units + 1), First: first, Last: first + rng.Int64N(4),
				}}
				if rng.IntN(30) == 0 {
					tr.Loan.To = "r3" // not addressed here
				}
			case k < 7:
				tr = recent(rng, transfers) // a duplicate, maybe late
			case k < 8:
				tr = recent(rng, transfers) // an older copy, reordered
				tr.Loan.Last = max(tr.Loan.First, tr.Loan.Last-1-rng.Int64N(2))
			case k < 9:
				tr = recent(rng, transfers) // an extension
				tr.Loan.Last += 1 + rng.Int64N(3)
				if tr.Loan.Limit.Kind != regions.FixedWindow && rng.IntN(2) == 0 {
					tr.Loan.Units += rng.Int64N(tr.Loan.Limit.Units - tr.Loan.Units + 1)
				}
			default:
				tr = recent(rng, transfers) // contradicting its first copy
				tr.Loan.Units = max(tr.Loan.Units-1, 1)
				if rng.IntN(2) == 0 {
					tr.Loan.From = others[rng.IntN(2)]
				}
			}
			if forgottenUnder(tr.Loan) {
				continue
			}
			what, kind = fmt.Sprintf("receive %+v", tr), tr.Loan.Limit.Kind
			type receiveAnswer struct {
				Applied bool
				Reason  string
			}
			ga, gr, e1 := store.Receive(ctx, &tr, now)
			wa, wr, e2 := ledger.Receive(ctx, &tr, now)
			got, want, gerr, werr = receiveAnswer{ga, gr}, receiveAnswer{wa, wr}, e1, e2
			if wa {
				applied++
			}
			if e2 == nil {
				transfers = append(transfers, tr)
			}
		case r < 93:
			what = "state " + mc.name
			got, gerr = store.State(ctx, mc.name, mc.lim, now)
			want, werr = ledger.State(ctx, mc.name, mc.lim, now)
		case r < 97:
			what = "active"
			got, gerr = store.Active(ctx, now)
			want, werr = ledger.Active(ctx, now)
		case gone[mc] || !held(mc):
			// A limit change on a counter Redis forgot, or on one never
			// made (which it would make under the new limit, to be
			// forgotten later), is not comparable: the Ledger never
			// forgets a limit.
			what = "state " + mc.name
			got, gerr = store.State(ctx, mc.name, mc.lim, now)
			want, werr = ledger.State(ctx, mc.name, mc.lim, now)
		default:
			// The rule changed under the counter's name, or an override or
			// a penalty applies to it: an admission under other units
			// carries the counter over (its loans void), one under another
			// kind or window is refused while the counter holds its old
			// limit.
			lim := randomLimit(rng, scale)
			if rng.IntN(2) == 0 {
				lim.Kind, lim.Window = mc.lim.Kind, mc.lim.Window
			}
			what = fmt.Sprintf("admit %s under %+v", mc.name, lim)
			if lim.Kind != mc.lim.Kind || lim.Window != mc.lim.Window || rng.IntN(2) == 0 {
				// (The gateways' script starts a counter afresh under
				// another kind or window: not the Ledger's answer.)
				got, gerr = store.Admit(ctx, mc.name, lim, 1, now)
			} else {
				what = fmt.Sprintf("check %s under %+v", mc.name, lim)
				got, _, gerr = gate.check(ctx, mc.name, lim, 1, 0, now)
			}
			want, werr = ledger.Admit(mc.name, lim, 1, now)
			if werr == nil {
				mc.lim = lim
			}
		}
		paths[fmt.Sprintf("%s %s %T %+v %s", kind, what[:strings.IndexByte(what, ' ')+1], want, pathOf(want), errClass(werr))]++
		if errClass(gerr) != errClass(werr) {
			t.Fatalf("step %d (t=%d) %s:\nredis error %v\nmodel error %v", step, now, what, gerr, werr)
		}
		if werr == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("step %d (t=%d) %s:\nredis %+v\nmodel %+v", step, now, what, got, want)
		}
		for _, c := range pool {
			if c != mc && step%25 != 0 {
				continue
			}
			gi, gok, err := store.Inspect(ctx, c.name, now)
			if err != nil {
				t.Fatalf("step %d: inspect %s: %v", step, c.name, err)
			}
			wi, wok := ledger.Inspect(c.name, now)
			if !gok && wok && gone[c] {
				// Forgotten: the Ledger's counter must be as a new one.
				fresh, err := regions.NewLedger(cfg, fleet, "r1")
				if err != nil {
					t.Fatal(err)
				}
				if _, err := fresh.State(ctx, c.name, c.lim, now); err != nil {
					t.Fatal(err)
				}
				gi, gok = fresh.Inspect(c.name, now)
			}
			if gok != wok || !reflect.DeepEqual(gi, wi) {
				t.Fatalf("step %d (t=%d) after %s: inspect %s:\nredis %v %+v\nmodel %v %+v", step, now, what, c.name, gok, gi, wok, wi)
			}
		}
		if !expire {
			continue
		}
		for _, c := range pool {
			ttl, err := client.PTTL(ctx, keysOf(c)[0]).Result()
			if err != nil {
				t.Fatal(err)
			}
			if ttl > 0 {
				expireAt[c] = now + ttl.Microseconds()
				gone[c] = false
			}
		}
	}
	if expire && forgotten == 0 {
		t.Errorf("no counter was forgotten in %d steps", steps)
	}
	// The sequence must reach the interesting paths, or it tests nothing.
	if given == 0 || applied == 0 || admitted == 0 {
		t.Errorf("%d steps gave %d loans, applied %d, admitted %d: the sequence misses a path", steps, given, applied, admitted)
	}
	for k, v := range paths {
		t.Logf("%6d %s", v, k)
	}
	t.Logf("%d steps: %d loans given, %d applied, %d admissions, %d counters forgotten", steps, given, applied, admitted, forgotten)
}

func pathOf(v any) any {
	switch a := v.(type) {
	case regions.Admission:
		return [2]bool{a.Allowed, a.RetryAfter > 0}
	}
	r := reflect.ValueOf(v)
	if r.Kind() == reflect.Struct && r.NumField() == 2 && r.Field(1).Kind() == reflect.String {
		return r.Field(1).String()
	}
	return nil
}

// recent picks one of the last few of xs, mostly: copies of messages
// about loans still running reach more paths than copies of long-gone ones.
func recent[T any](rng *rand.Rand, xs []T) T {
	if rng.IntN(4) == 0 {
		return xs[rng.IntN(len(xs))]
	}
	return xs[len(xs)-1-rng.IntN(min(len(xs), 6))]
}

// TestStoreMatchesLedgerOnCluster runs a sequence on a three-node Redis
// Cluster: each counter's keys share its hash tag, and the active set
// lives in a slot of its own.
func TestStoreMatchesLedgerOnCluster(t *testing.T) {
	cl := redistest.StartClusterTB(t, 3)
	client := guardtest.RedisClient(t, redisstore.Config{Mode: redisstore.ModeCluster, Addrs: cl.Addrs(), Timeout: 2 * time.Second})
	runLedgerSequence(t, client, 7, 600, false, false)
}
