package promdef

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestSameAsOptions: each helper declares the collector client_golang's
// options struct would, with the same name, help, labels and type.
func TestSameAsOptions(t *testing.T) {
	f := func() float64 { return 1 }
	buckets := []float64{0.1, 1}
	cases := []struct {
		name      string
		got, want prometheus.Collector
	}{
		{"counter", Counter("c_total", "help c"), prometheus.NewCounter(prometheus.CounterOpts{Name: "c_total", Help: "help c"})},
		{"counter vec", CounterVec("cv_total", "help cv", "a", "b"),
			prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cv_total", Help: "help cv"}, []string{"a", "b"})},
		{"counter func", CounterFunc("cf_total", "help cf", f), prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "cf_total", Help: "help cf"}, f)},
		{"gauge", Gauge("g", "help g"), prometheus.NewGauge(prometheus.GaugeOpts{Name: "g", Help: "help g"})},
		{"gauge vec", GaugeVec("gv", "help gv", "a"), prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gv", Help: "help gv"}, []string{"a"})},
		{"gauge func", GaugeFunc("gf", "help gf", f), prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "gf", Help: "help gf"}, f)},
		{"histogram", Histogram("h_seconds", "help h", buckets),
			prometheus.NewHistogram(prometheus.HistogramOpts{Name: "h_seconds", Help: "help h", Buckets: buckets})},
		{"histogram vec", HistogramVec("hv_seconds", "help hv", buckets, "a"),
			prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "hv_seconds", Help: "help hv", Buckets: buckets}, []string{"a"})},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got, want := descs(tc.got), descs(tc.want); got != want {
				t.Errorf("desc %s, want %s", got, want)
			}
			got, want := prometheus.NewPedanticRegistry(), prometheus.NewPedanticRegistry()
			got.MustRegister(tc.got)
			want.MustRegister(tc.want)
			g, err := got.Gather()
			if err != nil {
				t.Fatal(err)
			}
			w, err := want.Gather()
			if err != nil {
				t.Fatal(err)
			}
			if len(g) != len(w) {
				t.Fatalf("gathered %d families, want %d", len(g), len(w))
			}
			for i := range w {
				if g[i].GetType() != w[i].GetType() || g[i].GetName() != w[i].GetName() || g[i].GetHelp() != w[i].GetHelp() {
					t.Errorf("gathered %v, want %v", g[i], w[i])
				}
			}
		})
	}
}

func descs(c prometheus.Collector) string {
	ch := make(chan *prometheus.Desc, 4)
	c.Describe(ch)
	close(ch)
	s := ""
	for d := range ch {
		s += d.String()
	}
	return s
}

// TestCounterFuncs: one counter a label value, each reading its own value.
func TestCounterFuncs(t *testing.T) {
	vals := []float64{3, 5}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(CounterFuncs("x_total", "help x", "reason", []string{"a", "b"},
		func(i int) func() float64 { return func() float64 { return vals[i] } })...)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 1 || mfs[0].GetName() != "x_total" || mfs[0].GetHelp() != "help x" || len(mfs[0].GetMetric()) != 2 {
		t.Fatalf("gathered %v, want one family x_total of two counters", mfs)
	}
	for i, m := range mfs[0].GetMetric() {
		if l := m.GetLabel(); len(l) != 1 || l[0].GetName() != "reason" || l[0].GetValue() != []string{"a", "b"}[i] {
			t.Errorf("counter %d: labels %v", i, l)
		}
		if got := m.GetCounter().GetValue(); got != vals[i] {
			t.Errorf("counter %d = %v, want %v", i, got, vals[i])
		}
	}
}
