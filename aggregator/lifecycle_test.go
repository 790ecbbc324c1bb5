package aggregator_test

import (
	"fmt"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/compose/kafkabroker/kafkatest"
	"github.com/tollgate/tollgate/internal/testwait"
)

// signal sends sig to the child process.
func (c *child) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := c.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("%v: %v", sig, err)
	}
}

// stop stops the child gracefully (SIGTERM) and waits for it.
func (c *child) stop(t *testing.T) {
	t.Helper()
	c.once.Do(func() {
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		if err := c.cmd.Wait(); err != nil {
			t.Errorf("child stopped with %v", err)
		}
	})
}

// ownsAll reports whether the child is ready and processes every
// partition.
func (c *child) ownsAll() error {
	r, code, err := getReadyz(c.metrics)
	if err != nil {
		return err
	}
	if code != http.StatusOK || len(r.Processing.Partitions) != partitions {
		return fmt.Errorf("not ready with every partition: %d %+v", code, r)
	}
	return nil
}

// TestFencedInstanceRecovers fences an instance with a second one of the
// same aggregator_id, as a replacement started while the first hangs (a
// SIGSTOPped process: its group session expires, so the second passes the
// start check, joins, and its producer fences the first). When the first
// wakes, its next transaction is refused: it releases its partitions and
// stands by, /readyz 503 fenced. Once the second stops, the first builds a
// new session by itself, takes every partition, and the totals are exact.
func TestFencedInstanceRecovers(t *testing.T) {
	b := kafkatest.StartTB(t)
	brokers := []string{b.Addr()}
	first := startChild(t, brokers, "same", t.TempDir())
	testwait.Eventually(t, 60*time.Second, first.ownsAll)
	gw := newGateway(t, brokers, "gw-1", 21)
	stop := sender(t, gw, time.Now())
	waitSent(gw, 300)

	first.signal(t, syscall.SIGSTOP)
	stopped := true
	defer func() {
		if stopped {
			_ = first.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	second := startChild(t, brokers, "same", t.TempDir())
	testwait.Eventually(t, 60*time.Second, second.ownsAll)
	waitSent(gw, 1500)

	first.signal(t, syscall.SIGCONT)
	stopped = false
	r, took := waitReadyz(t, first.metrics, 60*time.Second, func(r readyzBody, code int) error {
		if code != http.StatusServiceUnavailable || r.Reason != "fenced" || len(r.Processing.Partitions) != 0 {
			return fmt.Errorf("first instance: %d %+v, want 503 fenced with no partition", code, r)
		}
		return nil
	})
	t.Logf("first instance %v after it woke: %s %s: %s", took.Round(time.Millisecond), r.Status, r.Reason, r.Message)
	testwait.Eventually(t, 60*time.Second, second.ownsAll)

	second.stop(t)
	took = testwait.Eventually(t, 60*time.Second, first.ownsAll)
	t.Logf("first instance ready with every partition %v after the second stopped", took.Round(time.Millisecond))
	waitSent(gw, 3000)
	want := stop()
	waitTotals(t, first.api, want)
}
