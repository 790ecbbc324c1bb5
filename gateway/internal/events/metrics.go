package events

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate/tollgate/internal/promdef"
)

// metrics exposes the producer's counters, read when scraped: the decision
// path only increments plain integers under the lock it holds anyway.
type metrics struct {
	collectors []prometheus.Collector
}

// newMetrics creates the tollgate_events_* collectors and registers them
// with reg (none when nil). No label carries a key, tenant or path.
func newMetrics(p *Producer, reg prometheus.Registerer) (*metrics, error) {
	locked := func(f func() float64) func() float64 {
		return func() float64 {
			p.mu.Lock()
			defer p.mu.Unlock()
			return f()
		}
	}
	m := &metrics{}
	add := func(c prometheus.Collector) { m.collectors = append(m.collectors, c) }
	add(promdef.CounterFunc("tollgate_events_recorded_total", "Decision and report events taken into the producer's memory buffer.", locked(func() float64 { return float64(p.recorded) })))
	add(promdef.CounterFunc("tollgate_events_produced_total", "Records Kafka acknowledged (events, replays and EpochClosed markers; a record re-sent after a failure counts each time it is acknowledged).", func() float64 { return float64(p.produced.Load()) }))
	m.collectors = append(m.collectors, promdef.CounterFuncs("tollgate_events_dropped_total",
		"Events lost by the producer, by reason: spool_full (memory full and the spool's disk budget spent), oversized (an event larger than a memory chunk), closed (recorded after the producer stopped). The aggregator counts the gaps they leave.",
		"reason", dropReasonNames[:], func(i int) func() float64 { return locked(func() float64 { return float64(p.dropped[i]) }) })...)
	m.collectors = append(m.collectors, promdef.CounterFuncs("tollgate_events_corrected_total",
		"Events written with a value corrected to fit the schema's bounds, by field: cost (clamped to 0..1e9), time (a Redis time more than 10 minutes from the gateway's clock, replaced by it), length (a string cut to its bound, ending with \"…\"), retry_after (clamped to 366 days). The event is kept.",
		"field", fixNames[:], func(i int) func() float64 { return locked(func() float64 { return float64(p.corrected[i]) }) })...)
	add(promdef.GaugeFunc("tollgate_events_buffered", "Events held in memory, waiting for Kafka or the spool.", locked(func() float64 { return float64(p.memEvents) })))
	add(promdef.GaugeFunc("tollgate_events_buffered_bytes", "Memory taken by buffered events, in whole chunks.", locked(func() float64 { return float64(p.memChunks * p.chunkBytes) })))
	add(promdef.GaugeFunc("tollgate_events_memory_limit_bytes", "The producer's memory buffer (Config.MemoryBytes, in whole chunks).", func() float64 { return float64(p.nChunks * p.chunkBytes) }))
	add(promdef.CounterFunc("tollgate_events_spooled_total", "Records written to the on-disk spool (Kafka slow or down, or at a stop).", func() float64 { return float64(p.spooled.Load()) }))
	add(promdef.CounterFunc("tollgate_events_replayed_total", "Records read back from the spool and sent to Kafka.", func() float64 { return float64(p.replayed.Load()) }))
	add(promdef.GaugeFunc("tollgate_events_spool_bytes", "Bytes of the segments in the spool.", func() float64 { return float64(p.sp.Stats().Bytes) }))
	add(promdef.GaugeFunc("tollgate_events_spool_segments", "Segments in the spool.", func() float64 { return float64(p.sp.Stats().Segments) }))
	add(promdef.GaugeFunc("tollgate_events_spool_limit_bytes", "The spool's disk budget (Config.SpoolMaxBytes).", func() float64 { return float64(p.cfg.SpoolMaxBytes) }))
	add(promdef.CounterFunc("tollgate_events_send_errors_total", "Records Kafka or franz-go failed; they are re-sent in order.", func() float64 { return float64(p.sendErrors.Load()) }))
	add(promdef.GaugeFunc("tollgate_events_kafka_up", "1 while Kafka acknowledges events, 0 after a failure or while records wait unanswered (events then go to the spool).", func() float64 {
		if p.kafkaUp.Load() {
			return 1
		}
		return 0
	}))
	add(promdef.CounterFunc("tollgate_events_reservation_overruns_total", "Events numbered beyond the sequence range reserved durably (the reservation could not keep up, or the spool's metadata could not be written); after a SIGKILL their loss may go uncounted.", locked(func() float64 { return float64(p.overruns) })))
	add(promdef.GaugeFunc("tollgate_events_reservation_durable", "1 while the spool's metadata holds this epoch and its sequence reservation; 0 while writing it fails (retried every second): events are still numbered and sent, but a SIGKILL or crash would leave the epoch unclosed and a loss in it uncounted.", func() float64 {
		if p.metaDurable.Load() {
			return 1
		}
		return 0
	}))
	add(promdef.CounterFunc("tollgate_events_spool_quarantined_total", "Spool segments found corrupt (a bad checksum or header elsewhere than a tail a crash cut short) since the start, renamed *.seg.bad and kept for inspection; their events are not replayed and count as missing at the aggregator.", func() float64 { return float64(p.sp.Stats().Quarantined) }))
	add(promdef.CounterFunc("tollgate_events_spool_torn_total", "Spool segments found cut short by a machine crash since the start and cut back to their intact records; the lost tail counts as missing at the aggregator.", func() float64 { return float64(p.sp.Stats().TornSegments) }))
	if reg != nil {
		for _, c := range m.collectors {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("events: register metrics: %w", err)
			}
		}
	}
	return m, nil
}
