package aggregator_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testnet"
	"github.com/tollgate/tollgate/internal/testwait"
)

// TestHealthzAnswersWhileKafkaIsDown: a process that runs says so. An
// aggregator started while Kafka cannot be reached must answer /healthz
// at once (and /readyz 503 until its state is restored), so that an
// orchestrator does not kill it for being dead while it waits for Kafka.
func TestHealthzAnswersWhileKafkaIsDown(t *testing.T) {
	t.Parallel()
	down := testnet.FreeAddr(t) // nothing listens there: Kafka is down
	in := startAggregator(t, []string{down}, "agg-kafka-down", t.TempDir())
	url := "http://" + in.srv.Addrs().Metrics + "/healthz"
	client := &http.Client{Timeout: time.Second}
	testwait.Eventually(t, 3*time.Second, func() error {
		resp, err := client.Get(url)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/healthz %d", resp.StatusCode)
		}
		return nil
	})
	resp, err := client.Get("http://" + in.srv.Addrs().Metrics + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/readyz %d while Kafka is down at start, want 503", resp.StatusCode)
	}
}
