package gen

import (
	"context"
	"time"
)

// pacer waits for an open-loop schedule's due times.
//
// Go's timers wake an otherwise idle process at millisecond granularity on
// Linux: the runtime's network poller sleeps in whole milliseconds, so a
// timer due in 150 µs fires after about a millisecond whenever the process
// has nothing else to run. At a few thousand requests a second most
// requests would leave up to a millisecond late, and since latency counts
// from the due time, that millisecond would be the load generator's own,
// charged to whichever service it measures (on a quiet machine it was half
// of a fast service's p50). The pacer sleeps long waits on a timer and the
// last stretch with the operating system's own sleep (nanosleep, on Linux),
// which wakes within tens of microseconds; the goroutine's thread sleeps
// in it, so a few microseconds of the stretch are its processor's too.
type pacer struct {
	timer *time.Timer
	// fine sleeps d with sub-millisecond precision; nil where the
	// platform has no such sleep.
	fine func(d time.Duration)
}

// fineFrom is how far ahead of a due time the pacer stops trusting the
// timer.
const fineFrom = 2 * time.Millisecond

// newPacer returns a pacer; close it when the schedule ends.
func newPacer() *pacer {
	p := &pacer{timer: time.NewTimer(time.Hour), fine: fineSleeper()}
	p.timer.Stop()
	return p
}

// wait returns true at at, or false if ctx ends first.
func (p *pacer) wait(ctx context.Context, at time.Time) bool {
	for {
		d := time.Until(at)
		if d <= 0 {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		if p.fine != nil {
			if d <= fineFrom {
				p.fine(d)
				continue
			}
			d -= fineFrom / 2 // the timer wakes inside the stretch
		}
		p.timer.Reset(d)
		select {
		case <-p.timer.C:
		case <-ctx.Done():
			p.timer.Stop()
			return false
		}
	}
}

func (p *pacer) close() { p.timer.Stop() }
