package aggregator_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/aggregator"
)

// TestDataDirInUse opens a data directory an aggregator holds, from this
// process and from another: the error names TOLLGATE_DATA_DIR and says
// another aggregator holds it.
func TestDataDirInUse(t *testing.T) {
	brokers := startKafka(t)
	dir := t.TempDir()
	startAggregator(t, brokers, "a", dir)
	tests := []struct {
		name string
		open func(t *testing.T) string // returns the error
	}{
		{"this process", func(t *testing.T) string {
			_, err := aggregator.New(testConfig(brokers, "b", dir), nil)
			if !errors.Is(err, aggregator.ErrDataDirInUse) {
				t.Errorf("New = %v, want ErrDataDirInUse", err)
			}
			return fmt.Sprint(err)
		}},
		{"another process", func(t *testing.T) string {
			cmd := exec.Command(os.Args[0], "-test.run=^TestAggregatorProcess$", "-test.count=1")
			cmd.Env = append(os.Environ(), processEnv+"=1", "TOLLGATE_KAFKA_BROKERS="+strings.Join(brokers, ","),
				"TOLLGATE_AGGREGATOR_ID=b", "TOLLGATE_DATA_DIR="+dir, "TOLLGATE_AGGREGATOR_LISTEN=127.0.0.1:0",
				"TOLLGATE_AGGREGATOR_METRICS_LISTEN=127.0.0.1:0", "TOLLGATE_KEY_SECRET="+secret, "TOLLGATE_ADMIN_TOKEN="+token)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Errorf("a second process on the same data dir started: %s", out)
			}
			return string(out)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg := tt.open(t)
			t.Logf("%s", msg)
			for _, want := range []string{"TOLLGATE_DATA_DIR", dir, "held by another aggregator"} {
				if !strings.Contains(msg, want) {
					t.Errorf("error %q does not say %q", msg, want)
				}
			}
			if strings.Contains(msg, "resource temporarily unavailable") {
				t.Errorf("error %q speaks of the lock's errno", msg)
			}
		})
	}
}
