package regionsim

import (
	"flag"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/regions"
)

// liveNet is an ordinary inter-region network: 10–100 ms one way, a little
// jitter, nothing lost.
var liveNet = Net{MinDelay: 10 * time.Millisecond, MaxDelay: 100 * time.Millisecond, Jitter: 5 * time.Millisecond}

var kinds = []regions.Kind{regions.FixedWindow, regions.SlidingWindow, regions.Bucket}

// probe runs fn every 10 ms of simulated time from now on.
func (s *Sim) probe(fn func()) {
	var p func()
	p = func() {
		fn()
		s.schedule(s.now+10_000, p)
	}
	s.schedule(s.now, p)
}

// measureMove: a client using 90 % of the limit in region r1 moves all its
// traffic to r2. It answers how many rebalance periods pass until r2 holds
// at least 90 % of what the fleet may still admit in the window (the limit
// minus what the other regions have used of it; a bucket: the limit), or
// -1 if that never happens within three windows.
func measureMove(seed uint64, kind regions.Kind, window time.Duration, n int) (float64, error) {
	s, err := New(Options{Seed: seed, Regions: n, Net: liveNet})
	if err != nil {
		return 0, err
	}
	c, err := s.AddCounter("c", regions.Limit{Kind: kind, Units: 1000, Window: window.Microseconds()})
	if err != nil {
		return 0, err
	}
	from := make([]float64, n)
	from[0] = 1
	s.SetTraffic(c, Traffic{Rate: 0.9 * RateOf(c.Limit), Split: from})
	if err := s.RunFor(3 * window); err != nil {
		return 0, err
	}
	to := make([]float64, n)
	to[1] = 1
	s.SetTraffic(c, Traffic{Rate: 0.9 * RateOf(c.Limit), Split: to})
	moved := s.now
	reached := int64(-1)
	s.probe(func() {
		if reached >= 0 {
			return
		}
		share, _ := s.Share(c, 1)
		var usedElse int64
		for i := range n {
			if i != 1 && kind != regions.Bucket {
				_, u := s.Share(c, i)
				usedElse += u
			}
		}
		if float64(share) >= 0.9*float64(c.Limit.Units-usedElse) {
			reached = s.now - moved
		}
	})
	if err := s.RunFor(3 * window); err != nil {
		return 0, err
	}
	if reached < 0 {
		return -1, nil
	}
	return float64(reached) / float64(s.cfg.Period), nil
}

// measureSplit: clients spread over the regions by split use 90 % of the
// limit. It answers the fraction of requests the fleet rejected that one
// region alone with the whole limit would have admitted, after a warm-up
// of two windows.
func measureSplit(seed uint64, kind regions.Kind, window time.Duration, split []float64) (float64, error) {
	s, err := New(Options{Seed: seed, Regions: len(split), Net: liveNet})
	if err != nil {
		return 0, err
	}
	c, err := s.AddCounter("c", regions.Limit{Kind: kind, Units: 1000, Window: window.Microseconds()})
	if err != nil {
		return 0, err
	}
	s.SetTraffic(c, Traffic{Rate: 0.9 * RateOf(c.Limit), Split: split})
	if err := s.RunFor(2 * window); err != nil {
		return 0, err
	}
	fr, rq := c.Stats.FalseRejections, c.Stats.Requests
	if err := s.RunFor(6 * window); err != nil {
		return 0, err
	}
	return float64(c.Stats.FalseRejections-fr) / float64(max(c.Stats.Requests-rq, 1)), nil
}

// converged reports whether every region's share of c is within the
// tolerance of the leading coordinator's target.
func (s *Sim) converged(c *Counter) bool {
	tg := s.Targets(c)
	if len(tg) != len(s.regs) {
		return false
	}
	tol := int64(math.Ceil(s.cfg.Tolerance * float64(c.Limit.Units)))
	for i := range s.regs {
		sh, _ := s.Share(c, i)
		if sh < tg[i]-tol || sh > tg[i]+tol {
			return false
		}
	}
	return true
}

