package regions

import (
	"cmp"
	"container/heap"
	"fmt"
	"math"
	"math/bits"
	"slices"
)

// Judge is one region alone holding the whole limit, in true time
// (microseconds): what every admission of a fleet of regions is charged to
// (Charge), and the reference that decides each request itself (Admit) to
// count false rejections. The simulation and the regions load test both
// judge with it. Times passed to one Judge must not go backwards.
type Judge struct {
	lim Limit
	// fixed window: the current true window and its count.
	win, n int64
	// sliding window: admissions in the trailing window, oldest first.
	log []judgeEntry
	sum int64
	// bucket: capacity in use × Window, as of at.
	debt, at int64
}

type judgeEntry struct{ t, cost int64 }

// NewJudge is a judge of lim with nothing admitted yet.
func NewJudge(lim Limit) *Judge { return &Judge{lim: lim, win: -1 << 62, at: -1 << 62} }

// advance brings the judge to true time t.
func (j *Judge) advance(t int64) {
	w := j.lim.Window
	switch j.lim.Kind {
	case FixedWindow:
		if k := judgeWindow(t, w); k != j.win {
			j.win, j.n = k, 0
		}
	case SlidingWindow:
		i := 0
		for i < len(j.log) && j.log[i].t <= t-w {
			j.sum -= j.log[i].cost
			i++
		}
		j.log = j.log[i:]
	case Bucket:
		if t > j.at {
			if t-j.at >= w {
				j.debt = 0
			} else {
				j.debt = max(j.debt-j.lim.Units*(t-j.at), 0)
			}
			j.at = t
		}
	}
}

// fits reports whether cost fits at the current time (after advance).
func (j *Judge) fits(cost int64) bool {
	switch j.lim.Kind {
	case FixedWindow:
		return j.n+cost <= j.lim.Units
	case SlidingWindow:
		return j.sum+cost <= j.lim.Units
	default:
		return j.debt+cost*j.lim.Window <= j.lim.Units*j.lim.Window
	}
}

func (j *Judge) take(t, cost int64) {
	switch j.lim.Kind {
	case FixedWindow:
		j.n += cost
	case SlidingWindow:
		j.log = append(j.log, judgeEntry{t, cost})
		j.sum += cost
	default:
		j.debt += cost * j.lim.Window
	}
}

// Admit decides a request at true time t as one region alone with the
// whole limit would, and takes its cost when it admits it.
func (j *Judge) Admit(t, cost int64) bool {
	j.advance(t)
	if !j.fits(cost) {
		return false
	}
	j.take(t, cost)
	return true
}

// Charge takes an admission the fleet made at true time t; an error when
// one region alone with the whole limit could not have made it. The cost
// is taken either way, so every later over-admission is reported too.
func (j *Judge) Charge(t, cost int64) error {
	j.advance(t)
	ok := j.fits(cost)
	j.take(t, cost)
	if ok {
		return nil
	}
	switch j.lim.Kind {
	case FixedWindow:
		return fmt.Errorf("%d units admitted in window %d of a limit of %d", j.n, j.win, j.lim.Units)
	case SlidingWindow:
		return fmt.Errorf("%d units admitted in the %dµs before %d, limit %d", j.sum, j.lim.Window, t, j.lim.Units)
	default:
		return fmt.Errorf("bucket of capacity %d over by %d/%d units at %d", j.lim.Units, j.debt-j.lim.Units*j.lim.Window, j.lim.Window, t)
	}
}

// Observed is an admission seen from outside the fleet: it was made at
// some instant of [From, To] (microseconds of true time: when the request
// was sent and when its answer came back), for Cost units.
type Observed struct{ From, To, Cost int64 }

// JudgeObserved judges admissions whose instants are known only to lie
// within their [From, To]: it reports over-admission only when no
// placement of the admissions within their intervals fits the limit, so
// the time a request spends on the wire never counts against the fleet.
//
//   - Fixed windows: an admission may lie in any window its interval
//     touches; the admissions are assigned window by window, the ones
//     whose intervals end first taking the room first, which finds a
//     placement whenever one exists. A cost above 1 may be split across
//     windows for the check's sake, so with costs above 1 it may miss up
//     to cost − 1 units per boundary.
//   - Sliding windows: an error names a window of the rule's length in
//     which the admissions that must lie inside it (their whole interval
//     does) exceed L.
//   - Buckets: an error names an interval [s, e] in which the admissions
//     that must lie inside it exceed C + R·(e − s).
//
// With From == To it judges exactly as Charge does. Sliding windows and
// buckets take time quadratic in the number of admissions.
func JudgeObserved(lim Limit, obs []Observed) error {
	var total int64
	for _, o := range obs {
		if o.To < o.From || o.Cost < 0 {
			return fmt.Errorf("regions: judge: admission [%d, %d] of cost %d is not an interval", o.From, o.To, o.Cost)
		}
		if o.From < -judgeMaxTime || o.To > judgeMaxTime {
			return fmt.Errorf("regions: judge: admission [%d, %d] beyond ±%dµs", o.From, o.To, int64(judgeMaxTime))
		}
		if total += o.Cost; o.Cost > judgeMaxUnits || total > judgeMaxUnits {
			return fmt.Errorf("regions: judge: more than %d units to judge", int64(judgeMaxUnits))
		}
	}
	if lim.Window <= 0 || lim.Units < 0 || lim.Units > judgeMaxUnits {
		return fmt.Errorf("regions: judge: a limit of %d per %dµs cannot be judged (a positive window, 0 to %d units)", lim.Units, lim.Window, int64(judgeMaxUnits))
	}
	switch lim.Kind {
	case FixedWindow:
		return judgeFixed(lim, obs)
	case SlidingWindow:
		return judgeSliding(lim, obs)
	case Bucket:
		return judgeBucket(lim, obs)
	}
	return fmt.Errorf("regions: judge: unknown kind %d", lim.Kind)
}

