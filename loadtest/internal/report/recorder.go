// Package report records the answers of a load-test run and renders them:
// counts per outcome, an HDR latency histogram with microsecond resolution,
// a one-line progress report and the end-of-run [Summary] as text or JSON.
package report

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
)

// Outcome is one class of answer a target can give, such as "429" or
// "OVER_LIMIT".
type Outcome struct {
	// Name labels the class in progress lines and summaries.
	Name string
	// Decision is true when an answer of this class is a rate-limit
	// decision; per-decision costs (gateway CPU, Redis commands) divide by
	// the number of such answers.
	Decision bool
}

// Histogram bounds, in microseconds: 1 µs to one hour, 3 significant
// digits. Longer latencies are recorded as one hour.
const (
	histLowest  = 1
	histHighest = int64(time.Hour / time.Microsecond)
	histDigits  = 3
)

// maxErrorSamples bounds the distinct error messages a Recorder keeps;
// errors beyond it are counted but not sampled.
const (
	maxErrorSamples  = 8
	maxErrorTextSize = 200
)

// Recorder counts answers by outcome and records their latencies. It is safe
// for concurrent use. Each request is announced with Begin and finished by
// exactly one of Record, Error or Cancel, which keeps the in-flight count.
type Recorder struct {
	outcomes  []Outcome
	counts    []atomic.Int64
	errors    atomic.Int64
	cancelled atomic.Int64
	inflight  atomic.Int64
	start     time.Time

	mu         sync.Mutex
	hist       *hdrhistogram.Histogram // guarded by mu
	errSamples map[string]int64        // guarded by mu
}

// NewRecorder returns a Recorder for answers classified as outcomes (by
// index, as a target's Do returns them). The slice is not copied; do not
// change it afterwards.
func NewRecorder(outcomes []Outcome) *Recorder {
	return &Recorder{
		outcomes:   outcomes,
		counts:     make([]atomic.Int64, len(outcomes)),
		start:      time.Now(),
		hist:       hdrhistogram.New(histLowest, histHighest, histDigits),
		errSamples: map[string]int64{},
	}
}

// Outcomes returns the outcomes the Recorder was made with.
func (r *Recorder) Outcomes() []Outcome { return r.outcomes }

// Begin counts a request as in flight.
func (r *Recorder) Begin() { r.inflight.Add(1) }

// Record finishes a request answered with outcome (an index into Outcomes)
// after latency. An index out of range is a bug in the caller and panics.
func (r *Recorder) Record(outcome int, latency time.Duration) {
	r.counts[outcome].Add(1)
	us := max(int64(latency/time.Microsecond), 0)
	us = min(us, histHighest)
	r.mu.Lock()
	_ = r.hist.RecordValue(us) // in range by construction
	r.mu.Unlock()
	r.inflight.Add(-1)
}

// Error finishes a request that got no answer (transport failure, timeout).
// Its latency is not recorded. The first few distinct messages are kept as
// samples for the summary.
func (r *Recorder) Error(err error) {
	r.errors.Add(1)
	msg := "<nil>"
	if err != nil {
		msg = err.Error()
	}
	if len(msg) > maxErrorTextSize {
		msg = msg[:maxErrorTextSize] + "…"
	}
	r.mu.Lock()
	if _, ok := r.errSamples[msg]; ok || len(r.errSamples) < maxErrorSamples {
		r.errSamples[msg]++
	}
	r.mu.Unlock()
	r.inflight.Add(-1)
}

// Cancel finishes a request abandoned because the run was interrupted. It
// is neither an answer nor an error.
func (r *Recorder) Cancel() {
	r.cancelled.Add(1)
	r.inflight.Add(-1)
}

// Snapshot is the state of a Recorder at one moment.
type Snapshot struct {
	// At is when the snapshot was taken, Elapsed the time since the
	// Recorder was made.
	At      time.Time
	Elapsed time.Duration
	// Counts holds the answers per outcome, in the order of Outcomes.
	Counts    []int64
	Errors    int64
	Cancelled int64
	InFlight  int64
	// P99 is the 99th percentile latency of every answer so far.
	P99 time.Duration
}

// Answered returns the number of answers of any outcome.
func (s Snapshot) Answered() int64 {
	var n int64
	for _, c := range s.Counts {
		n += c
	}
	return n
}

// Snapshot returns the current counts and the p99 so far.
func (r *Recorder) Snapshot() Snapshot {
	now := time.Now()
	s := Snapshot{
		At:        now,
		Elapsed:   now.Sub(r.start),
		Counts:    make([]int64, len(r.counts)),
		Errors:    r.errors.Load(),
		Cancelled: r.cancelled.Load(),
		InFlight:  r.inflight.Load(),
	}
	for i := range r.counts {
		s.Counts[i] = r.counts[i].Load()
	}
	r.mu.Lock()
	s.P99 = time.Duration(r.hist.ValueAtQuantile(99)) * time.Microsecond
	r.mu.Unlock()
	return s
}

// Latency returns the latency distribution of every answer so far.
func (r *Recorder) Latency() Latency {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := r.hist
	if h.TotalCount() == 0 {
		return Latency{}
	}
	return Latency{
		Count: h.TotalCount(),
		Min:   h.Min(),
		Mean:  h.Mean(),
		P50:   h.ValueAtQuantile(50),
		P90:   h.ValueAtQuantile(90),
		P99:   h.ValueAtQuantile(99),
		P999:  h.ValueAtQuantile(99.9),
		Max:   h.Max(),
	}
}

// ErrorSamples returns a copy of the sampled error messages with their
// counts.
func (r *Recorder) ErrorSamples() map[string]int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.errSamples) == 0 {
		return nil
	}
	out := make(map[string]int64, len(r.errSamples))
	for k, v := range r.errSamples {
		out[k] = v
	}
	return out
}

// Counts returns the answers per outcome name, the summary's statuses.
func (r *Recorder) Counts() map[string]int64 {
	out := make(map[string]int64, len(r.outcomes))
	for i, o := range r.outcomes {
		out[o.Name] = r.counts[i].Load()
	}
	return out
}

// Decisions returns the number of answers whose outcome is a decision.
func (r *Recorder) Decisions() int64 {
	var n int64
	for i, o := range r.outcomes {
		if o.Decision {
			n += r.counts[i].Load()
		}
	}
	return n
}

// ProgressLine renders one progress line from cur, with the rate measured
// since prev (the previous line's snapshot; the zero Snapshot at the start).
func (r *Recorder) ProgressLine(prev, cur Snapshot) string {
	rate := 0.0
	if since := cur.Elapsed - prev.Elapsed; since > 0 {
		rate = float64(cur.Answered()+cur.Errors-prev.Answered()-prev.Errors) / since.Seconds()
	}
	b := fmt.Appendf(nil, "%6.1fs %9.0f req/s ", cur.Elapsed.Seconds(), rate)
	for i, o := range r.outcomes {
		b = fmt.Appendf(b, " %s=%d", o.Name, cur.Counts[i])
	}
	b = fmt.Appendf(b, " errors=%d  p99 %s  in-flight %d", cur.Errors, FormatMicros(int64(cur.P99/time.Microsecond)), cur.InFlight)
	return string(b)
}
