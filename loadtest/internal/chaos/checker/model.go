package checker

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/tollgate/tollgate/loadtest/internal/chaos/history"
)

// admission is one admitted request as its client saw it: its true time
// (when the limiter decided) lies in [lo, hi].
type admission struct {
	lo, hi history.Micros
	cost   int64
}

// param is a value in force over an interval: a limit and rate of a rule
// version, or an override's factor.
type param struct {
	iv    interval
	limit float64
	rate  float64 // units per second
}

// grant is extra units a counter may admit because of something over an
// interval: a reset (a whole limit), a quota grant, a restart with lost
// data, a local limiter started afresh.
type grant struct {
	iv interval
	// units is what it grants; rateFor adds the rate in force times this
	// long (a primary going on admitting after it was replaced).
	units   float64
	limits  float64 // in whole limits in force (a reset: 1)
	rateFor history.Micros
}

// model is the algorithm and its parameters over time for one counter,
// with the grants it received: what the checker holds admissions to.
type model struct {
	algorithm string
	window    history.Micros // windowed algorithms
	precision int
	params    []param // sorted by iv.From
	grants    []grant // sorted by iv.From
	// slack is added to every bound: what the fast path may admit beyond
	// the model (rate × lease lifetime for buckets, at most a share of
	// the limit), 0 for strict rules.
	slackShare float64
	maxTTL     history.Micros
}

// violation is one span where more was admitted than the bound.
type violation struct {
	lo, hi   history.Micros
	admitted int64
	bound    float64
	detail   string
}

func (v violation) String() string {
	return fmt.Sprintf("%d units admitted in [%s, %s] (%.2fs), bound %.2f (%s)",
		v.admitted, fmtTime(v.lo), fmtTime(v.hi), float64(v.hi-v.lo)/1e6, v.bound, v.detail)
}

// window of the running max/sum over parameters and grants for spans
// starting at lo, as the span's end grows.
type cursor struct {
	m     *model
	lo    history.Micros
	pi    int
	gi    int
	limit float64
	rate  float64
	// grants in force so far, with their parts.
	units, limits float64
	rateFor       history.Micros
}

func (m *model) cursor(lo history.Micros) *cursor {
	return &cursor{m: m, lo: lo}
}

// advance takes in the parameters and grants that start by hi.
func (c *cursor) advance(hi history.Micros) {
	for ; c.pi < len(c.m.params) && c.m.params[c.pi].iv.From <= hi; c.pi++ {
		p := c.m.params[c.pi]
		if p.iv.To >= c.lo {
			c.limit = math.Max(c.limit, p.limit)
			c.rate = math.Max(c.rate, p.rate)
		}
	}
	for ; c.gi < len(c.m.grants) && c.m.grants[c.gi].iv.From <= hi; c.gi++ {
		g := c.m.grants[c.gi]
		if g.iv.To >= c.lo {
			c.units += g.units
			c.limits += g.limits
			c.rateFor += g.rateFor
		}
	}
}

// bound is what may be admitted in [c.lo, hi] for a span-based algorithm
// (token bucket, GCRA: limit + rate × span; sliding log: limit), with the
// grants and slack.
func (c *cursor) bound(hi history.Micros, bucket bool) (float64, string) {
	c.advance(hi)
	b := c.limit * (1 + c.limits)
	detail := fmt.Sprintf("limit %.0f", c.limit)
	if bucket {
		span := float64(hi-c.lo) / 1e6
		b += c.rate * span
		detail += fmt.Sprintf(" + rate %.3g/s × %.2fs", c.rate, span)
		if c.rateFor > 0 {
			b += c.rate * float64(c.rateFor) / 1e6
		}
		if c.m.slackShare > 0 && c.rate > 0 {
			life := math.Min(c.m.slackShare*c.limit/c.rate, float64(c.m.maxTTL)/1e6)
			b += c.rate * life
			detail += fmt.Sprintf(" + lease %.2f", c.rate*life)
		}
	}
	b += c.units
	if c.limits > 0 || c.units > 0 || c.rateFor > 0 {
		detail += fmt.Sprintf(" + %.0f limit(s) and %.0f unit(s) granted", c.limits, c.units)
	}
	return b, detail
}

