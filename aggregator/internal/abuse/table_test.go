package abuse

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
	"unsafe"

	"github.com/tollgate/tollgate/aggregator/internal/intern"
	"github.com/tollgate/tollgate/internal/memtest"
	"github.com/tollgate/tollgate/internal/testnet"
)

// TestTableMatchesMapReference drives the flat table and the map-based
// reference (mapTable: the table as it was) with the same random
// decisions, lifts, evaluations, ticks, commits, aborted transactions,
// transactions committed while another was open, and rebuilds from the
// committed states, and requires the same results from both at every
// step: steps, firings, changes, and the committed states, counts and
// gauges. Short idle times make Tick drop keys often, so the flat table's
// ids and slots are reused throughout.
func TestTableMatchesMapReference(t *testing.T) {
	t.Parallel()
	for seed := range uint64(6) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 7))
			cfg := Config{Window: 6 * time.Second, BackoffMinIgnored: 3, BackoffMinShare: 0.3, RejectionMinRequests: 8,
				VolumeCeiling: 3, QuietPeriod: 20 * time.Second, ReducedFor: 5 * time.Second, CooldownFor: 10 * time.Second,
				BlockFor: 15 * time.Second, Idle: 8 * time.Second, Remember: 40 * time.Second, Grace: 500 * time.Millisecond}
			if seed%4 == 3 {
				cfg.Detectors = []string{DetectorBackoffIgnored}
			}
			keys := 6 + rng.IntN(40)
			strs := []string{"", "t1", "t2", "sk_a…", "sk_b…"}
			tab, ref := NewTable(cfg, 0, nil), newMapTable(cfg, 0, nil)
			now := start
			var x *Txn
			var r *mapTxn
			begin := func() { x, r = tab.Begin(), ref.Begin() }
			// step applies one random operation to x and r at now.
			step := func() {
				switch op := rng.IntN(100); {
				case op < 70:
					d := Decision{KeyID: fmt.Sprint("k", rng.IntN(keys)), Tenant: strs[rng.IntN(3)], KeyPrefix: strs[[]int{0, 3, 4}[rng.IntN(3)]],
						TimeMicros: now.Add(-time.Duration(rng.IntN(4000)) * time.Millisecond).UnixMicro(),
						Allowed:    rng.IntN(3) == 0, Reason: "rate_limited"}
					if !d.Allowed && rng.IntN(4) != 0 {
						d.RetryAfter = int64(1 + rng.IntN(4))
					}
					switch rng.IntN(40) {
					case 0:
						d.Reason = ReasonAllowlisted
					case 1:
						d.KeyID = ""
					}
					d2 := d
					x.Observe(&d, now)
					r.Observe(&d2, now)
				case op < 74:
					l := Lift{KeyID: fmt.Sprint("k", rng.IntN(keys)), Tenant: strs[rng.IntN(3)],
						TimeMicros: now.UnixMicro() - int64(rng.IntN(3_000_000)), Actor: "op", Reason: "test"}
					if got, want := x.Lift(l, now), r.Lift(l, now); got != want {
						t.Fatalf("Lift(%+v) = %v, reference %v", l, got, want)
					}
				case op < 85:
					x.Evaluate(now)
					r.Evaluate(now)
				case op < 95:
					x.Tick(now)
					r.Tick(now)
				case op < 99:
					now = now.Add(time.Duration(rng.IntN(3000)) * time.Millisecond)
				default: // a lull: keys go idle, penalties quiet
					now = now.Add(time.Duration(rng.IntN(60)) * time.Second)
				}
			}
			compareTxn := func(where string) {
				t.Helper()
				if got, want := x.Steps(), r.Steps(); !reflect.DeepEqual(got, want) {
					t.Fatalf("%s: steps\n%+v\nreference\n%+v", where, got, want)
				}
				if got, want := x.Firings(), r.Firings(); !reflect.DeepEqual(got, want) {
					t.Fatalf("%s: firings %v, reference %v", where, got, want)
				}
				if got, want := x.Changes(), r.Changes(); !reflect.DeepEqual(got, want) {
					t.Fatalf("%s: changes\n%+v\nreference\n%+v", where, got, want)
				}
				if got, want := x.Empty(), r.Empty(); got != want {
					t.Fatalf("%s: Empty %v, reference %v", where, got, want)
				}
			}
			compareTable := func(where string) {
				t.Helper()
				want := map[string]State{}
				for id, s := range ref.keys {
					want[id] = *s
				}
				if got := tab.states(); !reflect.DeepEqual(got, want) {
					t.Fatalf("%s: states\n%+v\nreference\n%+v", where, got, want)
				}
				if tab.Len() != ref.Len() || tab.Levels(now) != ref.Levels(now) || tab.VolumeKeys(now) != ref.VolumeKeys(now) {
					t.Fatalf("%s: Len %d Levels %v VolumeKeys %d, reference %d %v %d", where,
						tab.Len(), tab.Levels(now), tab.VolumeKeys(now), ref.Len(), ref.Levels(now), ref.VolumeKeys(now))
				}
				for k := range keys {
					id := fmt.Sprint("k", k)
					got, gok := tab.Get(id)
					want, wok := ref.Get(id)
					if got != want || gok != wok {
						t.Fatalf("%s: Get(%s) = %+v %v, reference %+v %v", where, id, got, gok, want, wok)
					}
				}
			}
			steps, drops := 0, 0
			for txn := range 300 {
				where := fmt.Sprint("transaction ", txn)
				begin()
				for range rng.IntN(60) {
					step()
				}
				switch rng.IntN(10) {
				case 0: // aborted: produced, never committed
					compareTxn(where + " (aborted)")
					continue
				case 1: // another transaction commits while this one is open
					ox, or := x, r
					begin()
					for range rng.IntN(20) {
						step()
					}
					compareTxn(where + " (interleaved)")
					x.Commit()
					r.Commit()
					x, r = ox, or
					for range rng.IntN(20) {
						step()
					}
				}
				compareTxn(where)
				steps += len(r.Steps())
				for _, c := range r.Changes() {
					if c.Deleted {
						drops++
					}
				}
				x.Commit()
				r.Commit()
				compareTable(where)
				if rng.IntN(50) == 0 {
					// A new owner rebuilds both from the committed states.
					tab, ref = NewTable(cfg, 0, tab.states()), newMapTable(cfg, 0, tab.states())
					compareTable(where + " (rebuilt)")
				}
			}
			if steps == 0 || drops == 0 {
				t.Fatalf("the run took %d steps and dropped %d keys: it tests too little", steps, drops)
			}
		})
	}
}