// measureHeal: a hot counter's clients are split between r1 and r2 at
// 90 % of the limit, and r1 (where the first coordinator runs) is cut
// from the others for partition: each side plans alone, the majority side
// under a new coordinator. It answers how many periods after the heal
// every share is within the tolerance of the targets of a plan made after
// the heal (-1: not within ten periods).
func measureHeal(seed uint64, kind regions.Kind, partition time.Duration) (float64, error) {
	s, err := New(Options{Seed: seed, Regions: 3, Net: liveNet})
	if err != nil {
		return 0, err
	}
	c, err := s.AddCounter("c", regions.Limit{Kind: kind, Units: 1000, Window: (10 * time.Second).Microseconds()})
	if err != nil {
		return 0, err
	}
	s.SetTraffic(c, Traffic{Rate: 0.9 * RateOf(c.Limit), Split: []float64{0.5, 0.5, 0}})
	if err := s.RunFor(20 * time.Second); err != nil {
		return 0, err
	}
	s.Partition([]int{0}, false)
	if err := s.RunFor(partition); err != nil {
		return 0, err
	}
	s.Heal()
	healed := s.now
	var stale *int64
	if tg := s.Targets(c); len(tg) > 0 {
		stale = &tg[0]
	}
	reached := int64(-1)
	s.probe(func() {
		if reached >= 0 {
			return
		}
		if tg := s.Targets(c); len(tg) == 0 || &tg[0] == stale {
			return // no plan since the heal yet
		}
		if s.converged(c) {
			reached = s.now - healed
		}
	})
	if err := s.RunFor(time.Duration(10*s.cfg.Period) * time.Microsecond); err != nil {
		return 0, err
	}
	if reached < 0 {
		return -1, nil
	}
	return float64(reached) / float64(s.cfg.Period), nil
}

// measureMessages: hot counters with clients split over the regions at
// 90 % of their limits, and cold counters each used lightly. It answers
// the messages crossing regions per period once running.
func measureMessages(seed uint64, hot, cold int) (float64, error) {
	s, err := New(Options{Seed: seed, Regions: 3, Net: liveNet})
	if err != nil {
		return 0, err
	}
	for i := range hot {
		c, err := s.AddCounter(fmt.Sprintf("hot-%d", i), regions.Limit{Kind: kinds[i%len(kinds)], Units: 1000, Window: (10 * time.Second).Microseconds()})
		if err != nil {
			return 0, err
		}
		s.SetTraffic(c, Traffic{Rate: 0.9 * RateOf(c.Limit), Split: []float64{0.7, 0.2, 0.1}})
	}
	if cold > 0 {
		if err := s.AddCold(cold, 0.02, func(i int) regions.Limit {
			return regions.Limit{Kind: kinds[i%len(kinds)], Units: 1000, Window: (10 * time.Second).Microseconds()}
		}); err != nil {
			return 0, err
		}
	}
	if err := s.RunFor(20 * time.Second); err != nil {
		return 0, err
	}
	m0 := s.Stats().Messages
	const run = 40 * time.Second
	if err := s.RunFor(run); err != nil {
		return 0, err
	}
	return float64(s.Stats().Messages-m0) / (float64(run.Microseconds()) / float64(s.cfg.Period)), nil
}

// scenarioSplit is the regions loadtest scenario's split phase in the
// simulation: a global fixed window of 50 per second, period 500 ms, a
// paced client at 90 % of L split by split from its first request, for
// 15 s, its decisions reaching each region's agent lag late (the decision
// stream), in polls of batch if it is not 0. It answers the false
// rejections over seeds 1 to seeds.
func scenarioSplit(n int, split []float64, lag, batch time.Duration, seeds uint64) (falseRej, requests int64, err error) {
	for seed := uint64(1); seed <= seeds; seed++ {
		s, err := New(Options{Seed: seed, Regions: n, Net: liveNet, Config: regions.Config{Period: 500_000}, DemandLag: lag, DemandBatch: batch})
		if err != nil {
			return 0, 0, err
		}
		c, err := s.AddCounter("c", regions.Limit{Kind: regions.FixedWindow, Units: 50, Window: 1_000_000})
		if err != nil {
			return 0, 0, err
		}
		s.SetTraffic(c, Traffic{Rate: 45, Split: split, Paced: true})
		if err := s.RunFor(15 * time.Second); err != nil {
			return 0, 0, err
		}
		falseRej += c.Stats.FalseRejections
		requests += c.Stats.Requests
	}
	return falseRej, requests, nil
}

// TestLivenessScenarioSplit: split traffic at 90 % of L, counted from its
// first request, is falsely rejected at most 1 % of the time with three
// regions (where a region's static share, 17 of 50, runs out in about
// half a second), the decisions reaching the agents 300 ms late. It holds
// because a region reports a counter that turns hot within a period at
// once and the coordinator plans it then (without: 1.25 %).
func TestLivenessScenarioSplit(t *testing.T) {
	f, n, err := scenarioSplit(3, []float64{0.7, 0.3}, 300*time.Millisecond, 0, 20)
	if err != nil {
		t.Fatal(err)
	}
	if v := float64(f) / float64(n); v > 0.01 {
		t.Errorf("split 70/30, 3 regions: %d false rejections of %d requests (%.2f %%), want ≤ 1 %%", f, n, 100*v)
	}
}

