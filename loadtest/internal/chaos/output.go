package chaos

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/tollgate/tollgate/loadtest/internal/chaos/checker"
	"github.com/tollgate/tollgate/loadtest/internal/chaos/history"
	"github.com/tollgate/tollgate/loadtest/internal/report"
)

// LastLine is the line a soak ends with.
func LastLine(c *checker.Result, seed uint64) string {
	held := c.Held()
	return fmt.Sprintf("chaos: %d invariants held, %d violated, %d faults (seed %d)", held, len(c.Verdicts)-held, c.Figures.Faults, seed)
}

// Summary is the JSON form of a soak's outcome.
type Summary struct {
	Seed        uint64             `json:"seed"`
	Duration    float64            `json:"duration_seconds"`
	Rate        float64            `json:"rate"`
	Gateways    int                `json:"gateways"`
	Aggregators int                `json:"aggregators"`
	RedisMode   string             `json:"redis_mode"`
	Kinds       []string           `json:"kinds"`
	Phases      map[string]float64 `json:"phases_seconds"`
	Verdicts    []checker.Verdict  `json:"verdicts"`
	Held        int                `json:"held"`
	Violated    int                `json:"violated"`
	Figures     checker.Figures    `json:"figures"`
	Faults      []history.Fault    `json:"faults"`
	Ops         []history.Op       `json:"operator_changes"`
	Usage       []history.Usage    `json:"usage"`
	Counts      history.Counts     `json:"counts"`
	Missed      int64              `json:"missed"`
	HarnessCPU  float64            `json:"harness_cpu_seconds"`
	WorkDir     string             `json:"work_dir,omitempty"`
	LastLine    string             `json:"last_line"`
}

// Summary returns the outcome for JSON.
func (r *Result) Summary() *Summary {
	h, c := r.History, r.Check
	s := &Summary{Seed: r.Seed, Duration: r.Faults.Seconds(), Rate: h.Meta.Rate, Gateways: h.Meta.Gateways,
		Aggregators: h.Meta.Aggregators, RedisMode: h.Meta.RedisMode, Kinds: h.Meta.Kinds,
		Phases: map[string]float64{"startup": r.Startup.Seconds(), "faults": r.Faults.Seconds(), "heal": r.Heal.Seconds(),
			"settle": r.Settle.Seconds(), "total": r.Total.Seconds()},
		Verdicts: c.Verdicts, Held: c.Held(), Violated: len(c.Verdicts) - c.Held(), Figures: c.Figures,
		Faults: h.Faults, Ops: h.Ops, Usage: h.Usage, Counts: h.Counts, Missed: r.Missed, HarnessCPU: r.HarnessCPU.Seconds(),
		LastLine: LastLine(c, r.Seed)}
	if r.Kept {
		s.WorkDir = r.WorkDir
	}
	return s
}

// WriteJSON writes the summary as indented JSON.
func (r *Result) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r.Summary()); err != nil {
		return fmt.Errorf("chaos: json: %w", err)
	}
	return nil
}

