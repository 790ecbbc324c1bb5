package regionsim

import (
	"fmt"
	"math"

	"github.com/tollgate/tollgate/internal/regions"
)

// Counter is one global counter of the simulation and its clients.
type Counter struct {
	Name    string
	Limit   regions.Limit
	traffic Traffic
	gen     int
	next    int // the region a rotating client uses next
	// sent counts a paced client's requests per region, so that each
	// goes to the region furthest behind its part of Split.
	sent  []float64
	judge *regions.Judge
	ref   *regions.Judge
	// views is the limit each region's gateways decide the counter
	// under (an override or a penalty cut it there), by region; a zero
	// Limit is the rule's.
	views []regions.Limit
	Stats CounterStats
	// OnDecision, when set, sees every decision the fleet makes for the
	// counter: the region, and whether the fleet and the reference (one
	// region alone with the whole limit) admitted it.
	OnDecision func(region int, allowed, refAllowed bool)
}

// CounterStats counts one counter's requests.
type CounterStats struct {
	Requests, Admitted, Rejected, Lost, FalseRejections int64
}

// Traffic is a counter's clients: requests of cost 1 arriving as a Poisson
// stream at Rate per second, sent to a region drawn by the weights of
// Split (nil: every region alike), or, with Rotate, to each region in
// turn. Paced clients send one request every 1/Rate seconds instead, each
// to the region furthest behind its part of Split, as the regions
// loadtest scenario's clients do.
type Traffic struct {
	Rate   float64
	Split  []float64
	Rotate bool
	Paced  bool
}

// limitIn is the limit region i decides c under.
func (c *Counter) limitIn(i int) regions.Limit {
	if i < len(c.views) && c.views[i] != (regions.Limit{}) {
		return c.views[i]
	}
	return c.Limit
}

// SetLimit makes region i decide c under units instead of the rule's
// limit (an override or a penalty reaching that region's gateways), or
// under the rule's again with units equal to it. Units must be at most
// the rule's: the judges hold the rule's limit.
func (s *Sim) SetLimit(c *Counter, i int, units int64) error {
	if units < 0 || units > c.Limit.Units {
		return fmt.Errorf("regionsim: counter %q: limit %d not in [0, %d]", c.Name, units, c.Limit.Units)
	}
	if c.views == nil {
		c.views = make([]regions.Limit, len(s.regs))
	}
	lim := c.Limit
	lim.Units = units
	c.views[i] = lim
	return nil
}

// RateOf is the rate, in requests per second, at which a counter's limit
// is used in full: L per window (a bucket: its refill rate).
func RateOf(lim regions.Limit) float64 { return float64(lim.Units) * 1e6 / float64(lim.Window) }

// AddCounter adds a counter without traffic.
func (s *Sim) AddCounter(name string, lim regions.Limit) (*Counter, error) {
	if _, dup := s.counters[name]; dup {
		return nil, fmt.Errorf("regionsim: counter %q twice", name)
	}
	if err := lim.Validate(s.cfg); err != nil {
		return nil, fmt.Errorf("regionsim: counter %q: %w", name, err)
	}
	c := &Counter{Name: name, Limit: lim, judge: regions.NewJudge(lim), ref: regions.NewJudge(lim)}
	s.counters[name] = c
	s.order = append(s.order, c)
	return c, nil
}

// Counter is the counter of that name, or nil.
func (s *Sim) Counter(name string) *Counter { return s.counters[name] }

// Counters lists the counters with their own traffic, in the order added.
func (s *Sim) Counters() []*Counter { return s.order }

// SetTraffic replaces c's clients from now on.
func (s *Sim) SetTraffic(c *Counter, t Traffic) {
	c.gen++
	c.traffic = t
	c.sent = nil
	s.arrivals(c, c.gen)
}

func (s *Sim) arrivals(c *Counter, gen int) {
	if c.traffic.Rate <= 0 {
		return
	}
	gap := max(s.exp(1e6/c.traffic.Rate), 1)
	if c.traffic.Paced {
		gap = max(int64(1e6/c.traffic.Rate), 1)
	}
	s.schedule(s.now+gap, func() {
		if c.gen != gen {
			return
		}
		s.request(c, s.route(c))
		s.arrivals(c, gen)
	})
}

