package gen

import (
	"context"
	"testing"
	"time"
)

// TestPacerSleepsTheLastStretchFinely: a wait far ahead sleeps on the
// timer until the last stretch, which goes to the fine sleep (Go's timers
// wake an idle process in whole milliseconds); a wait already inside the
// stretch never touches the timer; neither returns before its time.
func TestPacerSleepsTheLastStretchFinely(t *testing.T) {
	tests := []struct {
		name  string
		ahead time.Duration
	}{
		{"far ahead", 20 * time.Millisecond},
		{"inside the stretch", 300 * time.Microsecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A loaded machine may wake the timer past the due time, or
			// preempt the test past it before it waits, leaving no stretch
			// to sleep finely: a few tries, one of which must see it.
			finely := false
			for try := 0; try < 5 && !finely; try++ {
				var sleeps []time.Duration
				sleep := fineSleeper()
				if sleep == nil { // no fine sleep here: the pacer spins on it
					sleep = func(time.Duration) {}
				}
				p := &pacer{timer: time.NewTimer(time.Hour), fine: func(d time.Duration) {
					sleeps = append(sleeps, d)
					sleep(d)
				}}
				p.timer.Stop()
				at := time.Now().Add(tt.ahead)
				if !p.wait(t.Context(), at) {
					t.Fatal("wait ended early")
				}
				p.close()
				if now := time.Now(); now.Before(at) {
					t.Fatalf("wait returned %v before its time", at.Sub(now))
				}
				for _, d := range sleeps {
					if d > fineFrom {
						t.Fatalf("fine sleep of %v, want at most %v: the timer sleeps the rest", d, fineFrom)
					}
				}
				finely = len(sleeps) > 0
			}
			if !finely {
				t.Error("no fine sleep in 5 tries: the last stretch was left to the timer")
			}
		})
	}
}

// TestPacerStopsWithTheContext: a wait for a far due time returns false
// once the context ends.
func TestPacerStopsWithTheContext(t *testing.T) {
	p := newPacer()
	defer p.close()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	began := time.Now()
	if p.wait(ctx, began.Add(time.Hour)) {
		t.Fatal("wait returned true before its time")
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Errorf("wait took %v to see its context end", took)
	}
}
