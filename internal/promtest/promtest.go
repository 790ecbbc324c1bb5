// Package promtest reads metrics back from a Prometheus registry for
// tests: what a test asserts a component counted.
package promtest

import (
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Sum gathers g and returns the sum of the counter and gauge values of
// the samples of the metric name whose labels include every pair of
// labels (name, value, name, value, ...): with no labels, every sample of
// the metric. A metric g does not have sums to 0. A failed Gather fails
// the test at once.
func Sum(tb testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	tb.Helper()
	if len(labels)%2 != 0 {
		tb.Fatalf("promtest: labels %q are not name, value pairs", labels)
	}
	mfs, err := g.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if hasLabels(m, labels) {
				sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

// hasLabels reports whether m has every (name, value) pair of labels.
func hasLabels(m *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool {
			return l.GetName() == labels[i] && l.GetValue() == labels[i+1]
		}) {
			return false
		}
	}
	return true
}
