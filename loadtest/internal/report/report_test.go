package report

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

var testOutcomes = []Outcome{{Name: "2xx", Decision: true}, {Name: "429", Decision: true}, {Name: "5xx"}}

func TestRecorderConcurrent(t *testing.T) {
	t.Parallel()
	r := NewRecorder(testOutcomes)
	const goroutines, each = 8, 1000
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				r.Begin()
				switch i % 4 {
				case 0, 1:
					r.Record(0, time.Now(), time.Duration(i)*time.Microsecond)
				case 2:
					r.Record(g%3, time.Now(), time.Millisecond)
				default:
					r.Error(fmt.Errorf("boom %d", i%40))
				}
			}
		})
	}
	wg.Wait()
	s := r.Snapshot()
	if s.InFlight != 0 {
		t.Errorf("in flight = %d after every request finished", s.InFlight)
	}
	if got, want := s.Answered(), int64(goroutines*each*3/4); got != want {
		t.Errorf("answered = %d, want %d", got, want)
	}
	if got, want := s.Errors, int64(goroutines*each/4); got != want {
		t.Errorf("errors = %d, want %d", got, want)
	}
	if got := r.Latency().Count; got != s.Answered() {
		t.Errorf("histogram holds %d values, want one per answer (%d)", got, s.Answered())
	}
	samples := r.ErrorSamples()
	if len(samples) != maxErrorSamples {
		t.Errorf("%d error samples, want the cap %d", len(samples), maxErrorSamples)
	}
	// g%3 == 2 (goroutines 2 and 5) recorded 5xx, which is no decision.
	if got, want := r.Decisions(), s.Answered()-2*each/4; got != want {
		t.Errorf("decisions = %d, want %d", got, want)
	}
}

func TestLatencyPercentiles(t *testing.T) {
	t.Parallel()
	r := NewRecorder(testOutcomes)
	for us := 1; us <= 10_000; us++ {
		r.Begin()
		r.Record(0, time.Now(), time.Duration(us)*time.Microsecond)
	}
	r.Begin()
	r.Record(0, time.Now(), 2*time.Hour) // clamped to the histogram's top
	l := r.Latency()
	near := func(name string, got, want int64) {
		t.Helper()
		if d := got - want; d < -want/500 || d > want/500 {
			t.Errorf("%s = %dµs, want %dµs ± 0.2%%", name, got, want)
		}
	}
	near("p50", l.P50, 5000)
	near("p90", l.P90, 9000)
	near("p99", l.P99, 9900)
	near("p99.9", l.P999, 9990)
	near("max", l.Max, histHighest)
	if l.Count != 10_001 {
		t.Errorf("count = %d", l.Count)
	}
	if got := NewRecorder(testOutcomes).Latency(); got != (Latency{}) {
		t.Errorf("empty recorder latency = %+v, want zero", got)
	}
}

func TestErrorMessagesTruncated(t *testing.T) {
	t.Parallel()
	r := NewRecorder(testOutcomes)
	r.Begin()
	r.Error(errors.New(strings.Repeat("x", 1000)))
	for msg := range r.ErrorSamples() {
		if len(msg) > maxErrorTextSize+len("…") {
			t.Errorf("sample of %d bytes kept", len(msg))
		}
	}
}

func TestProgressLine(t *testing.T) {
	t.Parallel()
	r := NewRecorder(testOutcomes)
	prev := Snapshot{Counts: make([]int64, 3)}
	cur := Snapshot{Elapsed: 2 * time.Second, Counts: []int64{150, 40, 10}, Errors: 0, InFlight: 3, P99: 1500 * time.Microsecond}
	line := r.ProgressLine(prev, cur)
	for _, want := range []string{"2.0s", "100 req/s", "2xx=150", "429=40", "5xx=10", "errors=0", "p99 1.50ms", "in-flight 3"} {
		if !strings.Contains(line, want) {
			t.Errorf("progress line %q lacks %q", line, want)
		}
	}
}

func TestFormatMicros(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		us   int64
		want string
	}{{0, "0µs"}, {999, "999µs"}, {1000, "1.00ms"}, {1234, "1.23ms"}, {2_500_000, "2.50s"}} {
		if got := FormatMicros(tt.us); got != tt.want {
			t.Errorf("FormatMicros(%d) = %q, want %q", tt.us, got, tt.want)
		}
	}
}

