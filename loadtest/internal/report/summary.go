package report

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
)

// Latency is a latency distribution in microseconds. Values are those of
// the HDR histogram (3 significant digits): a percentile is the highest
// value equivalent to the recorded one, so it may read up to 0.1 % high.
type Latency struct {
	Count int64   `json:"count"`
	Min   int64   `json:"min"`
	Mean  float64 `json:"mean"`
	P50   int64   `json:"p50"`
	P90   int64   `json:"p90"`
	P99   int64   `json:"p99"`
	P999  int64   `json:"p99_9"`
	Max   int64   `json:"max"`
}

// GatewayCPU is the CPU time the target process used during the run.
type GatewayCPU struct {
	PID int `json:"pid"`
	// CPUSeconds is user plus system time, at the kernel's clock-tick
	// resolution (10 ms).
	CPUSeconds float64 `json:"cpu_seconds"`
	// MicrosPerDecision is CPUSeconds in microseconds divided by the
	// number of decisions; 0 when there were none.
	MicrosPerDecision float64 `json:"cpu_us_per_decision"`
}

// RedisUsage is what Redis executed during the run, from INFO commandstats
// before and after, summed over every address given.
type RedisUsage struct {
	Addrs []string `json:"addrs"`
	// Commands counts calls of every command except INFO.
	Commands int64 `json:"commands"`
	// EvalSHA counts EVALSHA and EVALSHA_RO calls.
	EvalSHA             int64   `json:"evalsha"`
	CommandsPerDecision float64 `json:"commands_per_decision"`
	EvalSHAPerDecision  float64 `json:"evalsha_per_decision"`
	// ByCommand holds the calls of each command that ran, INFO excluded;
	// subcommands are named as Redis names them ("client|setinfo").
	ByCommand map[string]int64 `json:"by_command,omitempty"`
}

// Summary is the end-of-run report. Its JSON form is loadtest's -json
// output; field names are stable.
type Summary struct {
	Target   string `json:"target"`
	Endpoint string `json:"endpoint"`
	// Mode is "open" (fixed Rate) or "closed" (fixed Workers).
	Mode        string  `json:"mode"`
	Rate        float64 `json:"rate,omitempty"`
	Workers     int     `json:"workers,omitempty"`
	MaxInFlight int     `json:"max_in_flight,omitempty"`
	Keys        int     `json:"keys"`
	Dist        string  `json:"dist"`
	Paths       int     `json:"paths"`
	Cost        int     `json:"cost"`

	// StoppedBy is "requests", "duration" or "interrupted".
	StoppedBy      string  `json:"stopped_by"`
	ElapsedSeconds float64 `json:"elapsed_seconds"`
	// Sent counts requests sent; each is answered, an error or cancelled.
	Sent      int64 `json:"sent"`
	Answered  int64 `json:"answered"`
	Decisions int64 `json:"decisions"`
	Errors    int64 `json:"errors"`
	Cancelled int64 `json:"cancelled"`
	// Missed (open loop) counts requests scheduled before the end but never
	// sent because MaxInFlight requests were outstanding; Waited counts
	// sends that had to wait for a free slot (their latency includes the
	// wait, since it is measured from the scheduled time).
	Missed int64 `json:"missed"`
	Waited int64 `json:"waited"`
	// SendLagUS (open loop) is how late the generator sent requests
	// against their scheduled times, in microseconds: its own share of
	// the latency measured from those times.
	SendLagUS *SendLag `json:"send_lag_us,omitempty"`
	// ThroughputRPS is answers per second of elapsed time.
	ThroughputRPS float64 `json:"throughput_rps"`
	// Statuses counts answers per outcome name.
	Statuses map[string]int64 `json:"statuses"`
	// PenaltyAnswers counts the answers of the penalty ladder (outcomes
	// such as "429 PENALTY"): keys the aggregator penalised for what they
	// did, not a rule's limit.
	PenaltyAnswers int64 `json:"penalty_answers"`
	// PenaltiesExpected: the run provokes the penalty ladder on purpose
	// (a retry storm), so the summary counts its answers without advice.
	PenaltiesExpected bool `json:"-"`
	// LatencyFrom is "scheduled" (open loop: from the scheduled send
	// time, free of coordinated omission) or "sent" (closed loop).
	LatencyFrom string  `json:"latency_from"`
	LatencyUS   Latency `json:"latency_us"`

	ErrorSamples map[string]int64 `json:"error_samples,omitempty"`
	Gateway      *GatewayCPU      `json:"gateway,omitempty"`
	Redis        *RedisUsage      `json:"redis,omitempty"`
	// LoadtestCPUMicrosPerRequest is this process's own CPU per request
	// sent, to judge how much of the machine the generator took.
	LoadtestCPUMicrosPerRequest float64 `json:"loadtest_cpu_us_per_request"`

	// Order lists the outcome names in the target's order, for the text form.
	Order []string `json:"-"`
	// Seconds is the run second by second, for the HTML page's charts;
	// each Counts follows Order.
	Seconds []Second `json:"-"`
	// Charts are more charts for the HTML page ([Summary.AddChart]).
	Charts []Chart `json:"-"`
	// Extra are more lines of the summary, after the run's own (text and
	// HTML alike).
	Extra []Line `json:"-"`
	// Tables are shown on the HTML page after the summary, before the
	// charts.
	Tables []Table `json:"-"`
}

// Line is one more line of a summary: a label and its text.
type Line struct {
	Label, Text string
}

// Table is a table of the HTML page.
type Table struct {
	Title  string
	Header []string
	Rows   [][]string
}

