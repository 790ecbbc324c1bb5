// Package promtext reads a few series from a Prometheus text exposition
// (a gateway's or an aggregator's /metrics): the load scenarios sample
// counters such as tollgate_redis_calls_total while they run, the chaos
// soak reads the fleet's health from them, and end-to-end tests read
// what the processes they start counted. It understands the text
// format's sample lines, `name{labels} value [timestamp]`, and nothing
// more: comments and the types of series are ignored.
package promtext

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// ErrFormat is returned, wrapped, for a sample line that does not parse.
var ErrFormat = errors.New("promtext: unexpected sample line")

// Sample is one sample line: its series name, its labels as written
// between the braces (`a="1",b="2"`, empty without labels) and its value.
type Sample struct {
	Name   string
	Labels string
	Value  float64
}

// Samples is a parsed exposition.
type Samples []Sample

// Parse reads every sample line of r.
func Parse(r io.Reader) (Samples, error) {
	var out Samples
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		var s Sample
		rest := line
		if i := strings.IndexAny(line, "{ "); i >= 0 && line[i] == '{' {
			j := strings.LastIndexByte(line, '}')
			if j < i {
				return nil, fmt.Errorf("%w: %q", ErrFormat, line)
			}
			s.Name, s.Labels, rest = line[:i], line[i+1:j], line[j+1:]
		} else if i >= 0 {
			s.Name, rest = line[:i], line[i:]
		} else {
			return nil, fmt.Errorf("%w: %q", ErrFormat, line)
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return nil, fmt.Errorf("%w: %q", ErrFormat, line)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return nil, fmt.Errorf("%w: %q: %v", ErrFormat, line, err)
		}
		s.Value = v
		out = append(out, s)
	}
	return out, sc.Err()
}

// Sum returns the sum of the samples of series name whose labels contain
// every one of labels (each written `key="value"`).
func (ss Samples) Sum(name string, labels ...string) float64 {
	var sum float64
	for _, s := range ss {
		if s.Name != name || !hasLabels(s.Labels, labels) {
			continue
		}
		sum += s.Value
	}
	return sum
}

// Value returns the value of the sample written series, as the
// exposition writes it: a name alone, or a name with all its labels in
// the exposition's order (`tollgate_rules_version{gateway="gw1"}`); ok is
// false when there is none.
func (ss Samples) Value(series string) (v float64, ok bool) {
	name, labels, _ := strings.Cut(series, "{")
	labels = strings.TrimSuffix(labels, "}")
	for _, s := range ss {
		if s.Name == name && s.Labels == labels {
			return s.Value, true
		}
	}
	return 0, false
}

func hasLabels(have string, want []string) bool {
	for _, w := range want {
		if !strings.Contains(","+have+",", ","+w+",") {
			return false
		}
	}
	return true
}

// Get fetches and parses url (a /metrics endpoint) with client.
func Get(ctx context.Context, client *http.Client, url string) (Samples, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("promtext: %w", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("promtext: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("promtext: GET %s: %s", url, resp.Status)
	}
	return Parse(resp.Body)
}
