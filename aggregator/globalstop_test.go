package aggregator_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testwait"
)

// TestStopsWhileAnotherRegionsJournalIsCut: an aggregator reading another
// region's journal of global changes stops promptly while the link to
// that region is cut (before, its reader retried recreating a consumer
// across the cut for ever, and the aggregator never stopped).
func TestStopsWhileAnotherRegionsJournalIsCut(t *testing.T) {
	t.Parallel()
	f := startRegionFleet(t, "eu", "us")
	eu, us := f.regions[0], f.regions[1]
	// 503 until eu's control plane is up: nothing is changed then.
	testwait.Eventually(t, 20*time.Second, func() error {
		if code, _, b := op(t, eu.agg.srv.Addrs().API, "PUT", "/admin/v1/blocklist/sk_stop_journal?scope=global", `{"reason":"test"}`); code != 200 {
			return fmt.Errorf("global block in eu: %d %s", code, b)
		}
		return nil
	})
	testwait.Eventually(t, 20*time.Second, func() error {
		if code, _, b := op(t, us.agg.srv.Addrs().API, "GET", "/admin/v1/blocklist/sk_stop_journal", ""); code != 200 {
			return fmt.Errorf("us has not applied eu's global block: %d %s", code, b)
		}
		return nil
	})
	if err := us.nats.CutLinks(); err != nil {
		t.Fatal(err)
	}
	// Give us's reader time to find the link gone (several of its reads).
	cut := time.Now()
	testwait.Eventually(t, 10*time.Second, func() error {
		if time.Since(cut) < 4*time.Second {
			return errors.New("the link has been cut for less than 4s")
		}
		return nil
	})
	start := time.Now()
	us.agg.run.Cancel()
	select {
	case <-us.agg.run.Done():
		us.agg.stop(t)
	case <-time.After(20 * time.Second):
		t.Fatal("us's aggregator did not stop within 20s of being told, its link to eu cut")
	}
	t.Logf("us's aggregator stopped %v after being told, its link cut", time.Since(start).Round(time.Millisecond))
	if err := us.nats.HealLinks(); err != nil {
		t.Fatal(err)
	}
}