// TestLivenessScenarioSplitPolled: the same with the decisions reaching
// the agents in polls of 300 ms, as a decision stream consumed in polls
// delivers them, two regions, 70/30: at most 1 %. It holds because a
// region's demand is its rate over two periods; over one, a period that
// counted two polls and the next that counted one swing the targets and
// what the giver keeps from window to window (2.3 %).
func TestLivenessScenarioSplitPolled(t *testing.T) {
	f, n, err := scenarioSplit(2, []float64{0.7, 0.3}, 200*time.Millisecond, 300*time.Millisecond, 20)
	if err != nil {
		t.Fatal(err)
	}
	if v := float64(f) / float64(n); v > 0.01 {
		t.Errorf("split 70/30, 2 regions, demand in polls of 300 ms: %d false rejections of %d requests (%.2f %%), want ≤ 1 %%", f, n, 100*v)
	}
}

var flagFigures = flag.Bool("regionsim.figures", false, "measure and print the liveness figures (about a minute)")

// TestLivenessBucket holds the figures buckets reach: a client moving all
// its traffic to another region gets 90 % of the limit there within three
// periods (the goal is two; docs/benchmarks.md has the measured worst), and traffic split any way at 90 % of the limit is falsely
// rejected at most 1 % of the time.
func TestLivenessBucket(t *testing.T) {
	for _, seed := range []uint64{1, 2} {
		for _, n := range []int{3, 5} {
			p, err := measureMove(seed, regions.Bucket, 10*time.Second, n)
			if err != nil {
				t.Fatalf("seed %d move: %v", seed, err)
			}
			if p < 0 || p > 3 {
				t.Errorf("seed %d, %d regions: moved client reached 90%% of the limit after %.2f periods, want ≤ 3", seed, n, p)
			}
		}
		for _, split := range [][]float64{{1, 1, 1}, {0.7, 0.2, 0.1}, {0.5, 0.5, 0}} {
			f, err := measureSplit(seed, regions.Bucket, 10*time.Second, split)
			if err != nil {
				t.Fatalf("seed %d split: %v", seed, err)
			}
			if f > 0.01 {
				t.Errorf("seed %d split %v: false rejections %.4f, want ≤ 0.01", seed, split, f)
			}
		}
	}
}

// TestLivenessFigures prints the liveness figures recorded in
// docs/benchmarks.md; it runs only with -regionsim.figures.
func TestLivenessFigures(t *testing.T) {
	if !*flagFigures {
		t.Skip("run with -regionsim.figures")
	}
	seeds := []uint64{1, 2, 3}
	worst := func(f func(seed uint64) (float64, error)) string {
		w := 0.0
		for _, seed := range seeds {
			v, err := f(seed)
			if err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
			if v < 0 {
				return "never"
			}
			w = max(w, v)
		}
		return fmt.Sprintf("%.3g", w)
	}
	for _, k := range kinds {
		for _, w := range []time.Duration{10 * time.Second, 60 * time.Second} {
			t.Logf("move %-14v W=%-4v periods to 90%% (worst of %d seeds): %s", k, w, len(seeds),
				worst(func(seed uint64) (float64, error) { return measureMove(seed, k, w, 3) }))
		}
		for _, sp := range [][]float64{{1, 1, 1}, {0.7, 0.2, 0.1}, {0.5, 0.5, 0}} {
			t.Logf("split %-14v %v false-rejection fraction (worst): %s", k, sp,
				worst(func(seed uint64) (float64, error) { return measureSplit(seed, k, 10*time.Second, sp) }))
		}
		t.Logf("heal %-14v periods to converged after a 60 s partition (worst): %s", k,
			worst(func(seed uint64) (float64, error) { return measureHeal(seed, k, 60*time.Second) }))
	}
	for _, n := range []int{2, 3} {
		for _, sp := range [][]float64{{0.7, 0.3}, {0.5, 0.5}} {
			for _, batch := range []time.Duration{0, 300 * time.Millisecond} {
				f, rq, err := scenarioSplit(n, sp, 300*time.Millisecond, batch, 20)
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("scenario split %v, %d regions, paced, period 500 ms, W=1s, L=50, demand 300 ms late in polls of %v: false rejections %.2f %% (%d of %d, seeds 1-20, 15 s each from the start)",
					sp, n, batch, 100*float64(f)/float64(rq), f, rq)
			}
		}
	}
	for _, n := range []int{2, 3} {
		worst, sum := 1.0, make([]float64, 4)
		for seed := uint64(1); seed <= 20; seed++ {
			fr, err := scenarioMove(n, 300*time.Millisecond, 0, seed)
			if err != nil {
				t.Fatal(err)
			}
			worst = min(worst, max(fr[0], fr[1]))
			for k, v := range fr {
				sum[k] += v / 20
			}
		}
		t.Logf("scenario move, %d regions, paced at 2 × L, period 500 ms, W=1s, L=50, demand 300 ms late: L in r2 per whole window after the move, mean of seeds 1-20 %.2f; the worst seed's best of the first two %.2f",
			n, sum, worst)
	}
	for _, hc := range [][2]int{{0, 1000}, {3, 1000}, {10, 0}, {10, 1000}, {10, 100_000}, {30, 1000}} {
		t.Logf("messages hot=%-2d cold=%-4d per period (worst): %s", hc[0], hc[1],
			worst(func(seed uint64) (float64, error) { return measureMessages(seed, hc[0], hc[1]) }))
	}
}

