package regions

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"testing"
)

// obs is a run of n admissions of cost 1, each at some instant of
// [from, to].
func obs(n int, from, to int64) []Observed {
	out := make([]Observed, n)
	for i := range out {
		out[i] = Observed{From: from, To: to, Cost: 1}
	}
	return out
}

func cat(runs ...[]Observed) []Observed {
	var out []Observed
	for _, r := range runs {
		out = append(out, r...)
	}
	return out
}

func TestJudgeObserved(t *testing.T) {
	const sec = int64(1_000_000)
	fixed := Limit{Kind: FixedWindow, Units: 10, Window: sec}
	sliding := Limit{Kind: SlidingWindow, Units: 10, Window: sec}
	bucket := Limit{Kind: Bucket, Units: 10, Window: sec}
	tests := []struct {
		name    string
		lim     Limit
		obs     []Observed
		wantErr bool
	}{
		{"fixed: L inside one window", fixed, obs(10, 100, 200), false},
		{"fixed: L+1 inside one window is caught", fixed, obs(11, 100, 200), true},
		{"fixed: L+1 in a window, one of them could lie in the next", fixed,
			cat(obs(10, 100, 200), obs(1, sec-50, sec+50)), false},
		{"fixed: the ambiguous one goes where there is room, before", fixed,
			cat(obs(1, sec-50, sec+50), obs(10, sec+100, sec+200)), false},
		{"fixed: both windows full and one more across the boundary is caught", fixed,
			cat(obs(10, 100, 200), obs(1, sec-50, sec+50), obs(10, sec+100, sec+200)), true},
		{"fixed: the ones that can move must move for the others", fixed,
			cat(obs(5, sec-50, sec+50), obs(10, 100, 200), obs(5, sec+100, sec+200)), false},
		{"fixed: 2L across one boundary, each either side", fixed, obs(20, sec-50, sec+50), false},
		{"fixed: 2L+1 across one boundary is caught", fixed, obs(21, sec-50, sec+50), true},
		{"fixed: a cost of 3 counts 3", fixed, []Observed{{100, 200, 3}, {300, 400, 8}}, true},
		{"fixed: one interval over 2^61 windows is placed at once", Limit{Kind: FixedWindow, Units: 1, Window: 1},
			[]Observed{{-1 << 60, 1 << 60, 1 << 39}, {5, 5, 1}}, false},
		{"fixed: a limit of 0 over 2^61 windows", Limit{Kind: FixedWindow, Units: 0, Window: 1},
			[]Observed{{-1 << 60, 1 << 60, 1}}, true},
		{"sliding: L in a window", sliding, obs(10, 100, 200), false},
		{"sliding: L+1 that must lie in one window is caught", sliding, obs(11, 100, 200), true},
		{"sliding: L+1 that can lie a window apart", sliding,
			cat(obs(10, 100, 200), obs(1, 200, sec+150)), false},
		{"sliding: 2L a window apart", sliding,
			cat(obs(10, 100, 200), obs(10, sec+200, sec+300)), false},
		{"sliding: 2L closer than a window is caught", sliding,
			cat(obs(10, 100, 200), obs(10, sec-200, sec-100)), true},
		{"bucket: the capacity at once", bucket, obs(10, 100, 200), false},
		{"bucket: the capacity plus one at once is caught", bucket, obs(11, 100, 200), true},
		{"bucket: the capacity and one refilled later", bucket,
			cat(obs(10, 100, 200), obs(1, 200, sec/10+200)), false},
		{"bucket: the capacity and one that could be early only is caught", bucket,
			cat(obs(10, 100, 200), obs(1, 150, sec/20)), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := JudgeObserved(tt.lim, tt.obs)
			if (err != nil) != tt.wantErr {
				t.Fatalf("JudgeObserved = %v, want an error: %v", err, tt.wantErr)
			}
		})
	}
}

