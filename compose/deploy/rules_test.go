package deploy

import (
	"path/filepath"
	"slices"
	"testing"
)

// alertRule is one alerting rule of alerts.yml.
type alertRule struct {
	Alert       string            `yaml:"alert"`
	Record      string            `yaml:"record"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

// loadAlertRules returns the rules of alerts.yml.
func loadAlertRules(t testing.TB) []alertRule {
	t.Helper()
	var doc struct {
		Groups []struct {
			Name  string      `yaml:"name"`
			Rules []alertRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	readYAML(t, alertsFile, &doc)
	var out []alertRule
	for _, g := range doc.Groups {
		out = append(out, g.Rules...)
	}
	if len(out) == 0 {
		t.Fatalf("%s: no rules", alertsFile)
	}
	return out
}

// TestAlertRules runs promtool on the rules and their unit tests, and
// checks that every alert is tested both firing and quiet, and carries a
// severity and the annotations Alertmanager shows.
func TestAlertRules(t *testing.T) {
	promtool := requireTool(t, "promtool")
	runTool(t, promtool, nil, "check", "rules", "--lint=all", "--lint-fatal", alertsFile)
	runTool(t, promtool, nil, "test", "rules", alertsTestFile)

	var tests struct {
		RuleFiles []string `yaml:"rule_files"`
		Tests     []struct {
			Name          string `yaml:"name"`
			AlertRuleTest []struct {
				EvalTime  string `yaml:"eval_time"`
				Alertname string `yaml:"alertname"`
				ExpAlerts []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	readYAML(t, alertsTestFile, &tests)
	if !slices.Equal(tests.RuleFiles, []string{filepath.Base(alertsFile)}) {
		t.Errorf("%s: rule_files %v, want [%s]", alertsTestFile, tests.RuleFiles, filepath.Base(alertsFile))
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	names := map[string]bool{}
	for _, r := range loadAlertRules(t) {
		if r.Alert == "" {
			continue // a recording rule
		}
		names[r.Alert] = true
		if !fires[r.Alert] {
			t.Errorf("alert %s: no case in %s where it fires", r.Alert, alertsTestFile)
		}
		if !quiet[r.Alert] {
			t.Errorf("alert %s: no case in %s where it stays quiet", r.Alert, alertsTestFile)
		}
		if s := r.Labels["severity"]; s != "warning" && s != "critical" {
			t.Errorf("alert %s: severity %q, want warning or critical (alertmanager.yml routes on it)", r.Alert, s)
		}
		for _, a := range []string{"summary", "description"} {
			if r.Annotations[a] == "" {
				t.Errorf("alert %s: no %s annotation", r.Alert, a)
			}
		}
	}
	for n := range fires {
		if !names[n] {
			t.Errorf("%s tests alert %s, which %s does not define", alertsTestFile, n, alertsFile)
		}
	}
	for n := range quiet {
		if !names[n] {
			t.Errorf("%s tests alert %s, which %s does not define", alertsTestFile, n, alertsFile)
		}
	}
}
