package guard

import (
	"math"
	"math/rand/v2"
	"reflect"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/guard/rules"
)

// controlsForReads returns Controls holding n entries of every kind.
func controlsForReads(n int) (*Controls, *rules.Rule) {
	c := NewControls()
	c.Update(func(s *ControlSet) {
		for i := range n {
			k := "kid" + strconv.Itoa(i)
			s.Blocked[k] = Entry{Expiry: math.MaxInt64}
			s.Allowed[k] = Entry{}
			s.Penalties[k] = Penalty{Level: 2, Until: math.MaxInt64}
			s.KeyOverrides[k] = Override{Override: rules.Override{Factor: 2}}
			s.TenantOverrides[k] = Override{Override: rules.Override{Limit: 9}}
		}
	})
	return c, &rules.Rule{ID: "r", Scope: rules.ScopeKey}
}

// TestControlsReadsDoNotAllocate: a decision's reads of the controls take
// no lock and allocate nothing, with single-entry changes pending in an
// overlay or not.
func TestControlsReadsDoNotAllocate(t *testing.T) {
	c, r := controlsForReads(100)
	read := func() {
		s := c.current()
		_ = s.status("kid7", 1)
		_, _ = s.penalty("kid7", 1)
		_, _ = s.override(r, "kid7", "kid7", 1)
		_ = s.status("absent", 1)
		_ = s.status("changed", 1)
	}
	if allocs := testing.AllocsPerRun(1000, read); allocs != 0 {
		t.Fatalf("%v allocations per read", allocs)
	}
	c.Block("changed", Entry{})
	c.SetPenalty("kid7", Penalty{Until: 2})
	if c.current().recent == nil {
		t.Fatal("no overlay after single-entry changes")
	}
	if allocs := testing.AllocsPerRun(1000, read); allocs != 0 {
		t.Fatalf("%v allocations per read with an overlay", allocs)
	}
}

// BenchmarkControlsRead measures a decision's reads of the controls while
// a writer publishes a change every millisecond (far more often than a
// control plane does).
func BenchmarkControlsRead(b *testing.B) {
	c, r := controlsForReads(10_000)
	if c.Snapshot().Len() != 50_000 {
		b.Fatalf("setup: %d entries", c.Snapshot().Len())
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-t.C:
				c.SetPenalty("writer", Penalty{Until: int64(i)})
			}
		}
	})
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		n := 0
		for pb.Next() {
			s := c.current()
			if s.status("kid42", 1) != rules.Blocklisted {
				n++
			}
			_, _ = s.penalty("kid42", 1)
			_, _ = s.override(r, "kid42", "t", 1)
		}
		if n != 0 {
			b.Errorf("%d reads missed the blocklist", n)
		}
	})
	b.StopTimer()
	close(stop)
	wg.Wait()
}

