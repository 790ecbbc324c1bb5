package gateway

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate/tollgate/guard/redisstore"
)

// breakerCollector exports the state of the Redis store's circuit
// breakers, one per Redis node, read at scrape time:
//
//	tollgate_redis_breaker_state{node="10.0.0.5:6379"} 0   # 0 closed, 1 open, 2 half_open
//
// node is the node's address ("sentinel" for a Sentinel-managed primary):
// a bounded set. It reads the store at scrape time, so the store needs no
// hook; New registers it with the gateway label.
type breakerCollector struct {
	store *redisstore.Store
	desc  *prometheus.Desc
}

var _ prometheus.Collector = (*breakerCollector)(nil)

func newBreakerCollector(store *redisstore.Store) *breakerCollector {
	return &breakerCollector{
		store: store,
		desc: prometheus.NewDesc("tollgate_redis_breaker_state",
			"State of the circuit breaker of each Redis node: 0 closed, 1 open (checks degrade without calling the node), 2 half-open (probing).",
			[]string{"node"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *breakerCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *breakerCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.store.BreakerStates() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(s.State), s.Node)
	}
}
