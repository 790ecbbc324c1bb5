package aggregator_test

import (
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testwait"
)

// TestHealthzAnswersWhileKafkaIsDown: a process that runs says so. An
// aggregator started while Kafka cannot be reached must answer /healthz
// at once (and /readyz 503 until its state is restored), so that an
// orchestrator does not kill it for being dead while it waits for Kafka.
func TestHealthzAnswersWhileKafkaIsDown(t *testing.T) {
	t.Skip("defect found by the chaos soak (loadtest chaos, invariant 4: a restarted aggregator answers /healthz within 3 s): " +
		"an aggregator that starts while Kafka is unreachable serves nothing, not even /healthz, until Kafka answers — " +
		"Run blocks in the consumer's Setup before it serves its listeners; the fix belongs to the aggregator health work")
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := ln.Addr().String()
	ln.Close() // nothing listens there: Kafka is down
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
}
