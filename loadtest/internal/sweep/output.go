package sweep

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/loadtest/internal/report"
)

// Figure is one chart of a sweep and the file it is written to.
type Figure struct {
	File  string
	Chart report.Chart
}

// keysTitle is the x axis of every chart.
const keysTitle = "distinct keys (log scale)"

// axis returns the x values and names of the key counts.
func axis(keys []int) ([]float64, []string) {
	x := make([]float64, len(keys))
	names := make([]string, len(keys))
	for i, k := range keys {
		x[i], names[i] = float64(k), KeyName(k)
	}
	return x, names
}

// series returns one value per key count from get, NaN where no point has
// that count.
func series[P any](keys []int, points []P, keyOf func(P) int, get func(P) float64) []float64 {
	v := make([]float64, len(keys))
	for i, k := range keys {
		v[i] = nan
		for _, p := range points {
			if keyOf(p) == k {
				v[i] = get(p)
			}
		}
	}
	return v
}

// Figures returns the charts of the parts r measured.
func (r *Result) Figures() []Figure {
	keys := r.Config.Keys
	x, names := axis(keys)
	chart := func(title, y string, s ...report.Series) report.Chart {
		return report.Chart{Title: title, XTitle: keysTitle, YTitle: y, X: x, XNames: names, Series: s}
	}
	var figs []Figure
	if len(r.Gateway) > 0 {
		gw := func(get func(GatewayPoint) float64) []report.Series {
			var out []report.Series
			for _, d := range r.Config.Dists {
				var pts []GatewayPoint
				for _, p := range r.Gateway {
					if p.Dist == d {
						pts = append(pts, p)
					}
				}
				out = append(out, report.Series{Name: d, Values: series(keys, pts, func(p GatewayPoint) int { return p.Keys }, get)})
			}
			return out
		}
		figs = append(figs,
			Figure{"sweep-gateway-cpu.svg", chart("Gateway CPU per decision (guard + fast path + Redis client, in process)", "µs of CPU per decision",
				gw(func(p GatewayPoint) float64 { return p.CPUPerDecision })...)},
			Figure{"sweep-gateway-local.svg", chart("Decisions answered by the fast path (lease or negative cache)", "% of decisions",
				gw(func(p GatewayPoint) float64 { return 100 * p.Local })...)},
			Figure{"sweep-gateway-memory.svg", chart("Gateway heap per tracked key", "bytes of live heap per tracked key",
				gw(func(p GatewayPoint) float64 { return p.BytesPerKey })...)})
	}
	if len(r.Redis) > 0 {
		var s []report.Series
		for _, alg := range Algorithms {
			var pts []RedisPoint
			for _, p := range r.Redis {
				if p.Algorithm == alg {
					pts = append(pts, p)
				}
			}
			if len(pts) > 0 {
				s = append(s, report.Series{Name: string(alg), Values: series(keys, pts, func(p RedisPoint) int { return p.Keys }, func(p RedisPoint) float64 { return p.PerCounter })})
			}
		}
		figs = append(figs, Figure{"sweep-redis-bytes.svg", chart("Redis memory per counter (used_memory growth / counters)", "bytes per counter", s...)})
	}
	if len(r.Aggregator) > 0 {
		var s []report.Series
		for _, e := range r.Config.AggregatorEarlier {
			v := make([]float64, len(e.Values))
			for i, x := range e.Values {
				v[i] = x / 1000
			}
			s = append(s, report.Series{Name: e.Name, Values: v})
		}
		s = append(s, report.Series{Name: "events/s per core", Values: series(keys, r.Aggregator, func(p AggregatorPoint) int { return p.Keys }, func(p AggregatorPoint) float64 { return p.EventsPerCPU / 1000 })})
		figs = append(figs, Figure{"sweep-aggregator.svg", chart("Aggregator events per CPU second (decode, windows, detectors; no Kafka)", "thousand events per CPU second", s...)})
	}
	if len(r.Pebble) > 0 {
		figs = append(figs,
			Figure{"sweep-pebble-bytes.svg", chart("Pebble bytes per usage row", "bytes per row",
				report.Series{Name: "on disk, compacted", Values: series(keys, r.Pebble, func(p PebblePoint) int { return p.Keys }, func(p PebblePoint) float64 { return p.DiskPerRow })},
				report.Series{Name: "written, before compression", Values: series(keys, r.Pebble, func(p PebblePoint) int { return p.Keys }, func(p PebblePoint) float64 { return p.LogicalPerRow })})},
			Figure{"sweep-report.svg", chart("10 000-row usage report by key_id", "ms",
				report.Series{Name: "p99", Values: series(keys, r.Pebble, func(p PebblePoint) int { return p.Keys }, func(p PebblePoint) float64 { return ms(p.ReportP99) })},
				report.Series{Name: "mean", Values: series(keys, r.Pebble, func(p PebblePoint) int { return p.Keys }, func(p PebblePoint) float64 { return ms(p.ReportMean) })})})
	}
	return figs
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// WriteFigures writes every figure into dir, which must exist. A figure
// is written whole or not at all (through a temporary file).
func (r *Result) WriteFigures(dir string) ([]string, error) {
	var files []string
	for _, f := range r.Figures() {
		var b bytes.Buffer
		if err := report.WriteSVG(&b, f.Chart); err != nil {
			return files, err
		}
		path := filepath.Join(dir, f.File)
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, b.Bytes(), 0o644); err != nil {
			return files, fmt.Errorf("sweep: write %s: %w", f.File, err)
		}
		if err := os.Rename(tmp, path); err != nil {
			os.Remove(tmp)
			return files, fmt.Errorf("sweep: write %s: %w", f.File, err)
		}
		files = append(files, path)
	}
	return files, nil
}

