package report

import (
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
)

// SendLag is the open-loop generator's lateness against its schedule, in
// microseconds.
type SendLag struct {
	P50 int64 `json:"p50"`
	P99 int64 `json:"p99"`
	Max int64 `json:"max"`
}

// Lags records how late an open-loop schedule sent its requests, in a
// histogram with the latencies' bounds. It is not safe for concurrent
// use: the schedule's one goroutine records.
type Lags struct {
	h *hdrhistogram.Histogram
}

// NewLags returns an empty Lags.
func NewLags() *Lags { return &Lags{h: hdrhistogram.New(histLowest, histHighest, histDigits)} }

// Record adds one request's lag.
func (l *Lags) Record(d time.Duration) {
	_ = l.h.RecordValue(min(max(int64(d/time.Microsecond), 0), histHighest)) // in range by construction
}

// Summary returns the lags' p50, p99 and maximum; zero when none was
// recorded.
func (l *Lags) Summary() SendLag {
	if l.h.TotalCount() == 0 {
		return SendLag{}
	}
	return SendLag{P50: l.h.ValueAtQuantile(50), P99: l.h.ValueAtQuantile(99), Max: l.h.Max()}
}
