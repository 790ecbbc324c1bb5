package guard

import (
	"testing"
	"time"
)

// TestSampledLog: the first event is logged, the next ones within the
// interval only counted, and the line that comes once the interval has
// passed carries every event since the last line.
func TestSampledLog(t *testing.T) {
	var l sampledLog
	steps := []struct {
		every   time.Duration
		wantN   int64
		wantDue bool
	}{
		{time.Hour, 1, true}, // the first line is due at once
		{time.Hour, 1, false},
		{time.Hour, 2, false},
		{time.Hour, 3, false},
		{0, 4, true}, // the interval has passed: the three counted and this one
		{time.Hour, 1, false},
	}
	for i, st := range steps {
		if n, due := l.event(st.every); n != st.wantN || due != st.wantDue {
			t.Fatalf("event %d: (%d, %v), want (%d, %v)", i, n, due, st.wantN, st.wantDue)
		}
	}
}
