package aggregator_test

import (
	"strings"
	"testing"

	"github.com/tollgate/tollgate/aggregator"
)

// TestPenaltyConfig checks the penalty section's defaults and that every
// bad value is refused naming its variable.
func TestPenaltyConfig(t *testing.T) {
	t.Parallel()
	env := map[string]string{"TOLLGATE_KAFKA_BROKERS": "127.0.0.1:9092", "TOLLGATE_KEY_SECRET": secret}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	cfg, err := aggregator.LoadConfig("", lookup)
	if err != nil {
		t.Fatal(err)
	}
	p := cfg.Penalty
	if p.Mode != "on" || p.VolumeCeiling != 10_000 || p.BackoffMinIgnored != 20 || p.Factor != 0.5 || len(p.Detectors) != 3 ||
		p.ReducedFor.String() != "5m0s" || p.CooldownFor.String() != "15m0s" || p.BlockFor.String() != "24h0m0s" {
		t.Fatalf("defaults: %+v", p)
	}
	for k, v := range map[string]string{"TOLLGATE_PENALTY_MODE": "maybe", "TOLLGATE_PENALTY_DETECTORS": "backoff_ignored,psychic",
		"TOLLGATE_PENALTY_WINDOW": "10ms", "TOLLGATE_PENALTY_FACTOR": "2", "TOLLGATE_PENALTY_REJECTION_RATIO": "1.5",
		"TOLLGATE_PENALTY_VOLUME_CEILING": "-1"} {
		env[k] = v
	}
	_, err = aggregator.LoadConfig("", lookup)
	if err == nil {
		t.Fatal("bad penalty settings accepted")
	}
	for _, want := range []string{"TOLLGATE_PENALTY_MODE", "TOLLGATE_PENALTY_DETECTORS", "TOLLGATE_PENALTY_WINDOW",
		"TOLLGATE_PENALTY_FACTOR", "TOLLGATE_PENALTY_REJECTION_RATIO", "TOLLGATE_PENALTY_VOLUME_CEILING"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %s:\n%v", want, err)
		}
	}
}