// check holds admissions to the model; it returns the spans that exceed
// it (at most max; total counts them all).
func (m *model) check(adms []admission, max int) (out []violation, total int) {
	if len(adms) == 0 {
		return nil, 0
	}
	slices.SortFunc(adms, func(a, b admission) int { return cmp.Compare(a.lo, b.lo) })
	add := func(v violation) {
		total++
		if len(out) < max {
			out = append(out, v)
		}
	}
	switch m.algorithm {
	case history.FixedWindow:
		m.checkBlocks(adms, m.window, 1, add)
	case history.SlidingWindowCounter:
		p := max1(m.precision)
		m.checkBlocks(adms, m.window/history.Micros(p), p, add)
	case history.SlidingWindowLog:
		m.checkLog(adms, add)
	case history.TokenBucket, history.GCRA:
		m.checkBucket(adms, add)
	default:
		add(violation{detail: "unknown algorithm " + m.algorithm})
	}
	return out, total
}

func max1(n int) int {
	if n < 1 {
		return 1
	}
	return n
}

// checkBlocks holds windowed counters: at most the limit in any p
// consecutive sub-windows of length sub aligned to the epoch (fixed
// window: p = 1). An admission counts in a sub-window only when it surely
// lies in it.
func (m *model) checkBlocks(adms []admission, sub history.Micros, p int, add func(violation)) {
	if sub <= 0 {
		return
	}
	units := map[int64]int64{}
	var idx []int64
	for _, a := range adms {
		i0, i1 := floorDiv(a.lo, sub), floorDiv(a.hi, sub)
		if i0 != i1 || a.cost == 0 {
			continue
		}
		if _, ok := units[i0]; !ok {
			idx = append(idx, i0)
		}
		units[i0] += a.cost
	}
	slices.Sort(idx)
	seen := map[int64]bool{}
	for _, i := range idx {
		for start := i - int64(p) + 1; start <= i; start++ {
			if seen[start] {
				continue
			}
			seen[start] = true
			var n int64
			for k := start; k < start+int64(p); k++ {
				n += units[k]
			}
			lo, hi := start*int64(sub), (start+int64(p))*int64(sub)-1
			c := m.cursor(lo)
			b, detail := c.bound(hi, false)
			if float64(n) > b+1e-9 {
				add(violation{lo: lo, hi: hi, admitted: n, bound: b, detail: detail})
			}
		}
	}
}

// checkLog holds sliding logs: at most the limit in any span of the
// window.
func (m *model) checkLog(adms []admission, add func(violation)) {
	for i := range adms {
		lo := adms[i].lo
		end := lo + m.window // exclusive
		var n int64
		hi := lo
		for k := i; k < len(adms) && adms[k].lo < end; k++ {
			if adms[k].hi < end {
				n += adms[k].cost
				hi = max(hi, adms[k].hi)
			}
		}
		c := m.cursor(lo)
		b, detail := c.bound(end-1, false)
		if float64(n) > b+1e-9 {
			add(violation{lo: lo, hi: hi, admitted: n, bound: b, detail: detail})
			return // one span is enough to show it; the rest overlap
		}
	}
}

// checkBucket holds token buckets and GCRA: at most limit + rate × span
// in any span. Spans longer than the horizon are not looked at: a steady
// excess shows within a few refills of the bucket.
func (m *model) checkBucket(adms []admission, add func(violation)) {
	horizon := history.Micros(20e6)
	if len(m.params) > 0 && m.params[0].rate > 0 {
		refill := history.Micros(3 * m.params[0].limit / m.params[0].rate * 1e6)
		horizon = min(max(horizon, refill), 600e6)
	}
	for i := range adms {
		lo := adms[i].lo
		c := m.cursor(lo)
		var n int64
		hi := lo
		worst := violation{}
		for k := i; k < len(adms) && adms[k].lo-lo <= horizon; k++ {
			n += adms[k].cost
			hi = max(hi, adms[k].hi)
			b, detail := c.bound(hi, true)
			if float64(n) > b+1e-9 && float64(n)-b > float64(worst.admitted)-worst.bound {
				worst = violation{lo: lo, hi: hi, admitted: n, bound: b, detail: detail}
			}
		}
		if worst.admitted > 0 {
			add(worst)
			return // later spans starting inside this one show the same excess
		}
	}
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}
