package aggregator_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/aggregator"
	"github.com/tollgate/tollgate/internal/logtest"
	"github.com/tollgate/tollgate/internal/testwait"
)

// TestPenaltyConfig checks the penalty section's defaults and that every
// bad value is refused naming its variable.
func TestPenaltyConfig(t *testing.T) {
	t.Parallel()
	env := map[string]string{"TOLLGATE_KAFKA_BROKERS": "127.0.0.1:9092", "TOLLGATE_KEY_SECRET": secret, "TOLLGATE_ADMIN_TOKEN": token}
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

// TestConfigRefusals: the operator API is never exposed without a token,
// and the required settings are named by their variables.
func TestConfigRefusals(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  map[string]string
		want string // "" accepted
	}{
		{"defaults", map[string]string{}, ""},
		{"no secret", map[string]string{"TOLLGATE_KEY_SECRET": ""}, "TOLLGATE_KEY_SECRET"},
		{"short secret", map[string]string{"TOLLGATE_KEY_SECRET": "short"}, "TOLLGATE_KEY_SECRET"},
		{"no brokers", map[string]string{"TOLLGATE_KAFKA_BROKERS": ""}, "TOLLGATE_KAFKA_BROKERS"},
		{"exposed without a token", map[string]string{"TOLLGATE_AGGREGATOR_LISTEN": "0.0.0.0:8081", "TOLLGATE_ADMIN_TOKEN": ""}, "TOLLGATE_ADMIN_TOKEN"},
		{"exposed with a token", map[string]string{"TOLLGATE_AGGREGATOR_LISTEN": "0.0.0.0:8081"}, ""},
		{"loopback without a token", map[string]string{"TOLLGATE_ADMIN_TOKEN": ""}, "TOLLGATE_ADMIN_INSECURE=true"},
		{"loopback insecure", map[string]string{"TOLLGATE_ADMIN_TOKEN": "", "TOLLGATE_ADMIN_INSECURE": "true"}, ""},
		{"exposed insecure", map[string]string{"TOLLGATE_AGGREGATOR_LISTEN": "0.0.0.0:8081", "TOLLGATE_ADMIN_TOKEN": "",
			"TOLLGATE_ADMIN_INSECURE": "true"}, "TOLLGATE_ADMIN_TOKEN"},
		{"insecure and a token", map[string]string{"TOLLGATE_ADMIN_INSECURE": "true"}, "TOLLGATE_ADMIN_INSECURE"},
		{"one-character token", map[string]string{"TOLLGATE_AGGREGATOR_LISTEN": "0.0.0.0:8081", "TOLLGATE_ADMIN_TOKEN": "t"}, "at least 16 characters"},
		{"15-character token", map[string]string{"TOLLGATE_ADMIN_TOKEN": "0123456789abcde"}, "TOLLGATE_ADMIN_TOKEN"},
		{"16-character token", map[string]string{"TOLLGATE_ADMIN_TOKEN": "0123456789abcdef"}, ""},
		{"token with a space", map[string]string{"TOLLGATE_ADMIN_TOKEN": "0123456789 abcdef"}, "spaces"},
		{"viewer token", map[string]string{"TOLLGATE_VIEWER_TOKEN": "viewer-0123456789"}, ""},
		{"short viewer token", map[string]string{"TOLLGATE_VIEWER_TOKEN": "viewer"}, "TOLLGATE_VIEWER_TOKEN"},
		{"viewer token with a space", map[string]string{"TOLLGATE_VIEWER_TOKEN": "viewer 0123456789"}, "TOLLGATE_VIEWER_TOKEN"},
		{"viewer token is the admin token", map[string]string{"TOLLGATE_VIEWER_TOKEN": token}, "must differ"},
		{"bad redis mode", map[string]string{"TOLLGATE_REDIS_MODE": "mesh"}, "TOLLGATE_REDIS_MODE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{"TOLLGATE_KAFKA_BROKERS": "127.0.0.1:9092", "TOLLGATE_KEY_SECRET": secret, "TOLLGATE_ADMIN_TOKEN": token}
			for k, v := range tt.env {
				env[k] = v
			}
			_, err := aggregator.LoadConfig("", func(k string) (string, bool) { v, ok := env[k]; return v, ok })
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("error %v, want one naming %s", err, tt.want)
			}
		})
	}
}

// TestAdminTokenAtStart: New refuses to start without a token, naming
// TOLLGATE_ADMIN_TOKEN; with admin_insecure it starts and says so on
// /readyz.
func TestAdminTokenAtStart(t *testing.T) {
	cfg := aggregator.Config{Listen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0", ID: "insecure", DataDir: t.TempDir(),
		KeySecret: secret, SessionTimeout: 2 * time.Second}
	cfg.Kafka.Brokers = startKafka(t)
	if _, err := aggregator.New(cfg, logtest.Verbose(t)); err == nil || !strings.Contains(err.Error(), "TOLLGATE_ADMIN_TOKEN") {
		t.Fatalf("New without a token: %v, want a refusal naming TOLLGATE_ADMIN_TOKEN", err)
	}
	cfg.AdminInsecure = true
	in := runWith(t, cfg, logtest.Verbose(t))
	srv := in.srv
	testwait.Eventually(t, 20*time.Second, func() error {
		resp, err := http.Get("http://" + srv.Addrs().Metrics + "/readyz")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || !strings.Contains(string(b), "WARNING: the operator API has no token (TOLLGATE_ADMIN_INSECURE=true)") {
			return fmt.Errorf("/readyz %d %q", resp.StatusCode, b)
		}
		return nil
	})
}
