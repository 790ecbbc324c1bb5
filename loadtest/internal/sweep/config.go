// Package sweep measures how Tollgate's costs grow with the number of
// distinct keys: at each key count (1 k to 10 M), the gateway's CPU per
// decision, fast-path hit rate and memory per tracked key (an in-process
// guard with its fast path over a real redis-server, uniform and Zipf
// keys), Redis bytes per counter per algorithm, the aggregator's events
// per CPU second with every event a different key, and Pebble bytes per
// usage row with the latency of a 10 000-row report. `loadtest sweep`
// runs it and plots each figure as an SVG chart.
package sweep

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate/tollgate/loadtest/internal/keyspace"
)

// The parts of a sweep.
const (
	Gateway    = "gateway"
	Redis      = "redis"
	Aggregator = "aggregator"
	Pebble     = "pebble"
)

// Parts lists every part, in the order a sweep runs them.
var Parts = []string{Gateway, Redis, Aggregator, Pebble}

// MaxKeys is the largest key count a sweep accepts.
const MaxKeys = 100_000_000

// ErrConfig is returned (wrapped, joined) for a Config that is not valid.
var ErrConfig = errors.New("sweep: bad configuration")

// Config is what a sweep measures.
type Config struct {
	// What holds the parts to run (Gateway, Redis, Aggregator, Pebble).
	What []string
	// Keys holds the key counts, ascending.
	Keys []int
	// Dists are the gateway's key distributions (keyspace.Uniform,
	// keyspace.Zipf); ZipfS the Zipf exponent.
	Dists []string
	ZipfS float64
	// Point is how long each gateway point runs; Workers how many
	// goroutines check at once.
	Point   time.Duration
	Workers int
	// Events is how many decision events each aggregator point counts.
	Events int
	// Reports is how many 10 000-row reports each Pebble point times.
	Reports int
	// AllAlgorithmsUpTo: Redis points with more keys measure the token
	// bucket only (the keyspace's share of a counter is the same for
	// every algorithm; 10 M counters of five algorithms would take many
	// minutes and gigabytes). PebbleUpTo: Pebble points with more keys
	// are not run.
	AllAlgorithmsUpTo, PebbleUpTo int
	// Seed fixes the key draws.
	Seed uint64
	// AggregatorEarlier holds aggregator figures measured before (an
	// earlier build's), drawn in the aggregator's chart beside this
	// sweep's, so that the chart keeps what it is compared with.
	AggregatorEarlier []Earlier
}

// Earlier is a series measured before: Values holds one figure per key
// count of the sweep, NaN where none was measured.
type Earlier struct {
	Name   string
	Values []float64
}

// DefaultConfig is the sweep `make sweep` runs.
func DefaultConfig() Config {
	return Config{
		What:              slices.Clone(Parts),
		Keys:              []int{1_000, 100_000, 1_000_000, 10_000_000},
		Dists:             []string{keyspace.Uniform, keyspace.Zipf},
		ZipfS:             keyspace.DefaultZipfS,
		Point:             4 * time.Second,
		Workers:           16,
		Events:            1_000_000,
		Reports:           20,
		AllAlgorithmsUpTo: 1_000_000,
		PebbleUpTo:        1_000_000,
		Seed:              1,
	}
}

// Runs reports whether part is among c.What.
func (c Config) Runs(part string) bool { return slices.Contains(c.What, part) }

// Validate reports every problem with c at once.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrConfig}, args...)...))
	}
	if len(c.What) == 0 {
		bad("nothing to measure: -what names none of %s", strings.Join(Parts, ", "))
	}
	for _, w := range c.What {
		if !slices.Contains(Parts, w) {
			bad("-what %q: want %s or all", w, strings.Join(Parts, ", "))
		}
	}
	if len(c.Keys) == 0 {
		bad("no key counts")
	}
	for i, k := range c.Keys {
		if k < 1 || k > MaxKeys {
			bad("key count %d: want 1 to %d", k, MaxKeys)
		}
		if i > 0 && k <= c.Keys[i-1] {
			bad("key counts must ascend: %d after %d", k, c.Keys[i-1])
		}
	}
	if c.Runs(Gateway) {
		if len(c.Dists) == 0 {
			bad("no key distribution")
		}
		for _, d := range c.Dists {
			if d != keyspace.Uniform && d != keyspace.Zipf {
				bad("-dist %q: want %s or %s", d, keyspace.Uniform, keyspace.Zipf)
			}
		}
		if slices.Contains(c.Dists, keyspace.Zipf) && !(c.ZipfS > 1) {
			bad("-zipf-s %v: want > 1", c.ZipfS)
		}
		if c.Point <= 0 || c.Point > 10*time.Minute {
			bad("-point %v: want > 0 and ≤ 10m", c.Point)
		}
		if c.Workers < 1 || c.Workers > 1024 {
			bad("-workers %d: want 1 to 1024", c.Workers)
		}
	}
	if c.Runs(Aggregator) && (c.Events < 1 || c.Events > 100_000_000) {
		bad("-events %d: want 1 to 100000000", c.Events)
	}
	for _, e := range c.AggregatorEarlier {
		if len(e.Values) != len(c.Keys) {
			bad("-aggregator-earlier %q: %d values for %d key counts", e.Name, len(e.Values), len(c.Keys))
		}
	}
	if c.Runs(Pebble) && (c.Reports < 1 || c.Reports > 10_000) {
		bad("-reports %d: want 1 to 10000", c.Reports)
	}
	return errors.Join(errs...)
}