// lines are the summary's topics, for the text and the HTML page.
func (r *Result) lines() []report.Line {
	h, c := r.History, r.Check
	f := c.Figures
	var out []report.Line
	add := func(label, format string, args ...any) {
		out = append(out, report.Line{Label: label, Text: fmt.Sprintf(format, args...)})
	}
	if r.Replay != "" {
		add("seed", "%d (replay: %s)", r.Seed, r.Replay)
	} else {
		add("seed", "%d", r.Seed)
	}
	add("fleet", "%d gateways, %d aggregators, Redis %s, broker and NATS each its own process; every link through a proxy", h.Meta.Gateways, h.Meta.Aggregators, h.Meta.RedisMode)
	add("phases", "start-up %v, faults %v, heal %v, settle %v; total %v", r.Startup.Round(time.Second), r.Faults.Round(time.Second),
		r.Heal.Round(time.Second), r.Settle.Round(time.Second), r.Total.Round(time.Second))
	add("load", "%g requests/s open loop + polite clients; %d requests, %d answered (%d allowed, %d rejected), %d unanswered but sent, %d not sent (too many in flight)",
		h.Meta.Rate, f.Requests, f.Answered, f.Allowed, f.Rejected, f.Indeterminate, r.Missed)
	add("answers", "%.1f answers/s in the fault phase; %.3f%% within the %v deadline (of %d requests to gateways not paused, down or recovering)",
		f.AnswersPerSecond, 100*f.InDeadline, time.Duration(h.Meta.ClientDeadline)*time.Microsecond, f.InDeadlineOf)
	add("degraded", "%d degraded answers; %d outside the schedule's fail-open windows, %d of those during or just after a stall of the machine",
		f.Degraded, f.DegradedOutside, f.DegradedStalled)
	add("machine", "%d stalls of the harness over %v, %.1fs in all (load average at the end %s)", f.Stalls, stallLate, f.StalledSeconds, loadAverage())
	add("faults", "%d applied (%s)", f.Faults, faultCounts(h.Faults))
	add("operator", "%d changes, %d accepted", len(h.Ops), countOps(h.Ops))
	add("losses", "%d events counted missing by the aggregators, %d dropped by the gateways", h.Counts.Missing, h.Counts.Dropped)
	for _, k := range slices.Sorted(maps.Keys(f.Recovery)) {
		rf := f.Recovery[k]
		add("recovery", "%-15s n=%d median %.2fs max %.2fs%s", k, rf.N, rf.Median, rf.Max, failedText(rf.Failed))
	}
	if f.Propagation > 0 {
		add("propagation", "the last operator change reached every gateway within %.3fs", f.Propagation)
	}
	add("harness", "%.1fs CPU", r.HarnessCPU.Seconds())
	if r.Kept {
		add("work dir", "%s (logs of every process)", r.WorkDir)
	}
	for _, v := range c.Verdicts {
		state := "held"
		if !v.Held {
			state = fmt.Sprintf("VIOLATED (%d)", v.Violations)
		}
		add(fmt.Sprintf("invariant %d", v.Number), "%s: %s — %s", state, v.Name, v.Checked)
		for _, s := range v.Samples {
			add("", "  ✗ %s", s)
		}
		for _, n := range v.Notes {
			add("", "  · %s", n)
		}
	}
	return out
}

func failedText(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(", %d not recovered", n)
}

func faultCounts(fs []history.Fault) string {
	n := map[string]int{}
	for _, f := range fs {
		if f.Start != 0 {
			n[f.Kind]++
		}
	}
	var parts []string
	for _, k := range Kinds {
		if n[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, n[k]))
		}
	}
	return strings.Join(parts, ", ")
}

func countOps(ops []history.Op) int {
	n := 0
	for _, o := range ops {
		if o.Succeeded() {
			n++
		}
	}
	return n
}

