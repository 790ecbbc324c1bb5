package gen

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/loadtest/internal/report"
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

// BenchmarkPacer: how late the pacer wakes for due times 150 µs apart
// (6,667 a second), with its fine sleep and with the runtime's timers
// alone. b.N is the number of due times; the figures are per wake-up.
//
//	go test ./loadtest/internal/gen -run '^$' -bench Pacer -benchtime 20000x
func BenchmarkPacer(b *testing.B) {
	const gap = 150 * time.Microsecond
	for _, mode := range []struct {
		name string
		fine func(time.Duration)
	}{{"fine", fineSleeper()}, {"timer", nil}} {
		b.Run(mode.name, func(b *testing.B) {
			if mode.name == "fine" && mode.fine == nil {
				b.Skip("no fine sleep on this platform")
			}
			p := &pacer{timer: time.NewTimer(time.Hour), fine: mode.fine}
			p.timer.Stop()
			defer p.close()
			lags := report.NewLags()
			start := time.Now()
			for i := range b.N {
				at := start.Add(time.Duration(i) * gap)
				if !p.wait(b.Context(), at) {
					b.Fatal("wait ended early")
				}
				lags.Record(time.Since(at))
			}
			s := lags.Summary()
			b.ReportMetric(float64(s.P50), "p50-late-µs")
			b.ReportMetric(float64(s.P99), "p99-late-µs")
		})
	}
}