// JudgeObserved's bounds: times within ±2^60 µs (differences fit an
// int64), at most 2^40 units in all and per limit.
const (
	judgeMaxTime  = 1 << 60
	judgeMaxUnits = 1 << 40
)

// pending is an admission still to be placed: the last window it may lie
// in and the units not placed yet.
type pending struct{ last, left int64 }

type pendingHeap []*pending

func (h pendingHeap) Len() int           { return len(h) }
func (h pendingHeap) Less(a, b int) bool { return h[a].last < h[b].last }
func (h pendingHeap) Swap(a, b int)      { h[a], h[b] = h[b], h[a] }
func (h *pendingHeap) Push(x any)        { *h = append(*h, x.(*pending)) }
func (h *pendingHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func judgeFixed(lim Limit, obs []Observed) error {
	type span struct{ first, last, cost int64 }
	spans := make([]span, 0, len(obs))
	for _, o := range obs {
		if o.Cost > 0 {
			spans = append(spans, span{judgeWindow(o.From, lim.Window), judgeWindow(o.To, lim.Window), o.Cost})
		}
	}
	slices.SortFunc(spans, func(a, b span) int { return cmp.Compare(a.first, b.first) })
	var h pendingHeap
	i := 0
	var w int64
	for i < len(spans) || h.Len() > 0 {
		room := lim.Units
		if h.Len() == 0 {
			// Nothing waits: on to the next admission's first window.
			w = spans[i].first
		} else {
			// Admissions wait, each with a later last window than w. The
			// windows up to the first of those last windows, and before
			// the next admission's first, take L each from the waiting
			// ones in the order their intervals end: placed at once.
			end := h[0].last
			if i < len(spans) {
				end = min(end, spans[i].first-1)
			}
			if k := end - w - 1; k > 0 {
				h.place(satMul(k, lim.Units))
				w += k
			}
			w++
		}
		for i < len(spans) && spans[i].first <= w {
			heap.Push(&h, &pending{spans[i].last, spans[i].cost})
			i++
		}
		h.place(room)
		if h.Len() > 0 && h[0].last <= w {
			var over int64
			for _, p := range h {
				if p.last <= w {
					over += p.left
				}
			}
			return fmt.Errorf("window %d (from %dµs) of a limit of %d: %d units more were admitted that can lie only in it or before it", w, w*lim.Window, lim.Units, over)
		}
	}
	return nil
}

// place places room units on the waiting admissions, those whose
// intervals end first first.
func (h *pendingHeap) place(room int64) {
	for h.Len() > 0 && room > 0 {
		p := (*h)[0]
		take := min(p.left, room)
		p.left -= take
		room -= take
		if p.left == 0 {
			heap.Pop(h)
		}
	}
}

// satMul is a × b for non-negative a and b, at most MaxInt64.
func satMul(a, b int64) int64 {
	if hi, lo := bits.Mul64(uint64(a), uint64(b)); hi != 0 || lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return a * b
}

// mulGreater reports a × b > c × d for non-negative operands, exactly.
func mulGreater(a, b, c, d int64) bool {
	h1, l1 := bits.Mul64(uint64(a), uint64(b))
	h2, l2 := bits.Mul64(uint64(c), uint64(d))
	return h1 > h2 || h1 == h2 && l1 > l2
}

func judgeSliding(lim Limit, obs []Observed) error {
	sorted := slices.Clone(obs)
	slices.SortFunc(sorted, func(a, b Observed) int { return cmp.Compare(a.To, b.To) })
	for i, e := range sorted {
		// The window (e.To − W, e.To]: the admissions whose whole interval
		// lies inside it.
		var sum int64
		for k := i; k >= 0 && sorted[k].To > e.To-lim.Window; k-- {
			if sorted[k].From > e.To-lim.Window {
				sum += sorted[k].Cost
			}
		}
		for k := i + 1; k < len(sorted) && sorted[k].To == e.To; k++ {
			if sorted[k].From > e.To-lim.Window {
				sum += sorted[k].Cost
			}
		}
		if sum > lim.Units {
			return fmt.Errorf("%d units admitted in the %dµs before %d, limit %d", sum, lim.Window, e.To, lim.Units)
		}
	}
	return nil
}

func judgeBucket(lim Limit, obs []Observed) error {
	byTo := slices.Clone(obs)
	slices.SortFunc(byTo, func(a, b Observed) int { return cmp.Compare(a.To, b.To) })
	for _, s := range obs {
		// Every interval starting at s.From: the admissions inside it,
		// in the order their intervals end.
		var sum int64
		for k, e := range byTo {
			if e.From < s.From {
				continue
			}
			sum += e.Cost
			if k+1 < len(byTo) && byTo[k+1].To == e.To {
				continue
			}
			// sum × W > C·W + C·(e − s), that is (sum − C) × W > C × (e − s):
			// exact, in 128 bits.
			if sum > lim.Units && mulGreater(sum-lim.Units, lim.Window, lim.Units, e.To-s.From) {
				return fmt.Errorf("%d units admitted in [%d, %d], bucket of capacity %d refilling in %dµs", sum, s.From, e.To, lim.Units, lim.Window)
			}
		}
	}
	return nil
}

// judgeWindow is the window of length w that t falls in (windows aligned
// to 0).
func judgeWindow(t, w int64) int64 {
	q := t / w
	if t%w != 0 && t < 0 {
		q--
	}
	return q
}
