package promtext

import (
	"strings"
	"testing"
)

func TestParseAndSum(t *testing.T) {
	t.Parallel()
	in := `# HELP tollgate_redis_calls_total Calls.
# TYPE tollgate_redis_calls_total counter
tollgate_redis_calls_total{gateway="gw1"} 42
tollgate_checks_total{decision="rejected",gateway="gw1",reason="rate_limited",rule="demo",route="other"} 7
tollgate_checks_total{decision="blocked",gateway="gw1",reason="blocklisted",rule="none",route="other"} 5
tollgate_checks_total{decision="rejected",gateway="gw1",reason="penalty",rule="none",route="other"} 3 1700000000000
go_goroutines 12
tollgate_penalized_keys{gateway="gw1",level="3"} 1
`
	ss, err := Parse(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"tollgate_redis_calls_total", nil, 42},
		{"tollgate_checks_total", nil, 15},
		{"tollgate_checks_total", []string{`decision="rejected"`}, 10},
		{"tollgate_checks_total", []string{`decision="rejected"`, `reason="penalty"`}, 3},
		{"go_goroutines", nil, 12},
		{"tollgate_penalized_keys", []string{`level="3"`}, 1},
		{"tollgate_penalized_keys", []string{`level="2"`}, 0},
		{"missing", nil, 0},
	} {
		if got := ss.Sum(tc.name, tc.labels...); got != tc.want {
			t.Errorf("Sum(%s, %v) = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
	for _, tc := range []struct {
		series string
		want   float64
		ok     bool
	}{
		{`tollgate_redis_calls_total{gateway="gw1"}`, 42, true},
		{"go_goroutines", 12, true},
		{`tollgate_checks_total{decision="rejected",gateway="gw1",reason="penalty",rule="none",route="other"}`, 3, true},
		{"tollgate_redis_calls_total", 0, false},                       // the series has labels
		{`tollgate_penalized_keys{level="3",gateway="gw1"}`, 0, false}, // not the exposition's order
		{`tollgate_penalized_keys{gateway="gw1"}`, 0, false},           // not all its labels
		{"missing", 0, false},
	} {
		if got, ok := ss.Value(tc.series); got != tc.want || ok != tc.ok {
			t.Errorf("Value(%s) = %v, %v, want %v, %v", tc.series, got, ok, tc.want, tc.ok)
		}
	}
	for _, bad := range []string{"x{a=\"1\" 3", "x", "x{} notanumber"} {
		if _, err := Parse(strings.NewReader(bad)); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}
