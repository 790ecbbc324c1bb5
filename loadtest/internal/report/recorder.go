package report

import (
	"fmt"
	"slices"
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
	// Penalty is true when an answer of this class is the penalty ladder's
	// (429 PENALTY, a blocked key at its top): the summary says what that
	// means when a run got any.
	Penalty bool
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

// Recorder counts answers by outcome and records their latencies, for the
// whole run and for each second of it. It is safe for concurrent use. Each
// request is announced with Begin and finished by exactly one of Record,
// Error or Cancel, which keeps the in-flight count.
type Recorder struct {
	outcomes  []Outcome
	counts    []atomic.Int64
	errors    atomic.Int64
	cancelled atomic.Int64
	inflight  atomic.Int64
	start     time.Time

	mu         sync.Mutex
	errSamples map[string]int64 // guarded by mu

	// The second being filled, guarded by mu: its index from the start,
	// answers per outcome, errors and latencies. Once a later second
	// begins, it is appended to seconds, its latencies are merged into
	// hist, and these are reset. Each latency is thus recorded once on the
	// request path; the merge costs ≈ 50 µs once a second.
	cur       int64
	curCounts []int64
	curErrors int64
	curHist   *hdrhistogram.Histogram
	seconds   []Second                // guarded by mu; every second before cur
	hist      *hdrhistogram.Histogram // guarded by mu; latencies of the seconds before cur
	scratch   *hdrhistogram.Histogram // guarded by mu; hist and curHist merged, for reading
}

// Second is what the requests that finished within one second of a run
// did. A request counts in the second it finished in; its latency is
// measured from its send (closed loop) or scheduled time (open loop).
type Second struct {
	// Start is the second's offset from the start of the run; it covers
	// [Start, Start+Span) seconds.
	Start float64
	// Span is the time it covers in seconds: 1, less for the last.
	Span float64
	// Counts holds the answers per outcome, in the order of Outcomes.
	Counts []int64
	// Errors counts requests that got no answer.
	Errors int64
	// P50 and P99 are the percentiles of the second's answers'
	// latencies in microseconds; 0 when there was no answer.
	P50, P99 int64
}

// Answered returns the number of answers of any outcome.
func (s Second) Answered() int64 {
	var n int64
	for _, c := range s.Counts {
		n += c
	}
	return n
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
		curCounts:  make([]int64, len(outcomes)),
		curHist:    hdrhistogram.New(histLowest, histHighest, histDigits),
	}
}

// Outcomes returns the outcomes the Recorder was made with.
func (r *Recorder) Outcomes() []Outcome { return r.outcomes }

// Begin counts a request as in flight.
func (r *Recorder) Begin() { r.inflight.Add(1) }

// Record finishes a request answered with outcome (an index into Outcomes)
// latency after from, its send or scheduled time; from+latency places it
// in its second of the run. Taking the caller's own measurement spares a
// clock read on the request path. An index out of range is a bug in the
// caller and panics.
func (r *Recorder) Record(outcome int, from time.Time, latency time.Duration) {
	r.counts[outcome].Add(1)
	us := max(int64(latency/time.Microsecond), 0)
	us = min(us, histHighest)
	sec := int64((from.Sub(r.start) + latency) / time.Second)
	r.mu.Lock()
	if sec > r.cur {
		r.rollLocked(sec)
	}
	_ = r.curHist.RecordValue(us) // in range by construction
	r.curCounts[outcome]++
	r.mu.Unlock()
	r.inflight.Add(-1)
}

// secondPercentiles are the percentiles kept for each second: p50, p99.
var secondPercentiles = []float64{50, 99}

// rollLocked closes the second being filled, and every empty second after
// it, when sec is later; r.mu must be held. The time of a request is read
// before the lock is taken, so a request that finished just before a
// second ended may find the next one begun: an earlier sec counts in the
// current second.
func (r *Recorder) rollLocked(sec int64) {
	if sec <= r.cur {
		return
	}
	q := r.curHist.ValueAtPercentilesSlice(secondPercentiles)
	r.seconds = append(r.seconds, Second{
		Start:  float64(r.cur),
		Span:   1,
		Counts: r.curCounts,
		Errors: r.curErrors,
		P50:    q[0],
		P99:    q[1],
	})
	for s := r.cur + 1; s < sec; s++ {
		r.seconds = append(r.seconds, Second{Start: float64(s), Span: 1, Counts: make([]int64, len(r.outcomes))})
	}
	r.hist.Merge(r.curHist)
	r.cur = sec
	r.curCounts = make([]int64, len(r.outcomes))
	r.curErrors = 0
	r.curHist.Reset()
}

// latenciesLocked returns a histogram of every latency recorded so far,
// which the caller must only read, and only while it holds r.mu.
func (r *Recorder) latenciesLocked() *hdrhistogram.Histogram {
	if r.curHist.TotalCount() == 0 {
		return r.hist
	}
	if r.scratch == nil {
		r.scratch = hdrhistogram.New(histLowest, histHighest, histDigits)
	}
	r.scratch.Reset()
	r.scratch.Merge(r.hist)
	r.scratch.Merge(r.curHist)
	return r.scratch
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
	sec := int64(time.Since(r.start) / time.Second)
	r.mu.Lock()
	r.rollLocked(sec)
	r.curErrors++
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
	s.P99 = time.Duration(r.latenciesLocked().ValueAtQuantile(99)) * time.Microsecond
	r.mu.Unlock()
	return s
}

// Latency returns the latency distribution of every answer so far.
func (r *Recorder) Latency() Latency {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := r.latenciesLocked()
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

// Seconds returns the run second by second, from its start until now:
// every second that has ended (those without answers included), then the
// current one, cut short at this moment, if any time has passed in it.
// Call it once the run is over, so that the last second ends with the run.
// The returned slice and the Counts in it are not shared with r.
func (r *Recorder) Seconds() []Second {
	elapsed := time.Since(r.start)
	sec := int64(elapsed / time.Second)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rollLocked(sec)
	out := make([]Second, 0, len(r.seconds)+1)
	for _, s := range r.seconds {
		s.Counts = slices.Clone(s.Counts)
		out = append(out, s)
	}
	if span := (elapsed - time.Duration(sec)*time.Second).Seconds(); span > 0 {
		q := r.curHist.ValueAtPercentilesSlice(secondPercentiles)
		out = append(out, Second{
			Start:  float64(sec),
			Span:   span,
			Counts: slices.Clone(r.curCounts),
			Errors: r.curErrors,
			P50:    q[0],
			P99:    q[1],
		})
	}
	return out
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
