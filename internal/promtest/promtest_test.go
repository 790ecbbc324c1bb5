package promtest_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate/tollgate/internal/promtest"
)

func TestSum(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x_total", Help: "x"}, []string{"a", "b"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "y", Help: "y"})
	reg.MustRegister(c, g)
	c.WithLabelValues("1", "p").Add(2)
	c.WithLabelValues("1", "q").Add(3)
	c.WithLabelValues("2", "p").Add(5)
	g.Set(7)
	for _, tc := range []struct {
		name   string
		metric string
		labels []string
		want   float64
	}{
		{"every sample", "x_total", nil, 10},
		{"one label", "x_total", []string{"a", "1"}, 5},
		{"two labels", "x_total", []string{"a", "1", "b", "p"}, 2},
		{"no sample matches", "x_total", []string{"a", "3"}, 0},
		{"a gauge", "y", nil, 7},
		{"no such metric", "z", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := promtest.Sum(t, reg, tc.metric, tc.labels...); got != tc.want {
				t.Fatalf("Sum(%s, %q) = %v, want %v", tc.metric, tc.labels, got, tc.want)
			}
		})
	}
}