// ParseWhat parses -what: a comma-separated list of parts, or "all".
func ParseWhat(s string) ([]string, error) {
	var out []string
	for part := range strings.SplitSeq(s, ",") {
		part = strings.ToLower(strings.TrimSpace(part))
		switch {
		case part == "":
		case part == "all":
			for _, p := range Parts {
				if !slices.Contains(out, p) {
					out = append(out, p)
				}
			}
		case slices.Contains(Parts, part):
			if !slices.Contains(out, part) {
				out = append(out, part)
			}
		default:
			return nil, fmt.Errorf("%w: -what %q: want %s or all", ErrConfig, part, strings.Join(Parts, ", "))
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: -what %q names nothing to measure", ErrConfig, s)
	}
	// Run in the order of Parts whatever the order given.
	slices.SortFunc(out, func(a, b string) int { return slices.Index(Parts, a) - slices.Index(Parts, b) })
	return out, nil
}

// ParseKeys parses a comma-separated list of key counts, each a whole
// number with an optional k (thousand) or m (million) suffix: 1k, 100k,
// 1m, 10m, 2500.
func ParseKeys(s string) ([]int, error) {
	var out []int
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		n, err := ParseCount(part)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no key counts in %q", ErrConfig, s)
	}
	return out, nil
}

// ParseCount parses one count: digits with an optional k or m suffix.
func ParseCount(s string) (int, error) {
	mult := 1
	num := strings.ToLower(s)
	switch {
	case strings.HasSuffix(num, "k"):
		mult, num = 1_000, strings.TrimSuffix(num, "k")
	case strings.HasSuffix(num, "m"):
		mult, num = 1_000_000, strings.TrimSuffix(num, "m")
	}
	n, err := strconv.ParseUint(num, 10, 32)
	if err != nil || n == 0 || n*uint64(mult) > MaxKeys {
		return 0, fmt.Errorf("%w: count %q: want a whole number from 1 to %d, with an optional k or m (1k, 100k, 1m, 10m)", ErrConfig, s, MaxKeys)
	}
	return int(n) * mult, nil
}

// ParseEarlier parses one -aggregator-earlier: NAME=V,V,… with a figure
// (events per CPU second) per key count of the sweep, "-" for a count not
// measured.
func ParseEarlier(s string) (Earlier, error) {
	name, list, ok := strings.Cut(s, "=")
	name = strings.TrimSpace(name)
	if !ok || name == "" || strings.TrimSpace(list) == "" {
		return Earlier{}, fmt.Errorf("%w: -aggregator-earlier %q: want NAME=V,V,… (one figure per key count, - for none)", ErrConfig, s)
	}
	var e Earlier
	e.Name = name
	for part := range strings.SplitSeq(list, ",") {
		part = strings.TrimSpace(part)
		if part == "-" {
			e.Values = append(e.Values, nan)
			continue
		}
		v, err := strconv.ParseFloat(part, 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return Earlier{}, fmt.Errorf("%w: -aggregator-earlier %q: value %q: want a number ≥ 0 or -", ErrConfig, name, part)
		}
		e.Values = append(e.Values, v)
	}
	return e, nil
}

// KeyName labels a key count: 1k, 100k, 1M, 10M, 2500.
func KeyName(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return strconv.Itoa(n/1_000_000) + "M"
	case n >= 1_000 && n%1_000 == 0:
		return strconv.Itoa(n/1_000) + "k"
	}
	return strconv.Itoa(n)
}

// ParseDists parses -dist: a comma-separated list of distributions.
func ParseDists(s string) ([]string, error) {
	var out []string
	for part := range strings.SplitSeq(s, ",") {
		part = strings.ToLower(strings.TrimSpace(part))
		switch part {
		case "":
		case keyspace.Uniform, keyspace.Zipf:
			if !slices.Contains(out, part) {
				out = append(out, part)
			}
		default:
			return nil, fmt.Errorf("%w: -dist %q: want %s or %s", ErrConfig, part, keyspace.Uniform, keyspace.Zipf)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: -dist %q names no distribution", ErrConfig, s)
	}
	return out, nil
}

// nan is a point not measured: a gap in a chart, "–" in a table.
var nan = math.NaN()
