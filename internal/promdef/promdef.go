// Package promdef declares Prometheus collectors in one call each: a
// metric's name and help text, then what it varies by (labels, buckets
// or the function it reads). Tollgate's metrics use no namespace,
// subsystem or constant labels on these, so the options structs of
// client_golang would only repeat Name and Help at every declaration.
// Registering stays with the caller.
package promdef

import "github.com/prometheus/client_golang/prometheus"

// Counter declares a counter.
func Counter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
}

// CounterVec declares a counter with labels.
func CounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

// CounterFunc declares a counter whose value f reads at each scrape.
func CounterFunc(name, help string, f func() float64) prometheus.CounterFunc {
	return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, f)
}

// CounterFuncs declares one counter per value of label, all named name:
// the i-th has label=values[i] and reads its value with read(i) at each
// scrape. It suits a family whose label values are fixed and whose counts
// live elsewhere.
func CounterFuncs(name, help, label string, values []string, read func(i int) func() float64) []prometheus.Collector {
	out := make([]prometheus.Collector, len(values))
	for i, v := range values {
		out[i] = prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: prometheus.Labels{label: v}}, read(i))
	}
	return out
}

// Gauge declares a gauge.
func Gauge(name, help string) prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
}

// GaugeVec declares a gauge with labels.
func GaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
}

// GaugeFunc declares a gauge whose value f reads at each scrape.
func GaugeFunc(name, help string, f func() float64) prometheus.GaugeFunc {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
}

// Histogram declares a histogram with the given bucket upper bounds.
func Histogram(name, help string, buckets []float64) prometheus.Histogram {
	return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
}

// HistogramVec declares a histogram with labels and the given bucket
// upper bounds.
func HistogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
}
