package metrics_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"

	"github.com/tollgate/tollgate/gateway/internal/metrics"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/rules"
)

// TestDecisionSeries: decisions and RLS calls count in the series of
// their labels, each created when first used, the route label following
// the ruleset in force.
func TestDecisionSeries(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	if got := series(t, reg); len(got) != 0 {
		t.Fatalf("series before any call: %v, want none", got)
	}
	rs, err := rules.Load([]byte("rules:\n  - {id: r1, match: {}, algorithm: fixed_window, limit: 1, window: 1m}\n"))
	if err != nil {
		t.Fatal(err)
	}
	allowed := &guard.Decision{Allowed: true, Reason: guard.ReasonAllowed, Endpoint: "/v1/items", Rules: []guard.RuleResult{{ID: "r1", Allowed: true}}}
	rejected := &guard.Decision{Reason: guard.ReasonRateLimited, Status: 429, Endpoint: "/v1/items", Rules: []guard.RuleResult{{ID: "r1"}}}
	for range 3 {
		m.Decision(allowed, nil, 0)
	}
	m.SetRules(rs, []string{"/v1/items"}, false)
	for range 2 {
		m.Decision(allowed, nil, 0)
	}
	m.Decision(rejected, nil, 0)
	m.Decision(nil, errors.New("no store"), 0)
	for _, c := range []struct {
		over bool
		code codes.Code
		n    int
	}{{false, codes.OK, 4}, {true, codes.OK, 2}, {false, codes.InvalidArgument, 1}, {false, codes.Unavailable, 3}, {true, codes.Internal, 1}} {
		for range c.n {
			m.RLSCall(c.over, c.code)
		}
	}
	want := map[string]float64{
		"tollgate_rls_calls_total/allowed":                         4,
		"tollgate_rls_calls_total/error":                           4,
		"tollgate_rls_calls_total/invalid":                         1,
		"tollgate_rls_calls_total/rejected":                        2,
		"tollgate_checks_total/allowed/allowed/other/r1":           3,
		"tollgate_checks_total/allowed/allowed//v1/items/r1":       2,
		"tollgate_checks_total/rejected/rate_limited//v1/items/r1": 1,
		"tollgate_checks_total/error/error/other/none":             1,
	}
	got := series(t, reg)
	if len(got) != len(want) {
		t.Errorf("series %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
}

// series returns the values of the tollgate_checks_total and
// tollgate_rls_calls_total series, by name and label values (in the
// order of the label names).
func series(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "tollgate_checks_total" && mf.GetName() != "tollgate_rls_calls_total" {
			continue
		}
		for _, s := range mf.GetMetric() {
			name := []string{mf.GetName()}
			for _, lp := range s.GetLabel() {
				name = append(name, lp.GetValue())
			}
			got[strings.Join(name, "/")] = s.GetCounter().GetValue()
		}
	}
	return got
}