// WriteText writes the summary for people; its last line is LastLine.
func (r *Result) WriteText(w io.Writer) error {
	var b strings.Builder
	for _, l := range r.lines() {
		fmt.Fprintf(&b, "%-12s %s\n", l.Label, l.Text)
	}
	b.WriteString(LastLine(r.Check, r.Seed) + "\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteHTML writes the loadtest report page of the run: the summary, the
// verdicts, the fault timeline as a table, and charts of the answers, the
// faults in force and the degraded and unanswered requests, second by
// second.
func (r *Result) WriteHTML(w io.Writer) error {
	h, c := r.History, r.Check
	stats := r.stats
	if stats == nil {
		stats = report.NewRecorder(outcomes)
	}
	snap := stats.Snapshot()
	sum := &report.Summary{
		Target: "chaos", Endpoint: fmt.Sprintf("seed %d", r.Seed), Mode: "open", Rate: h.Meta.Rate, MaxInFlight: maxInFlight,
		Keys: len(h.Keys), Dist: "hot and polite keys", Paths: 13, Cost: 1, StoppedBy: "duration",
		ElapsedSeconds: r.Total.Seconds(), Sent: c.Figures.Requests, Answered: snap.Answered(), Decisions: stats.Decisions(),
		Errors: snap.Errors, Missed: r.Missed, Statuses: stats.Counts(), LatencyFrom: "sent", LatencyUS: stats.Latency(),
		ErrorSamples: stats.ErrorSamples(), Seconds: stats.Seconds(), Extra: r.lines(),
	}
	if r.Total > 0 {
		sum.ThroughputRPS = float64(snap.Answered()) / r.Total.Seconds()
	}
	if sum.Sent > 0 {
		sum.LoadtestCPUMicrosPerRequest = float64(r.HarnessCPU.Microseconds()) / float64(sum.Sent)
	}
	for _, o := range outcomes {
		sum.Order = append(sum.Order, o.Name)
	}
	sum.Tables = append(sum.Tables, r.faultTable())
	for _, ch := range r.charts() {
		sum.AddChart(ch)
	}
	return sum.WriteHTML(w)
}

// faultTable lists the faults with their times from the start of the run
// and their recovery.
func (r *Result) faultTable() report.Table {
	h := r.History
	rec := map[int]history.Probe{}
	for _, p := range h.Probes {
		if p.What == "recovery" {
			rec[p.Fault] = p
		}
	}
	t := report.Table{Title: "Faults", Header: []string{"#", "kind", "target", "detail", "start (s)", "healed (s)", "recovered after", "error"}}
	for _, f := range h.Faults {
		start, end := "-", "-"
		if f.Start != 0 {
			start = fmt.Sprintf("%.1f", float64(f.Start-h.Meta.Start)/1e6)
		}
		if f.End != 0 {
			end = fmt.Sprintf("%.1f", float64(f.End-h.Meta.Start)/1e6)
		}
		target := f.Target
		if f.Link != nil {
			target = f.Link.Client + " → " + f.Link.Server
		}
		recovered := ""
		if p, ok := rec[f.ID]; ok {
			if p.OK {
				recovered = fmt.Sprintf("%.2fs", float64(p.Took)/1e6)
			} else {
				recovered = "NOT: " + p.Detail
			}
		}
		t.Rows = append(t.Rows, []string{fmt.Sprint(f.ID), f.Kind, target, f.Detail, start, end, recovered, f.Error})
	}
	return t
}

// charts are the run's own charts, second by second from the start.
func (r *Result) charts() []report.Chart {
	h := r.History
	secs := int(math.Ceil(float64(h.Meta.End-h.Meta.Start) / 1e6))
	if secs < 2 {
		return nil
	}
	x := make([]float64, secs)
	for i := range x {
		x[i] = float64(i + 1)
	}
	classes := []string{"processes", "redis", "links"}
	inForce := make([][]float64, len(classes))
	for i := range inForce {
		inForce[i] = make([]float64, secs)
	}
	for _, f := range h.Faults {
		if f.Start == 0 {
			continue
		}
		end := cmp.Or(f.End, h.Meta.End)
		cl := 0
		switch {
		case f.Link != nil:
			cl = 2
		case strings.HasPrefix(f.Kind, "redis") || strings.HasPrefix(f.Kind, "replica") || strings.HasPrefix(f.Kind, "sentinel"):
			cl = 1
		}
		for s := int((f.Start - h.Meta.Start) / 1e6); s <= int((end-h.Meta.Start)/1e6) && s < secs; s++ {
			if s >= 0 {
				inForce[cl][s]++
			}
		}
	}
	degraded, unanswered := make([]float64, secs), make([]float64, secs)
	for _, a := range h.Answers {
		s := int((a.Sent - h.Meta.Start) / 1e6)
		if s < 0 || s >= secs || a.Cost == 0 {
			continue
		}
		if a.Degraded {
			degraded[s]++
		}
		if a.Status == 0 {
			unanswered[s]++
		}
	}
	var series []report.Series
	for i, c := range classes {
		series = append(series, report.Series{Name: c, Values: inForce[i]})
	}
	return []report.Chart{
		{Title: "Faults in force", YTitle: "faults", X: x, Series: series, Stacked: true},
		{Title: "Degraded and unanswered requests", YTitle: "requests per second (by send time)", X: x,
			Series: []report.Series{{Name: "degraded", Values: degraded}, {Name: "unanswered", Values: unanswered}}},
	}
}