// TestTableDropsAndReusesSlots: keys unseen for Idle are dropped by Tick
// and their ids and slots serve the next keys, so rounds of new keys
// leave the table at one round's size.
func TestTableDropsAndReusesSlots(t *testing.T) {
	t.Parallel()
	const rounds, perRound = 5, 3000
	cfg := Config{Window: 10 * time.Second, Idle: 20 * time.Second}
	tab := NewTable(cfg, 0, nil)
	now := start
	maxSlots := 0
	for round := range rounds {
		x := tab.Begin()
		for i := range perRound {
			d := Decision{KeyID: fmt.Sprintf("round-%d-key-%06d", round, i), Tenant: fmt.Sprint("tenant-", round),
				KeyPrefix: fmt.Sprint("sk_", round, "…"), TimeMicros: now.UnixMicro(), Allowed: true}
			x.Observe(&d, now)
		}
		x.Evaluate(now)
		x.Commit()
		maxSlots = max(maxSlots, tab.slots.Len())
		if tab.Len() != perRound {
			t.Fatalf("round %d: %d keys held, want %d", round, tab.Len(), perRound)
		}
		now = now.Add(cfg.Idle)
		x = tab.Begin()
		x.Tick(now)
		x.Commit()
		if tab.Len() != 0 || tab.keys.Live() != 0 || tab.strs.Live() != 0 {
			t.Fatalf("round %d: after %v idle the table holds %d keys, %d key ids, %d strings", round, cfg.Idle,
				tab.Len(), tab.keys.Live(), tab.strs.Live())
		}
	}
	// One round's keys and the unused slot 0, in whole pages.
	if want := (perRound + intern.PageLen) / intern.PageLen * intern.PageLen; maxSlots != want {
		t.Errorf("the table grew to %d slots, want the %d of one round (slots are reused)", maxSlots, want)
	}
}

// sizeofSlot is what the table holds of each key besides its key_id.
const sizeofSlot = unsafe.Sizeof(slot{})

// TestHeldStateMemory (not parallel: it reads the process's heap) holds
// the detector state of 20 000 keys and checks what each takes: its
// pointer-free slot (the state's counters and its ring of sub-windows,
// 384 B), its key_id in the interner's arena and index (≈ 60 B), and the
// slack of slices grown by doubling — at most 560 B per key. The map of
// *State by key_id it replaced took ≈ 420 B, all of it for the collector
// to scan at every cycle.
func TestHeldStateMemory(t *testing.T) {
	const keys, perTxn = 20_000, 5_000
	names, tenants := testnet.Numbered("key-%018d", keys), testnet.Numbered("tenant-%d", 100)
	ds := make([]Decision, perTxn)
	var tab *Table
	held := memtest.Retained(func() any {
		tab = NewTable(Config{}, 0, nil)
		for c := 0; c < keys; c += perTxn {
			x := tab.Begin()
			for i := range ds {
				ds[i] = Decision{KeyID: names[c+i], Tenant: tenants[i%len(tenants)], KeyPrefix: "sk_prod_ab…",
					TimeMicros: start.UnixMicro(), Allowed: i%10 != 0}
				x.Observe(&ds[i], start)
			}
			x.Evaluate(start)
			x.Changes()
			x.Commit()
		}
		return tab
	})
	if tab.Len() != keys {
		t.Fatalf("%d keys held, want %d", tab.Len(), keys)
	}
	per := float64(held) / keys
	t.Logf("%d keys: %.0f B of heap each (slot %d B)", keys, per, sizeofSlot)
	if per > 560 {
		t.Errorf("%d keys' state held in %.0f B each, want at most 560", keys, per)
	}
}