func TestJudgeObservedRefusesBadInput(t *testing.T) {
	tests := []struct {
		name string
		lim  Limit
		obs  []Observed
	}{
		{"interval backwards", Limit{Kind: FixedWindow, Units: 1, Window: 1}, []Observed{{From: 5, To: 4, Cost: 1}}},
		{"negative cost", Limit{Kind: FixedWindow, Units: 1, Window: 1}, []Observed{{From: 4, To: 4, Cost: -1}}},
		{"no window", Limit{Kind: SlidingWindow, Units: 1}, nil},
		{"no kind", Limit{Units: 1, Window: 1}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := JudgeObserved(tt.lim, tt.obs); err == nil {
				t.Fatalf("JudgeObserved(%+v, %v) = nil, want an error", tt.lim, tt.obs)
			}
		})
	}
}

// TestJudgeObservedAtInstantsIsCharge: with every admission's instant
// known, JudgeObserved finds an over-admission exactly when Charge does.
func TestJudgeObservedAtInstantsIsCharge(t *testing.T) {
	for _, kind := range []Kind{FixedWindow, SlidingWindow, Bucket} {
		t.Run(kind.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(kind), 7))
			for run := range 300 {
				lim := Limit{Kind: kind, Units: 1 + rng.Int64N(6), Window: 100 + rng.Int64N(100)}
				j := NewJudge(lim)
				var seen []Observed
				var charged error
				now := rng.Int64N(1000) - 500
				for range 1 + rng.IntN(30) {
					now += rng.Int64N(lim.Window / 2)
					cost := 1 + rng.Int64N(2)
					if err := j.Charge(now, cost); err != nil && charged == nil {
						charged = err
					}
					seen = append(seen, Observed{now, now, cost})
				}
				// A cost above 1 may be split across windows only when its
				// instant is unknown: here every instant is known.
				got := JudgeObserved(lim, seen)
				if (got != nil) != (charged != nil) {
					t.Fatalf("run %d, %+v, %v: JudgeObserved %v, Charge %v", run, lim, seen, got, charged)
				}
			}
		})
	}
}

func TestJudgeAdmit(t *testing.T) {
	j := NewJudge(Limit{Kind: FixedWindow, Units: 2, Window: 10})
	got := []bool{j.Admit(0, 1), j.Admit(5, 1), j.Admit(9, 1), j.Admit(10, 1)}
	want := []bool{true, true, false, true}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("Admit answers %v, want %v", got, want)
		}
	}
}

// FuzzJudgeObserved: any admissions and any limit get an answer or an
// error, never a panic or a spin over the windows an interval spans; and
// admissions at known instants are judged as Charge judges them.
func FuzzJudgeObserved(f *testing.F) {
	f.Add([]byte{1, 3, 10, 0, 5, 1, 0, 5, 1})
	f.Add([]byte{2, 2, 100, 9, 9, 1, 10, 10, 1, 11, 11, 1})
	f.Add([]byte{3, 1, 7, 0, 0, 2, 1, 1, 2})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := &fuzzReader{b: b}
		lim := Limit{Kind: Kind(r.byte()%4 + 0), Units: r.int64(), Window: r.int64()}
		var obs []Observed
		for len(r.b) > 0 && len(obs) < 64 {
			from, span, cost := r.int64(), r.int64(), r.int64()
			if r.byte()%2 == 0 {
				// Mostly small, so the checks below reach the judging.
				from, span, cost = from%10_000, span%500, cost%4
			}
			obs = append(obs, Observed{From: from, To: from + span, Cost: cost})
		}
		_ = JudgeObserved(lim, obs)

		// Small values at instants: the same answer as Charge.
		small := Limit{Kind: Kind(uint64(lim.Kind)%3 + 1), Units: abs(lim.Units) % 8, Window: 1 + abs(lim.Window)%300}
		var at []Observed
		for _, o := range obs {
			at = append(at, Observed{From: abs(o.From) % 5000, Cost: abs(o.Cost) % 3})
			at[len(at)-1].To = at[len(at)-1].From
		}
		slices.SortFunc(at, func(a, b Observed) int { return cmp.Compare(a.From, b.From) })
		j := NewJudge(small)
		var charged error
		for _, o := range at {
			if err := j.Charge(o.From, o.Cost); err != nil && charged == nil {
				charged = err
			}
		}
		if got := JudgeObserved(small, at); (got != nil) != (charged != nil) {
			t.Fatalf("%+v %v: JudgeObserved %v, Charge %v", small, at, got, charged)
		}
	})
}

func abs(v int64) int64 {
	if v < 0 {
		return -(v + 1)
	}
	return v
}