// WriteJSON writes s as indented JSON followed by a newline.
func (s *Summary) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(s); err != nil {
		return fmt.Errorf("report: encode summary: %w", err)
	}
	return nil
}

// WriteText writes s for people, one topic a line.
func (s *Summary) WriteText(w io.Writer) error {
	var b strings.Builder
	for _, l := range s.lines() {
		fmt.Fprintf(&b, "%-11s%s\n", l.label, l.text)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// summaryLine is one topic of the summary: the text form prints one a
// line, the HTML page one a table row, so both show the same figures.
type summaryLine struct {
	label, text string
}

// lines returns the summary's topics in order.
func (s *Summary) lines() []summaryLine {
	var out []summaryLine
	line := func(label, format string, args ...any) {
		out = append(out, summaryLine{label, fmt.Sprintf(format, args...)})
	}
	load := fmt.Sprintf("closed loop, %d workers", s.Workers)
	if s.Mode == "open" {
		load = fmt.Sprintf("open loop, %g req/s, at most %d in flight", s.Rate, s.MaxInFlight)
	}
	line("target", "%s %s (%s)", s.Target, s.Endpoint, load)
	keys := fmt.Sprintf("%d keys %s", s.Keys, s.Dist)
	if s.Keys == 1 || s.Dist == "" {
		keys = plural(s.Keys, "key")
	}
	line("keys", "%s, %s, cost %d", keys, plural(s.Paths, "path"), s.Cost)
	line("elapsed", "%.3fs (stopped by %s)", s.ElapsedSeconds, s.StoppedBy)
	req := fmt.Sprintf("%d sent, %d answered, %d errors, %d cancelled", s.Sent, s.Answered, s.Errors, s.Cancelled)
	if s.Mode == "open" {
		req += fmt.Sprintf(", %d missed, %d waited for a slot", s.Missed, s.Waited)
	}
	line("requests", "%s", req)
	if s.SendLagUS != nil {
		line("send lag", "p50 %dµs, p99 %dµs, max %dµs behind the schedule (included in the latency below)", s.SendLagUS.P50, s.SendLagUS.P99, s.SendLagUS.Max)
	}
	line("throughput", "%.1f answers/s", s.ThroughputRPS)
	var st strings.Builder
	for _, name := range s.order() {
		fmt.Fprintf(&st, "%s=%d ", name, s.Statuses[name])
	}
	fmt.Fprintf(&st, "errors=%d", s.Errors)
	line("statuses", "%s", st.String())
	switch {
	case s.PenaltyAnswers > 0 && s.PenaltiesExpected:
		line("penalty", "%d answers (%.1f %%) came from the penalty ladder (429 PENALTY: level 2, every request refused; 403 PENALTY: level 3,",
			s.PenaltyAnswers, 100*float64(s.PenaltyAnswers)/float64(max(s.Answered, 1)))
		line("", "the key blocked, the connection closed and the client's next ones held 1 s at accept).")
	case s.PenaltyAnswers > 0:
		line("penalty", "%d answers (%.1f %%) came from the penalty ladder, not from a rule's limit: the aggregator penalised keys",
			s.PenaltyAnswers, 100*float64(s.PenaltyAnswers)/float64(max(s.Answered, 1)))
		line("", "that kept sending while told to wait, as a load generator does (429 PENALTY: level 2, every request refused;")
		line("", "403 PENALTY: level 3, the key blocked, the connection closed and the client's next ones held 1 s at accept).")
		line("", "Each answer's message says until when. Load-test with keys the limits fit (configs/rules.yaml's loadtest tier,")
		line("", "sk_load_*), lift a key (DELETE /admin/v1/penalties/{key}) or start the stack with TOLLGATE_PENALTY_MODE=off.")
	}
	l := s.LatencyUS
	line("latency", "p50 %s  p90 %s  p99 %s  p99.9 %s  max %s  (n=%d, from %s time)",
		FormatMicros(l.P50), FormatMicros(l.P90), FormatMicros(l.P99), FormatMicros(l.P999),
		FormatMicros(l.Max), l.Count, s.LatencyFrom)
	if g := s.Gateway; g != nil {
		line("gateway", "pid %d: %.2fs CPU, %.1f µs CPU per decision", g.PID, g.CPUSeconds, g.MicrosPerDecision)
	}
	if r := s.Redis; r != nil {
		line("redis", "%.3f commands per decision (%d), %.3f EVALSHA per decision (%d)",
			r.CommandsPerDecision, r.Commands, r.EvalSHAPerDecision, r.EvalSHA)
	}
	line("loadtest", "%.1f µs CPU per request", s.LoadtestCPUMicrosPerRequest)
	for _, msg := range slices.Sorted(maps.Keys(s.ErrorSamples)) {
		line("error", "%d× %s", s.ErrorSamples[msg], msg)
	}
	for _, l := range s.Extra {
		out = append(out, summaryLine{l.Label, l.Text})
	}
	return out
}

// plural is n and noun, with an s unless n is 1.
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// order returns the outcome names in the target's order, or sorted when
// the summary does not say.
func (s *Summary) order() []string {
	if len(s.Order) > 0 {
		return s.Order
	}
	return slices.Sorted(maps.Keys(s.Statuses))
}

// FormatMicros renders a duration given in microseconds: "850µs", "1.23ms",
// "2.50s".
func FormatMicros(us int64) string {
	switch {
	case us < 1000:
		return fmt.Sprintf("%dµs", us)
	case us < 1_000_000:
		return fmt.Sprintf("%.2fms", float64(us)/1e3)
	default:
		return fmt.Sprintf("%.2fs", float64(us)/1e6)
	}
}
