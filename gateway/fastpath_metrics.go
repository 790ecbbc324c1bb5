package gateway

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate/tollgate/guard/lease"
)

// fastPathCollector exports the local fast path's counts (guard/lease),
// read once per scrape.
type fastPathCollector struct {
	store          *lease.Store
	calls, granted *prometheus.Desc
	returned       *prometheus.Desc
	dropped        *prometheus.Desc
}

func newFastPathCollector(store *lease.Store) *fastPathCollector {
	return &fastPathCollector{
		store: store,
		calls: prometheus.NewDesc("tollgate_fastpath_total",
			"Checks and peeks by how the local fast path answered them: lease (admitted from units taken from Redis in advance), negative (rejected from the negative cache, Retry-After still running), miss (went to Redis though the fast path could have answered a hot counter) or bypass (went to Redis: a strict or shadow rule, or another operation).",
			[]string{"result"}, nil),
		granted: prometheus.NewDesc("tollgate_fastpath_leased_units_total",
			"Units this gateway took from Redis in advance as leases.", nil, nil),
		returned: prometheus.NewDesc("tollgate_fastpath_returned_units_total",
			"Units of leases this gateway did not use and gave back to Redis.", nil, nil),
		dropped: prometheus.NewDesc("tollgate_fastpath_dropped_units_total",
			"Units of leases this gateway did not use whose return failed with an unknown outcome (a timeout after it was sent): never sent twice, they stay charged in Redis until their window passes or the bucket refills.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *fastPathCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.calls
	ch <- c.granted
	ch <- c.returned
	ch <- c.dropped
}

// Collect implements prometheus.Collector.
func (c *fastPathCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.store.Stats()
	for _, r := range []struct {
		label string
		n     int64
	}{{"lease", st.Lease}, {"negative", st.Negative}, {"miss", st.Miss}, {"bypass", st.Bypass}} {
		ch <- prometheus.MustNewConstMetric(c.calls, prometheus.CounterValue, float64(r.n), r.label)
	}
	ch <- prometheus.MustNewConstMetric(c.granted, prometheus.CounterValue, float64(st.Granted))
	ch <- prometheus.MustNewConstMetric(c.returned, prometheus.CounterValue, float64(st.Returned))
	ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(st.Dropped))
}
