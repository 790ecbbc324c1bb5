package regions

import (
	"math/rand/v2"
	"testing"
)

// Steady traffic below a region's share must be admitted whole: the guard
// band at each boundary may cost a slot's time, not the skew twice over.
// Counting an admission within the skew of a boundary in both windows
// rejected about 4 % of a region's traffic at 45 % of L against a 50 %
// share (1 s windows, the default 100 ms skew).
func TestFixedWindowSteadyTrafficBelowShare(t *testing.T) {
	tests := []struct {
		name  string
		units int64 // L
		rate  float64
		share float64 // the region's part of L (equal weights)
		fleet Fleet
	}{
		{"45 % of L against a half, 1 s window", 50, 22.5, 0.5, EqualFleet("r1", "r2")},
		{"90 % of a third, 1 s window", 51, 15.3, 1.0 / 3, EqualFleet("r1", "r2", "r3")},
		{"95 % of a half, 1 s window", 1000, 475, 0.5, EqualFleet("r1", "r2")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLedger(t, Config{}, tt.fleet, "r1")
			lim := Limit{Kind: FixedWindow, Units: tt.units, Window: sec}
			var rejected, n int
			start := int64(1_763_000_000) * sec
			for i := range int(tt.rate * 20) {
				// evenly spread, from an instant that is no boundary
				now := start + 3_333 + int64(float64(i)*sec/tt.rate)
				a, err := l.Admit("c", lim, 1, now)
				if err != nil {
					t.Fatal(err)
				}
				n++
				if !a.Allowed {
					rejected++
				}
			}
			if rejected > 0 {
				t.Fatalf("%d of %d rejected at %.0f %% of the share", rejected, n, 100*tt.rate/(tt.share*float64(tt.units)))
			}
		})
	}
}

// Whatever times a region admits at, and whatever its clock's offset
// within the skew bound, every true window holds at most the region's
// share: admissions crowded at the edges of the bands, every offset tried.
func TestFixedWindowEveryOffsetWithinShare(t *testing.T) {
	cfg := Config{}.WithDefaults()
	const w = sec
	k := cfg.Skew
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 7))
		l := newLedger(t, cfg, EqualFleet("r1", "r2"), "r1")
		lim := Limit{Kind: FixedWindow, Units: 40, Window: w}
		base := int64(1_763_000_000) * sec
		var admitted []int64
		// The client sends every millisecond, or not, in runs of a few
		// milliseconds each on or off at random: bursts at any place of
		// the bands and bodies, silences elsewhere.
		on := rng.Float64()
		send := false
		for now := base; now < base+8*w; now += 1_000 {
			if (now/1_000)%int64(3+seed%5) == 0 {
				send = rng.Float64() < on
			}
			if !send {
				continue
			}
			a, err := l.Admit("c", lim, 1, now)
			if err != nil {
				t.Fatal(err)
			}
			if a.Allowed {
				admitted = append(admitted, now)
			}
		}
		share := l.Static(lim.Units)
		for j := base / w; j < base/w+8; j++ {
			for d := -k; d <= k; d += min(997, max(k-d, 1)) {
				var in int64
				for _, t0 := range admitted {
					if t0 >= j*w+d && t0 < (j+1)*w+d {
						in++
					}
				}
				if in > share {
					t.Fatalf("seed %d: window %d with the clock %+dµs off holds %d, share %d", seed, j, d, in, share)
				}
			}
		}
	}
}