// TestControlsEditMatchesModel makes random single-entry changes, alone
// and in batches, through Edit (and the single-entry methods), and the
// same changes to plain maps: after each, what a decision reads (the
// current set, its overlay first; BlockEntry) and what Snapshot returns
// agree with the maps, whether the overlay was folded (past its bound,
// at Sweep, at Snapshot) or not, and each change is one generation.
func TestControlsEditMatchesModel(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(22, 99))
	keys := make([]string, 120)
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
	}
	// A change, applied to any ControlWriter: the Controls and the model
	// alike.
	randomOp := func() func(ControlWriter) {
		k := keys[rng.IntN(len(keys))]
		e := Entry{Expiry: rng.Int64N(3), Reason: strconv.Itoa(rng.IntN(9)), Level: rng.IntN(4)}
		p := Penalty{Level: rng.IntN(4), Until: 1 + rng.Int64N(5)}
		o := Override{Override: rules.Override{Limit: rng.Int64N(9), Expiry: rng.Int64N(3)}, Rule: []string{"", "r", "x"}[rng.IntN(3)]}
		switch rng.IntN(10) {
		case 0:
			return func(w ControlWriter) { w.Block(k, e) }
		case 1:
			return func(w ControlWriter) { w.Unblock(k) }
		case 2:
			return func(w ControlWriter) { w.Allow(k, e) }
		case 3:
			return func(w ControlWriter) { w.Disallow(k) }
		case 4:
			return func(w ControlWriter) { w.SetPenalty(k, p) }
		case 5:
			return func(w ControlWriter) { w.LiftPenalty(k) }
		case 6:
			return func(w ControlWriter) { w.SetKeyOverride(k, o) }
		case 7:
			return func(w ControlWriter) { w.DeleteKeyOverride(k) }
		case 8:
			return func(w ControlWriter) { w.SetTenantOverride(k, o) }
		default:
			return func(w ControlWriter) { w.DeleteTenantOverride(k) }
		}
	}
	c := NewControls()
	model := &ControlSet{}
	model.init()
	rk := &rules.Rule{ID: "r", Scope: rules.ScopeKey}
	rt := &rules.Rule{ID: "r", Scope: rules.ScopeTenant}
	overlays, folds := 0, 0
	for step := range 3000 {
		ops := make([]func(ControlWriter), 1+rng.IntN(3))
		for i := range ops {
			ops[i] = randomOp()
		}
		gen := c.Generation()
		if len(ops) == 1 && rng.IntN(2) == 0 {
			ops[0](c) // a single-entry method of Controls
		} else {
			c.Edit(func(w ControlWriter) {
				for _, op := range ops {
					op(w)
				}
			})
		}
		for _, op := range ops {
			op(model)
		}
		if g := c.Generation(); g != gen+1 {
			t.Fatalf("step %d: generation %d after %d, want one more", step, g, gen)
		}
		switch rng.IntN(50) {
		case 0:
			if n := c.Sweep(0); n != 0 { // nothing has expired at 0: a fold only
				t.Fatalf("step %d: Sweep(0) dropped %d", step, n)
			}
		case 1:
			_ = c.Snapshot()
		}
		cur := c.current()
		if cur.recent == nil {
			folds++
		} else {
			overlays++
		}
		for _, k := range keys {
			ge, gok := c.BlockEntry(k)
			we, wok := model.Blocked[k]
			if ge != we || gok != wok || c.current() != cur {
				t.Fatalf("step %d: BlockEntry(%s) %+v %v, want %+v %v, without a fold", step, k, ge, gok, we, wok)
			}
			for _, now := range []int64{0, 2} {
				if got, want := cur.status(k, now), model.status(k, now); got != want {
					t.Fatalf("step %d: status(%s, %d) %v, want %v", step, k, now, got, want)
				}
				ge, gok := cur.blockEntry(k, now)
				we, wok := model.blockEntry(k, now)
				if ge != we || gok != wok {
					t.Fatalf("step %d: blockEntry(%s, %d) %+v %v, want %+v %v", step, k, now, ge, gok, we, wok)
				}
				gp, gok := cur.penalty(k, now)
				wp, wok := model.penalty(k, now)
				if gp != wp || gok != wok {
					t.Fatalf("step %d: penalty(%s, %d) %+v %v, want %+v %v", step, k, now, gp, gok, wp, wok)
				}
				for _, r := range []*rules.Rule{rk, rt} {
					gov, gok := cur.override(r, k, k, now)
					wov, wok := model.override(r, k, k, now)
					if gov != wov || gok != wok {
						t.Fatalf("step %d: override(%s scope, %s, %d) %+v %v, want %+v %v", step, r.Scope, k, now, gov, gok, wov, wok)
					}
				}
			}
		}
		if got, want := cur.Len(), model.Len(); got != want {
			t.Fatalf("step %d: Len %d, want %d", step, got, want)
		}
		if step%100 == 0 {
			got, want := c.Snapshot().Clone(), model.Clone()
			got.init() // nil maps are empty ones
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("step %d: Snapshot\n %+v\nwant\n %+v", step, got, want)
			}
		}
	}
	if folds == 0 || overlays == 0 {
		t.Fatalf("%d steps read an overlay, %d a folded set: the test did not cover both", overlays, folds)
	}
}

// TestControlsSingleEntryAllocsDoNotGrow: a single-entry change allocates
// as much with 100 000 entries of each kind as with 1 000: it does not
// copy the lists.
func TestControlsSingleEntryAllocsDoNotGrow(t *testing.T) {
	const runs = 400
	keys := make([]string, runs+1)
	for i := range keys {
		keys[i] = "new" + strconv.Itoa(i)
	}
	per := func(n int) (allocs float64, bytes uint64) {
		c, _ := controlsForReads(n)
		i := 0
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		allocs = testing.AllocsPerRun(runs, func() {
			c.Block(keys[i], Entry{Reason: "r"})
			i++
		})
		runtime.ReadMemStats(&after)
		return allocs, (after.TotalAlloc - before.TotalAlloc) / (runs + 1)
	}
	smallAllocs, smallBytes := per(1_000)
	largeAllocs, largeBytes := per(100_000)
	t.Logf("per single-entry change: %v allocations, %d bytes with 1 000 entries of each kind; %v, %d bytes with 100 000",
		smallAllocs, smallBytes, largeAllocs, largeBytes)
	if largeAllocs > smallAllocs+1 {
		t.Errorf("a single-entry change allocates %v times with 100 000 entries of each kind, %v with 1 000", largeAllocs, smallAllocs)
	}
}

// BenchmarkControlsSingleEntry measures one Block with n entries of each
// kind in the controls.
func BenchmarkControlsSingleEntry(b *testing.B) {
	for _, n := range []int{1_000, 10_000, 100_000} {
		b.Run("entries="+strconv.Itoa(n), func(b *testing.B) {
			c, _ := controlsForReads(n)
			keys := make([]string, 4096)
			for i := range keys {
				keys[i] = "new" + strconv.Itoa(i)
			}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				c.Block(keys[i%len(keys)], Entry{Reason: "r"})
			}
		})
	}
}
