package consume

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate/tollgate/aggregator/internal/abuse"
	"github.com/tollgate/tollgate/internal/promdef"
)

// metrics are the processor's collectors.
type metrics struct {
	events       *prometheus.CounterVec
	late         prometheus.Counter
	missing      prometheus.Counter
	expired      prometheus.Counter
	published    prometheus.Counter
	materialized prometheus.Counter
	txns         *prometheus.CounterVec
	restores     prometheus.Counter
	owned        prometheus.Gauge
	rows         prometheus.Gauge
	lag          *prometheus.GaugeVec
	penalties    *prometheus.CounterVec
	penalized    *prometheus.GaugeVec
	firings      *prometheus.CounterVec
	volumeKeys   prometheus.Gauge
	penaltyKeys  prometheus.Gauge
	poison       *poisonMetrics
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		events:       promdef.CounterVec("tollgate_aggregator_events_total", "Decision events consumed, by result: applied (counted, exactly once), duplicate (at or below its source's high-water mark: a replay), malformed (not a decision event this aggregator reads), command (a penalty lift), invalid (a field outside its bound: refused, see tollgate_aggregator_events_invalid_total), held (a sequence jump beyond the bound, not applied until confirmed).", "result"),
		late:         promdef.Counter("tollgate_aggregator_events_late_total", "Events that arrived after their window was published (counted in the report rows anyway; the window is republished with a new revision)."),
		missing:      promdef.Counter("tollgate_aggregator_events_missing_total", "Sequence numbers never delivered: gaps in a gateway epoch's sequence, and the numbers the gateway used after its last delivered event when an EpochClosed marker closes the epoch (0 after a graceful stop; after a gateway's SIGKILL exactly what was lost; after a machine crash up to one sequence reservation per partition more)."),
		expired:      promdef.Counter("tollgate_aggregator_rows_expired_total", "Usage rows deleted after their retention (a tombstone in the changelog)."),
		published:    promdef.Counter("tollgate_aggregator_rollups_published_total", "Closed windows published to the usage topic (republications after late events included)."),
		materialized: promdef.Counter("tollgate_aggregator_changelog_records_total", "Changelog records materialized into this instance's Pebble."),
		txns:         promdef.CounterVec("tollgate_aggregator_transactions_total", "Kafka transactions, by result: committed, aborted (a rebalance: reprocessed), error (state rebuilt from the changelog).", "result"),
		restores:     promdef.Counter("tollgate_aggregator_partition_restores_total", "Partition states built from Pebble after an assignment."),
		owned:        promdef.Gauge("tollgate_aggregator_partitions_owned", "Decisions partitions this instance processes."),
		rows:         promdef.Gauge("tollgate_aggregator_rows_in_memory", "Usage rows held in memory (open windows and recent writes)."),
		lag:          promdef.GaugeVec("tollgate_aggregator_consumer_lag", "Decision events behind the partition's high watermark at the last poll, by partition.", "partition"),
	}
	m.penalties = promdef.CounterVec("tollgate_aggregator_penalties_total", "Penalty ladder steps taken by the partitions this instance owns, by level after the step and action (reduced_limit, cooldown, blocklist, step_down, lifted).", "level", "action")
	m.penalized = promdef.GaugeVec("tollgate_aggregator_penalized_keys", "Keys whose penalty is enforced now, by level, in the partitions this instance owns (sum over instances for the fleet).", "level")
	m.firings = promdef.CounterVec("tollgate_aggregator_detector_firings_total", "Times an abuse detector fired on a key (its evidence then starts again), by detector: backoff_ignored, sustained_rejection, volume_ceiling.", "detector")
	m.volumeKeys = promdef.Gauge("tollgate_aggregator_volume_ceiling_keys", "Keys the volume_ceiling detector fired on within the last detection window, in the partitions this instance owns.")
	m.penaltyKeys = promdef.Gauge("tollgate_aggregator_penalty_state_keys", "Keys whose detector and ladder state this instance holds in memory (seen within the idle time, or penalised).")
	m.poison = newPoisonMetrics()
	for l := 1; l <= abuse.MaxLevel; l++ {
		m.penalized.WithLabelValues(strconv.Itoa(l))
	}
	for _, r := range []string{"applied", "duplicate", "malformed", "command", "invalid", "held"} {
		m.events.WithLabelValues(r)
	}
	for _, d := range abuse.Detectors {
		m.firings.WithLabelValues(d)
	}
	if reg != nil {
		reg.MustRegister(m.events, m.late, m.missing, m.expired, m.published, m.materialized, m.txns, m.restores, m.owned, m.rows, m.lag,
			m.penalties, m.penalized, m.firings, m.volumeKeys, m.penaltyKeys)
		reg.MustRegister(m.poison.collectors()...)
	}
	return m
}

// gaugePenalties sets the gauges of penalised keys from the tables owned.
func (p *Processor) gaugePenalties(tables map[int32]*part, now time.Time) {
	var levels [abuse.MaxLevel + 1]int
	volume := 0
	for _, tab := range tables {
		l := tab.pen.Levels(now)
		for i := range levels {
			levels[i] += l[i]
		}
		volume += tab.pen.VolumeKeys(now)
	}
	for l := 1; l <= abuse.MaxLevel; l++ {
		p.m.penalized.WithLabelValues(strconv.Itoa(l)).Set(float64(levels[l]))
	}
	p.m.volumeKeys.Set(float64(volume))
}