func (s *Sim) route(c *Counter) int {
	n := len(s.regs)
	if c.traffic.Rotate {
		c.next = (c.next + 1) % n
		return c.next
	}
	if len(c.traffic.Split) == 0 {
		return s.rng.IntN(n)
	}
	if c.traffic.Paced {
		return c.paced(n)
	}
	var sum float64
	for _, w := range c.traffic.Split[:min(n, len(c.traffic.Split))] {
		sum += w
	}
	x := s.rng.Float64() * sum
	for i, w := range c.traffic.Split[:min(n, len(c.traffic.Split))] {
		if x < w {
			return i
		}
		x -= w
	}
	return n - 1
}

// paced is the region furthest behind its part of Split, counting the
// request it is chosen for (ties: the first).
func (c *Counter) paced(n int) int {
	split := c.traffic.Split[:min(n, len(c.traffic.Split))]
	if c.sent == nil {
		c.sent = make([]float64, len(split))
	}
	var sum, total float64
	for i, w := range split {
		sum += w
		total += c.sent[i]
	}
	best, lag := 0, math.Inf(-1)
	for i, w := range split {
		if l := (total+1)*w/sum - c.sent[i]; l > lag {
			best, lag = i, l
		}
	}
	c.sent[best]++
	return best
}

// AddCold adds n counters that share one stream of requests at rate per
// second each, to regions at random; lim gives each its limit. Cold
// counters stay far from their limits, so they should cost nothing across
// regions: they exist to show that.
func (s *Sim) AddCold(n int, rate float64, lim func(i int) regions.Limit) error {
	for i := range n {
		c, err := s.AddCounter(fmt.Sprintf("cold-%d", len(s.cold)), lim(i))
		if err != nil {
			return err
		}
		s.order = s.order[:len(s.order)-1]
		s.cold = append(s.cold, c)
	}
	s.coldRate += rate * float64(n)
	s.coldGen++
	s.coldArrivals(s.coldGen)
	return nil
}

func (s *Sim) coldArrivals(gen int) {
	if s.coldRate <= 0 || len(s.cold) == 0 {
		return
	}
	s.schedule(s.now+max(s.exp(1e6/s.coldRate), 1), func() {
		if s.coldGen != gen {
			return
		}
		s.request(s.cold[s.rng.IntN(len(s.cold))], s.rng.IntN(len(s.regs)))
		s.coldArrivals(gen)
	})
}

// request is one request of cost 1 for c arriving at region i.
func (s *Sim) request(c *Counter, i int) {
	r := s.regs[i]
	s.stats.Requests++
	c.Stats.Requests++
	if !r.up {
		s.stats.Lost++
		c.Stats.Lost++
		return
	}
	const cost = 1
	refOK := c.ref.Admit(s.now, cost)
	a, err := r.ledger.Admit(s.ctx, c.Name, c.limitIn(i), cost, s.local(r))
	if err != nil {
		s.fail(fmt.Errorf("region %s admit %s: %w", r.name, c.Name, err))
		return
	}
	decided := s.local(r)
	if s.lag > 0 || s.batch > 0 {
		allowed := a.Allowed
		at := s.now + s.lag
		if s.batch > 0 {
			at = (floorDiv(at-1, s.batch) + 1) * s.batch
		}
		s.schedule(at, func() {
			if r.up {
				r.agent.ObserveAt(c.Name, c.Limit, cost, allowed, decided)
			}
		})
	} else {
		r.agent.ObserveAt(c.Name, c.Limit, cost, a.Allowed, decided)
	}
	if a.Allowed {
		s.stats.Admitted++
		c.Stats.Admitted++
		if err := c.judge.Charge(s.now, cost); err != nil {
			s.fail(fmt.Errorf("counter %s (%s, L=%d, W=%dµs): region %s admitted beyond the limit: %w%s",
				c.Name, c.Limit.Kind, c.Limit.Units, c.Limit.Window, r.name, err, s.describe(c)))
			return
		}
	} else {
		s.stats.Rejected++
		c.Stats.Rejected++
		if refOK {
			s.stats.FalseRejections++
			c.Stats.FalseRejections++
		}
	}
	if c.OnDecision != nil {
		c.OnDecision(i, a.Allowed, refOK)
	}
	s.checkShares(c)
}