// TestSummaryJSONSchema pins the JSON field names: scripts and docs read
// them.
func TestSummaryJSONSchema(t *testing.T) {
	t.Parallel()
	s := &Summary{
		Target: "check", Endpoint: "http://x/v1/check", Mode: "open", Rate: 100, MaxInFlight: 10,
		Statuses:     map[string]int64{"2xx": 1},
		ErrorSamples: map[string]int64{"e": 1},
		Gateway:      &GatewayCPU{PID: 1},
		Redis:        &RedisUsage{Addrs: []string{"a:1"}, ByCommand: map[string]int64{"evalsha": 1}},
		Order:        []string{"2xx"},
	}
	var buf bytes.Buffer
	if err := s.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"target", "endpoint", "mode", "rate", "max_in_flight", "keys", "dist", "paths", "cost",
		"stopped_by", "elapsed_seconds", "sent", "answered", "decisions", "errors", "cancelled",
		"missed", "waited", "throughput_rps", "statuses", "penalty_answers", "latency_from", "latency_us",
		"error_samples", "gateway", "redis", "loadtest_cpu_us_per_request",
	}
	if got := slices.Sorted(maps.Keys(m)); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
		t.Errorf("summary keys:\n got %v\nwant %v", got, slices.Sorted(slices.Values(want)))
	}
	var lat map[string]json.RawMessage
	if err := json.Unmarshal(m["latency_us"], &lat); err != nil {
		t.Fatal(err)
	}
	if got, want := slices.Sorted(maps.Keys(lat)), []string{"count", "max", "mean", "min", "p50", "p90", "p99", "p99_9"}; !slices.Equal(got, want) {
		t.Errorf("latency keys %v, want %v", got, want)
	}
	var gw, rd map[string]json.RawMessage
	_ = json.Unmarshal(m["gateway"], &gw)
	_ = json.Unmarshal(m["redis"], &rd)
	if got, want := slices.Sorted(maps.Keys(gw)), []string{"cpu_seconds", "cpu_us_per_decision", "pid"}; !slices.Equal(got, want) {
		t.Errorf("gateway keys %v, want %v", got, want)
	}
	if got, want := slices.Sorted(maps.Keys(rd)), []string{"addrs", "by_command", "commands", "commands_per_decision", "evalsha", "evalsha_per_decision"}; !slices.Equal(got, want) {
		t.Errorf("redis keys %v, want %v", got, want)
	}

	var text bytes.Buffer
	if err := s.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"open loop, 100 req/s", "p99.9", "2xx=1", "gateway", "redis", "1× e"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text summary lacks %q:\n%s", want, text.String())
		}
	}
}

// TestSeconds places answers and errors in the seconds they finished in,
// with empty seconds in between and a last second cut short at the end.
func TestSeconds(t *testing.T) {
	t.Parallel()
	r := NewRecorder(testOutcomes)
	// The run started 3.5 s ago; errors count in the second they happen.
	r.start = time.Now().Add(-3500 * time.Millisecond)
	at := func(d time.Duration) time.Time { return r.start.Add(d) }
	for range 3 {
		r.Begin()
		r.Record(0, at(0), 100*time.Millisecond) // second 0
	}
	r.Begin()
	r.Record(1, at(900*time.Millisecond), 300*time.Millisecond) // sent in 0, answered in 1
	r.Begin()
	r.Record(2, at(1500*time.Millisecond), 2*time.Millisecond) // second 1
	r.Begin()
	r.Error(errors.New("refused")) // now: second 3
	r.Begin()
	r.Record(1, at(3100*time.Millisecond), 10*time.Millisecond) // second 3
	r.Begin()
	r.Record(0, at(-time.Second), 500*time.Millisecond) // before the start: counts in the current second

	got := r.Seconds()
	if len(got) != 4 {
		t.Fatalf("%d seconds, want 4: %+v", len(got), got)
	}
	want := []struct {
		counts   []int64
		errors   int64
		p50, p99 int64
	}{
		{[]int64{3, 0, 0}, 0, 100_000, 100_000},
		{[]int64{0, 1, 1}, 0, 2_000, 300_000},
		{[]int64{0, 0, 0}, 0, 0, 0},
		{[]int64{1, 1, 0}, 1, 10_000, 500_000},
	}
	near := func(got, want int64) bool { d := got - want; return d >= -want/500 && d <= want/500 }
	for i, w := range want {
		s := got[i]
		if s.Start != float64(i) || !slices.Equal(s.Counts, w.counts) || s.Errors != w.errors ||
			!near(s.P50, w.p50) || !near(s.P99, w.p99) {
			t.Errorf("second %d = %+v, want start %d, counts %v, errors %d, p50 %dµs, p99 %dµs",
				i, s, i, w.counts, w.errors, w.p50, w.p99)
		}
	}
	for i, s := range got[:3] {
		if s.Span != 1 {
			t.Errorf("second %d spans %vs, want 1", i, s.Span)
		}
	}
	if last := got[3].Span; last < 0.5 || last >= 1 {
		t.Errorf("last second spans %vs, want the 0.5 s it has run (a little more)", last)
	}
	// The seconds add up to the whole run.
	if l := r.Latency(); l.Count != 7 || !near(l.Max, 500_000) {
		t.Errorf("whole-run latency %+v, want 7 answers, max 500ms", l)
	}
	got[0].Counts[0] = 99
	if again := r.Seconds(); again[0].Counts[0] != 3 {
		t.Error("Seconds shares its Counts with the recorder")
	}
}

// TestLags: the send lags' p50, p99 and maximum, in any order, within
// the histogram's precision (3 significant digits); none recorded is zero.
func TestLags(t *testing.T) {
	l := NewLags()
	for i := 100; i >= 1; i-- {
		l.Record(time.Duration(i) * time.Millisecond)
	}
	got, want := l.Summary(), SendLag{P50: 50_000, P99: 99_000, Max: 100_000}
	near := func(g, w int64) bool { return g >= w && g-w <= w/1000 }
	if !near(got.P50, want.P50) || !near(got.P99, want.P99) || !near(got.Max, want.Max) {
		t.Errorf("lags of 1..100 ms: %+v µs, want %+v within 0.1 %%", got, want)
	}
	if got := NewLags().Summary(); got != (SendLag{}) {
		t.Errorf("no lags: %+v, want zero", got)
	}
}
