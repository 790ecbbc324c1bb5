package regionsim

import (
	"flag"
	"fmt"
	"testing"
	"time"
)

var (
	flagSeed  = flag.Uint64("regionsim.seed", 0, "replay this seed only (0: the default seeds)")
	flagSeeds = flag.Int("regionsim.seeds", 0, "run this many seeds (default: a few)")
	flagLong  = flag.Duration("regionsim.duration", 0, "simulated time per chaos run (default: a short run)")
)

// chaosNet is a bad network: loss, duplication, reordering by jitter,
// messages held for seconds.
var chaosNet = Net{
	MinDelay: 20 * time.Millisecond, MaxDelay: 150 * time.Millisecond, Jitter: 40 * time.Millisecond,
	Loss: 0.1, Dup: 0.05, Stale: 0.02, StaleMax: 20 * time.Second,
}

func chaosSeeds() []uint64 {
	if *flagSeed != 0 {
		return []uint64{*flagSeed}
	}
	n := *flagSeeds
	if n == 0 {
		n = 4
	}
	seeds := make([]uint64, n)
	for i := range seeds {
		seeds[i] = uint64(i + 1)
	}
	return seeds
}

// TestChaosInvariant runs random fleets under every fault the simulation
// has and fails on the first step at which the fleet admitted more than
// one region alone would, or the shares held summed past the limit.
func TestChaosInvariant(t *testing.T) {
	d := *flagLong
	if d == 0 {
		d = 2 * time.Minute
	}
	for _, seed := range chaosSeeds() {
		for _, n := range []int{3, 7} {
			t.Run(fmt.Sprintf("seed=%d/regions=%d", seed, n), func(t *testing.T) {
				s, err := New(Options{Seed: seed, Regions: n, Net: chaosNet})
				if err != nil {
					t.Fatalf("new: %v", err)
				}
				if err := s.Chaos(Chaos{Duration: d, Hot: 6, Cold: 20}); err != nil {
					t.Fatalf("chaos: %v", err)
				}
				if err := s.RunFor(d); err != nil {
					t.Fatalf("replay with -regionsim.seed=%d: %v", seed, err)
				}
				st := s.Stats()
				if st.Checks == 0 || st.Admitted == 0 || st.Transfers == 0 {
					t.Fatalf("run checked nothing: %+v", st)
				}
				t.Logf("steps=%d requests=%d admitted=%d checks=%d transfers=%d applied=%d coordinators=%d messages=%d",
					st.Steps, st.Requests, st.Admitted, st.Checks, st.Transfers, st.Applied, st.Coordinators, st.Messages)
			})
		}
	}
}
