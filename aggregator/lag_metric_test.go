package aggregator_test

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testwait"
)

// lagPartitions returns the partitions of the consumer lag series an
// instance exports.
func lagPartitions(t testing.TB, in *instance) []int32 {
	t.Helper()
	resp, err := http.Get("http://" + in.srv.Addrs().Metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var out []int32
	for _, m := range regexp.MustCompile(`(?m)^tollgate_aggregator_consumer_lag\{[^}]*partition="(\d+)"[^}]*\}`).FindAllSubmatch(body, -1) {
		p, _ := strconv.Atoi(string(m[1]))
		out = append(out, int32(p))
	}
	slices.Sort(out)
	return out
}

// TestLagMetricFollowsOwnership: after a rebalance an instance exports the
// consumer lag of the partitions it owns only. A revoked partition's last
// value would otherwise stay forever, and sum(tollgate_aggregator_consumer_lag)
// (the consumer-lag alert of compose/deploy) would count it twice or keep a
// stale lag alive.
func TestLagMetricFollowsOwnership(t *testing.T) {
	brokers := startKafka(t)
	a := startAggregator(t, brokers, "a", t.TempDir())
	gw := newGateway(t, brokers, "gw-1", 7)
	want := map[string]*counts{}
	send := func() {
		// Enough tenants to reach every partition.
		for i := range 60 {
			gw.emitCounted(t, want, fmt.Sprint("tenant-", i), "key-1", true, time.Now())
		}
	}
	send()
	waitTotals(t, a.srv.Addrs().API, want)
	if got := lagPartitions(t, a); len(got) != partitions {
		t.Fatalf("before the rebalance: lag series for partitions %v, want all %d", got, partitions)
	}
	b := startAggregator(t, brokers, "b", t.TempDir())
	testwait.Eventually(t, 30*time.Second, func() error {
		if na, nb := len(a.srv.Owned()), len(b.srv.Owned()); na == 0 || nb == 0 || na+nb != partitions {
			return fmt.Errorf("a owns %v, b owns %v", a.srv.Owned(), b.srv.Owned())
		}
		return nil
	})
	send()
	waitTotals(t, b.srv.Addrs().API, want)
	testwait.Eventually(t, 10*time.Second, func() error {
		for _, in := range []*instance{a, b} {
			owned := in.srv.Owned()
			slices.Sort(owned)
			for _, p := range lagPartitions(t, in) {
				if !slices.Contains(owned, p) {
					return fmt.Errorf("an instance exports the lag of partition %d, which it does not own (owns %v)", p, owned)
				}
			}
		}
		return nil
	})
}
