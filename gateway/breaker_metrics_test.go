package gateway

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate/tollgate/guard/redisstore"
)

func TestBreakerCollector(t *testing.T) {
	t.Parallel()
	client, err := redisstore.NewClient(redisstore.Config{Addrs: []string{"127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	store := redisstore.New(client)
	t.Cleanup(func() { store.Close() })
	reg := prometheus.NewRegistry()
	prometheus.WrapRegistererWith(prometheus.Labels{"gateway": "g1"}, reg).MustRegister(newBreakerCollector(store))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 1 || mfs[0].GetName() != "tollgate_redis_breaker_state" || len(mfs[0].GetMetric()) != 1 {
		t.Fatalf("gathered %v", mfs)
	}
	m := mfs[0].GetMetric()[0]
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	if labels["node"] != "127.0.0.1:1" || labels["gateway"] != "g1" || m.GetGauge().GetValue() != 0 {
		t.Fatalf("metric %v", m)
	}
}
