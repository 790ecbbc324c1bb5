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

// runChaos runs c on a simulation of regions regions seeded with seed, on
// chaosNet, for c.Duration, failing the test on the first step that breaks
// an invariant, and returns the run's stats.
func runChaos(t *testing.T, seed uint64, regions int, c Chaos) Stats {
	t.Helper()
	s, err := New(Options{Seed: seed, Regions: regions, Net: chaosNet})
	if err != nil {
		t.Fatalf("new: %v", err)
	}
	if err := s.Chaos(c); err != nil {
		t.Fatalf("chaos: %v", err)
	}
	if err := s.RunFor(c.Duration); err != nil {
		t.Fatalf("replay with -regionsim.seed=%d: %v", seed, err)
	}
	return s.Stats()
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
				st := runChaos(t, seed, n, Chaos{Duration: d, Hot: 6, Cold: 20})
				if st.Checks == 0 || st.Admitted == 0 || st.Transfers == 0 {
					t.Fatalf("run checked nothing: %+v", st)
				}
				t.Logf("steps=%d requests=%d admitted=%d checks=%d transfers=%d applied=%d coordinators=%d messages=%d",
					st.Steps, st.Requests, st.Admitted, st.Checks, st.Transfers, st.Applied, st.Coordinators, st.Messages)
			})
		}
	}
}

// TestChaosLimitChanges runs the chaos with hot counters' limits cut and
// restored (overrides and penalties) while units are lent, each change
// reaching the regions at different moments: the fleet never admits more
// than the rule's limit, and once every region decides a counter under
// the same limit, the shares they hold sum to at most that limit, what
// was lent under another included.
func TestChaosLimitChanges(t *testing.T) {
	d := *flagLong
	if d == 0 {
		d = 45 * time.Second
	}
	for _, seed := range chaosSeeds() {
		for _, n := range []int{2, 3, 5} {
			t.Run(fmt.Sprintf("seed=%d/regions=%d", seed, n), func(t *testing.T) {
				st := runChaos(t, seed, n, Chaos{Duration: d, Hot: 6, LimitChanges: 20})
				if st.Checks == 0 || st.Admitted == 0 || st.Applied == 0 {
					t.Fatalf("run checked nothing: %+v", st)
				}
				t.Logf("steps=%d requests=%d admitted=%d checks=%d transfers=%d applied=%d refusals=%d mismatches=%d",
					st.Steps, st.Requests, st.Admitted, st.Checks, st.Transfers, st.Applied, st.Refusals, st.Mismatches)
			})
		}
	}
}

// TestChaosRegressionSeeds replays the runs the simulation once failed,
// each kept with what it found.
func TestChaosRegressionSeeds(t *testing.T) {
	tests := []struct {
		name    string
		seed    uint64
		regions int
		chaos   Chaos
	}{
		// A region's agent restarted (forgetting the highest epoch it had
		// seen) and stood for coordinator with the epoch its previous
		// coordinator had used, so two loans got one id: the simulation
		// now keeps the highest epoch across restarts, as the aggregator
		// does.
		{"restarted coordinator reused its epoch", 7, 3, Chaos{Duration: 30 * time.Second, Hot: 6, LimitChanges: 20}},
		// A fixed window's flow reversed while reports out of date
		// listed more lent the other way than the limit (a limit cut
		// under way): the coordinator ordered a loan above the limit,
		// which the giver refused as invalid. Loans are now capped at L.
		{"reversed flow ordered a loan above the limit", 70, 3, Chaos{Duration: 80 * time.Second, Hot: 6, LimitChanges: 20}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runChaos(t, tt.seed, tt.regions, tt.chaos)
		})
	}
}
