package regionsim

import (
	"cmp"
	"fmt"
	"time"

	"github.com/tollgate/tollgate/internal/regions"
)

// Chaos is a random run: hot counters whose clients change at random
// (split any way, moving between regions, rotating across them at several
// times the limit, bursting, idle), cold counters, and faults at random
// times — partitions symmetric and one-way, coordinators crashing,
// aggregators restarting, regions going away for a while.
type Chaos struct {
	Duration time.Duration
	// Hot counters get their own clients; Cold ones share a light stream.
	Hot, Cold int
	// MaxUnits bounds the limits drawn (default 400); limits smaller than
	// the number of regions are drawn too.
	MaxUnits int64
	// MaxRate is the highest client rate, as a multiple of the rate that
	// uses the limit in full (default 4).
	MaxRate float64
	// Faults per minute of each kind (defaults 4, 1, 1, 0.5).
	Partitions, CoordinatorCrashes, Restarts, Outages float64
	// MaxPartition is the longest partition (default 60 s).
	MaxPartition time.Duration
	// LimitChanges per minute (default none): a hot counter's limit is
	// cut (an override or a penalty) or set back to the rule's, reaching
	// each region at its own moment within MaxLimitSpread (default 3 s),
	// as controls reach each region's gateways.
	LimitChanges   float64
	MaxLimitSpread time.Duration
}

// Chaos schedules c's counters, clients and faults from now on.
func (s *Sim) Chaos(c Chaos) error {
	c.MaxUnits = cmp.Or(c.MaxUnits, 400)
	c.MaxRate = cmp.Or(c.MaxRate, 4)
	c.Partitions = cmp.Or(c.Partitions, 4)
	c.CoordinatorCrashes = cmp.Or(c.CoordinatorCrashes, 1)
	c.Restarts = cmp.Or(c.Restarts, 1)
	c.Outages = cmp.Or(c.Outages, 0.5)
	c.MaxPartition = cmp.Or(c.MaxPartition, 60*time.Second)
	c.MaxLimitSpread = cmp.Or(c.MaxLimitSpread, 3*time.Second)
	end := s.now + c.Duration.Microseconds()
	for i := range c.Hot {
		ctr, err := s.AddCounter(fmt.Sprintf("hot-%d", i), s.randomLimit(c.MaxUnits))
		if err != nil {
			return err
		}
		s.changeTraffic(ctr, c, end)
	}
	if c.Cold > 0 {
		if err := s.AddCold(c.Cold, 0.02, func(int) regions.Limit { return s.randomLimit(c.MaxUnits) }); err != nil {
			return err
		}
	}
	s.poisson(c.Partitions, end, func() {
		n := len(s.regs)
		if n < 2 {
			return
		}
		var side []int
		for len(side) == 0 || len(side) == n {
			side = side[:0]
			for i := range n {
				if s.rng.IntN(2) == 0 {
					side = append(side, i)
				}
			}
		}
		s.Partition(side, s.rng.IntN(10) < 3)
		d := 1_000_000 + s.rng.Int64N(max(c.MaxPartition.Microseconds()-1_000_000, 1))
		s.schedule(s.now+d, s.Heal)
	})
	s.poisson(c.CoordinatorCrashes, end, func() {
		for _, r := range s.regs {
			if r.coord != nil {
				s.CrashCoordinator(r.idx)
				return
			}
		}
	})
	s.poisson(c.LimitChanges, end, func() {
		if len(s.order) == 0 {
			return
		}
		ctr := s.order[s.rng.IntN(len(s.order))]
		units := ctr.Limit.Units
		if s.rng.IntN(3) > 0 {
			units = s.rng.Int64N(ctr.Limit.Units + 1)
		}
		for i := range s.regs {
			s.schedule(s.now+s.rng.Int64N(c.MaxLimitSpread.Microseconds()+1), func() {
				if err := s.SetLimit(ctr, i, units); err != nil {
					s.fail(err)
				}
			})
		}
	})
	s.poisson(c.Restarts, end, func() { s.RestartAgent(s.rng.IntN(len(s.regs))) })
	s.poisson(c.Outages, end, func() {
		s.Outage(s.rng.IntN(len(s.regs)), time.Duration(1_000_000+s.rng.Int64N(20_000_000))*time.Microsecond)
	})
	return nil
}

// poisson runs fn at random times, perMinute on average, until end.
func (s *Sim) poisson(perMinute float64, end int64, fn func()) {
	if perMinute <= 0 {
		return
	}
	var next func()
	next = func() {
		if s.now > end {
			return
		}
		fn()
		s.schedule(s.now+s.exp(60e6/perMinute), next)
	}
	s.schedule(s.now+s.exp(60e6/perMinute), next)
}

// randomLimit draws a global limit: any kind, units from 1 to maxUnits
// (small ones often), windows from the shortest the skew allows to 30 s.
func (s *Sim) randomLimit(maxUnits int64) regions.Limit {
	kinds := []regions.Kind{regions.FixedWindow, regions.SlidingWindow, regions.Bucket}
	lim := regions.Limit{Kind: kinds[s.rng.IntN(len(kinds))]}
	if s.rng.IntN(5) == 0 {
		lim.Units = 1 + s.rng.Int64N(int64(2*len(s.regs)))
	} else {
		lim.Units = 1 + s.rng.Int64N(maxUnits)
	}
	shortest := max(4*s.cfg.Skew, 500_000)
	lim.Window = shortest + s.rng.Int64N(30_000_000-shortest)
	return lim
}

// changeTraffic gives c new clients now and again every 3 to 20 s.
func (s *Sim) changeTraffic(c *Counter, ch Chaos, end int64) {
	if s.now > end {
		s.SetTraffic(c, Traffic{})
		return
	}
	full := RateOf(c.Limit)
	n := len(s.regs)
	split := func() []float64 {
		w := make([]float64, n)
		for i := range w {
			w[i] = s.rng.Float64()
		}
		return w
	}
	var t Traffic
	switch x := s.rng.IntN(100); {
	case x < 30:
		t = Traffic{Rate: full * (0.2 + s.rng.Float64()), Split: split()}
	case x < 55:
		one := make([]float64, n)
		one[s.rng.IntN(n)] = 1
		t = Traffic{Rate: full * (0.5 + s.rng.Float64()), Split: one}
	case x < 70:
		t = Traffic{Rate: full * (2 + s.rng.Float64()*(ch.MaxRate-2)), Rotate: true}
	case x < 85:
		t = Traffic{Rate: full * ch.MaxRate, Split: split()}
	}
	s.SetTraffic(c, t)
	s.schedule(s.now+3_000_000+s.rng.Int64N(17_000_000), func() { s.changeTraffic(c, ch, end) })
}