// WriteMarkdown writes r as Markdown tables, one per part, headed by when
// it ran, on what and how long it took.
func (r *Result) WriteMarkdown(w io.Writer, commit string) error {
	var b strings.Builder
	host, _ := os.Hostname()
	fmt.Fprintf(&b, "Sweep of %s, commit %s, %d CPUs (%s), %v in all; load average (1 min) at each point in the tables.\n",
		r.Started.UTC().Format("2006-01-02 15:04 MST"), orDash(commit), numCPU(), orDash(host), r.Elapsed.Round(time.Second))
	if len(r.Gateway) > 0 {
		fmt.Fprintf(&b, "\nGateway: %v per point, %d workers, rule %s.\n\n", r.Config.Point, r.Config.Workers, strings.TrimSpace(strings.TrimPrefix(GatewayRule, "rules:\n  - ")))
		b.WriteString("| keys | dist | decisions/s | CPU µs/decision | Redis CPU µs/decision | fast path | EVALSHA/decision | distinct keys drawn | heap | B per tracked key | load |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, p := range r.Gateway {
			fmt.Fprintf(&b, "| %s | %s | %.0f | %.1f | %s | %.1f %% | %.2f | %d | %.1f MB | %.0f (%d tracked) | %.1f |\n",
				KeyName(p.Keys), p.Dist, p.DecisionsPerS, p.CPUPerDecision, num(p.RedisCPU, 1), 100*p.Local, p.EvalSHA, p.Distinct,
				float64(p.Heap)/1e6, p.BytesPerKey, p.Tracked, p.LoadAvg)
		}
	}
	if len(r.Redis) > 0 {
		b.WriteString("\nRedis bytes per counter (used_memory growth / counters; MEMORY USAGE of 200 in brackets):\n\n| keys |")
		var algs []rules.Algorithm
		for _, alg := range Algorithms {
			if slices.ContainsFunc(r.Redis, func(p RedisPoint) bool { return p.Algorithm == alg }) {
				algs = append(algs, alg)
				fmt.Fprintf(&b, " %s |", alg)
			}
		}
		b.WriteString(" load |\n|---|" + strings.Repeat("---|", len(algs)+1) + "\n")
		for _, k := range r.Config.Keys {
			row, load := "| "+KeyName(k)+" |", nan
			measured := false
			for _, alg := range algs {
				cell := " – |"
				for _, p := range r.Redis {
					if p.Keys == k && p.Algorithm == alg {
						cell, load, measured = fmt.Sprintf(" %.1f (%.0f) |", p.PerCounter, p.Usage), p.LoadAvg, true
					}
				}
				row += cell
			}
			if measured {
				fmt.Fprintf(&b, "%s %s |\n", row, num(load, 1))
			}
		}
	}
	if len(r.Aggregator) > 0 {
		fmt.Fprintf(&b, "\nAggregator, %d events per point with the detectors (event i has key i mod keys):\n\n| keys | distinct keys among the events | events per CPU second | CPU | wall | load |\n|---|---|---|---|---|---|\n", r.Config.Events)
		for _, p := range r.Aggregator {
			fmt.Fprintf(&b, "| %s | %d | %.0f | %v | %v | %.1f |\n", KeyName(p.Keys), p.DistinctEvents, p.EventsPerCPU,
				p.CPU.Round(time.Millisecond), p.Wall.Round(time.Millisecond), p.LoadAvg)
		}
	}
	if len(r.Pebble) > 0 {
		fmt.Fprintf(&b, "\nPebble, one minute row per key, compacted; then %d reports of one key's 10 000 rows by key_id:\n\n| keys | disk B/row | written B/row | report mean | report p99 | load |\n|---|---|---|---|---|---|\n", r.Config.Reports)
		for _, p := range r.Pebble {
			fmt.Fprintf(&b, "| %s | %.1f | %.1f | %.1f ms | %.1f ms | %.1f |\n", KeyName(p.Keys), p.DiskPerRow, p.LogicalPerRow, ms(p.ReportMean), ms(p.ReportP99), p.LoadAvg)
		}
	}
	if len(r.Notes) > 0 {
		b.WriteString("\nNot measured:\n\n")
		for _, n := range r.Notes {
			b.WriteString("- " + n + "\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func num(v float64, prec int) string {
	if math.IsNaN(v) {
		return "–"
	}
	return fmt.Sprintf("%.*f", prec, v)
}

func orDash(s string) string {
	if s == "" {
		return "–"
	}
	return s
}
