package chaos

import (
	"context"
	"os"
	"strings"
	"time"

	"github.com/tollgate/tollgate/internal/service"
	"github.com/tollgate/tollgate/loadtest/internal/chaos/history"
)

// The stall detector: a tick every stallTick; a tick later than
// stallLate means the machine kept the harness from running, and very
// likely every other process too (two cores shared by the whole fleet, the
// load and whatever else runs there).
const (
	stallTick = 10 * time.Millisecond
	stallLate = 25 * time.Millisecond
	// stallTail is how long after a stall a degraded answer is still
	// explained by it: the breaker stays open 500 ms, then probes.
	stallTail = 1500 * time.Millisecond
)

// detectStalls records the machine's stalls until ctx is done.
func (r *recorder) detectStalls(ctx context.Context) {
	last := time.Now()
	// The time the goroutine runs, not the tick's: a stall delays the
	// former.
	service.Every(ctx, stallTick, func(time.Time) {
		n := time.Now()
		if late := n.Sub(last) - stallTick; late > stallLate {
			r.stall(history.Stall{Start: last.Add(stallTick).UnixMicro(), End: n.UnixMicro()})
		}
		last = n
	})
}

func (r *recorder) stall(s history.Stall) {
	r.mu.Lock()
	r.h.Stalls = append(r.h.Stalls, s)
	r.mu.Unlock()
}

// loadAverage is the machine's 1-minute load average, or "?".
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}
