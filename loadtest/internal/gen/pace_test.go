//go:build linux

package gen

import (
	"context"
	"slices"
	"testing"
	"time"
)

// TestPacerWakesFinely: due times a quarter of a millisecond apart are
// met within a fraction of that. With the runtime's timers alone an idle
// process wakes in whole milliseconds, about 0.75 ms late here.
func TestPacerWakesFinely(t *testing.T) {
	p := newPacer()
	defer p.close()
	const n, gap = 400, 250 * time.Microsecond
	lags := make([]time.Duration, 0, n)
	start := time.Now().Add(5 * time.Millisecond) // the first wait goes through the timer
	for i := range n {
		at := start.Add(time.Duration(i) * gap)
		if !p.wait(t.Context(), at) {
			t.Fatal("wait ended early")
		}
		lags = append(lags, time.Since(at))
	}
	slices.Sort(lags)
	if med := lags[n/2]; med > 400*time.Microsecond {
		t.Errorf("median lag %v over %d waits %v apart (p90 %v), want well under a millisecond", med, n, gap, lags[n*9/10])
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
