package regionsim

import (
	"fmt"

	"github.com/tollgate/tollgate/internal/regions"
)

// limiter is one region alone holding the whole limit, in true time: the
// judge every fleet admission is charged to (charge), and the reference
// that decides each request itself (admit) to count false rejections.
type limiter struct {
	lim regions.Limit
	// fixed window: the current true window and its count.
	win, n int64
	// sliding window: admissions in the trailing window, oldest first.
	log []entry
	sum int64
	// bucket: capacity in use × Window, as of at.
	debt, at int64
}

type entry struct{ t, cost int64 }

func newLimiter(lim regions.Limit) *limiter { return &limiter{lim: lim, win: -1 << 62} }

// advance brings the limiter to true time t.
func (l *limiter) advance(t int64) {
	w := l.lim.Window
	switch l.lim.Kind {
	case regions.FixedWindow:
		if j := floorDiv(t, w); j != l.win {
			l.win, l.n = j, 0
		}
	case regions.SlidingWindow:
		i := 0
		for i < len(l.log) && l.log[i].t <= t-w {
			l.sum -= l.log[i].cost
			i++
		}
		l.log = l.log[i:]
	case regions.Bucket:
		if t > l.at {
			if t-l.at >= w {
				l.debt = 0
			} else {
				l.debt = max(l.debt-l.lim.Units*(t-l.at), 0)
			}
			l.at = t
		}
	}
}

// fits reports whether cost fits at t (after advance).
func (l *limiter) fits(cost int64) bool {
	switch l.lim.Kind {
	case regions.FixedWindow:
		return l.n+cost <= l.lim.Units
	case regions.SlidingWindow:
		return l.sum+cost <= l.lim.Units
	default:
		return l.debt+cost*l.lim.Window <= l.lim.Units*l.lim.Window
	}
}

func (l *limiter) take(t, cost int64) {
	switch l.lim.Kind {
	case regions.FixedWindow:
		l.n += cost
	case regions.SlidingWindow:
		l.log = append(l.log, entry{t, cost})
		l.sum += cost
	default:
		l.debt += cost * l.lim.Window
	}
}

// admit decides a request as one region alone would, and charges it when
// admitted.
func (l *limiter) admit(t, cost int64) bool {
	l.advance(t)
	if !l.fits(cost) {
		return false
	}
	l.take(t, cost)
	return true
}

// charge takes an admission the fleet made; an error when one region
// alone with the whole limit could not have made it.
func (l *limiter) charge(t, cost int64) error {
	l.advance(t)
	ok := l.fits(cost)
	l.take(t, cost)
	if ok {
		return nil
	}
	switch l.lim.Kind {
	case regions.FixedWindow:
		return fmt.Errorf("%d units admitted in window %d of a limit of %d", l.n, l.win, l.lim.Units)
	case regions.SlidingWindow:
		return fmt.Errorf("%d units admitted in the %dµs before %d, limit %d", l.sum, l.lim.Window, t, l.lim.Units)
	default:
		return fmt.Errorf("bucket of capacity %d over by %d/%d units at %d", l.lim.Units, l.debt-l.lim.Units*l.lim.Window, l.lim.Window, t)
	}
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}