// scenarioMove is the regions loadtest scenario's moving client in the
// simulation: a global fixed window of 50 per second, period 500 ms, a
// paced client at 2 × L in r1 for 7.5 s that then sends everything to
// r2, its decisions reaching each region's agent lag late (in polls of
// batch if it is not 0). It answers,
// for each seed, the part of L r2 admitted in each of the first four
// whole windows after the move (as the scenario reads it).
func scenarioMove(n int, lag, batch time.Duration, seed uint64) ([]float64, error) {
	s, err := New(Options{Seed: seed, Regions: n, Net: liveNet, Config: regions.Config{Period: 500_000}, DemandLag: lag, DemandBatch: batch})
	if err != nil {
		return nil, err
	}
	const w = 1_000_000
	c, err := s.AddCounter("c", regions.Limit{Kind: regions.FixedWindow, Units: 50, Window: w})
	if err != nil {
		return nil, err
	}
	from := make([]float64, n)
	from[0] = 1
	s.SetTraffic(c, Traffic{Rate: 100, Split: from, Paced: true})
	if err := s.RunFor(7500 * time.Millisecond); err != nil {
		return nil, err
	}
	// Move at a seeded point of a window, as the scenario's moves land.
	if err := s.RunFor(time.Duration(s.rng.Int64N(w)) * time.Microsecond); err != nil {
		return nil, err
	}
	to := make([]float64, n)
	to[1] = 1
	s.SetTraffic(c, Traffic{Rate: 100, Split: to, Paced: true})
	first := floorDiv(s.now, w) + 1
	got := make([]int64, 4)
	c.OnDecision = func(region int, allowed, _ bool) {
		if k := floorDiv(s.now, w) - first; region == 1 && allowed && k >= 0 && k < int64(len(got)) {
			got[k]++
		}
	}
	if err := s.RunFor(time.Duration(first*w-s.now+int64(len(got))*w) * time.Microsecond); err != nil {
		return nil, err
	}
	fr := make([]float64, len(got))
	for k, g := range got {
		fr[k] = float64(g) / float64(c.Limit.Units)
	}
	return fr, nil
}

// TestLivenessScenarioMove: the regions scenario's moving client gets at
// least 90 % of L in its new region in one of the first two whole windows
// after the move (the scenario's figure), with two and three regions, in
// each of 20 seeds, its decisions reaching the agents 300 ms late, or
// 800 ms late in polls of 500 ms (a stalling decision stream); with them
// 300 ms late, the first whole window alone gets 90 % of L on average. It
// holds because a fixed window's loans are planned from what each region
// holds of each window, so the region the client left passes on the
// units it borrowed from a third region as well as its own and the new
// region's (without: 68 % and 84 % with three regions), and because that
// region finds the client's demand gone from its ledger within a period
// and lends at once (without: 34 % to 74 % in the worst seed with the
// late stream, and 49 % and 78 % in the first whole window on average
// with 300 ms).
func TestLivenessScenarioMove(t *testing.T) {
	tests := []struct {
		name       string
		lag, batch time.Duration
		firstMean  float64 // the least mean of the first whole window, 0: not checked
	}{
		{"decisions 300 ms late", 300 * time.Millisecond, 0, 0.9},
		{"decisions 800 ms late in polls of 500 ms", 800 * time.Millisecond, 500 * time.Millisecond, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, n := range []int{2, 3} {
				var first float64
				const seeds = 20
				for seed := uint64(1); seed <= seeds; seed++ {
					fr, err := scenarioMove(n, tt.lag, tt.batch, seed)
					if err != nil {
						t.Fatal(err)
					}
					if within := max(fr[0], fr[1]); within < 0.9 {
						t.Errorf("%d regions, seed %d: L available in r2 in the whole windows after the move %.2f, want ≥ 0.90 in one of the first two", n, seed, fr)
					}
					first += fr[0] / seeds
				}
				if first < tt.firstMean {
					t.Errorf("%d regions: L available in r2 in the first whole window after the move %.2f on average, want ≥ %.2f", n, first, tt.firstMean)
				}
			}
		})
	}
}
