package consume

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tollgate/tollgate/aggregator/internal/windows"
	"github.com/tollgate/tollgate/internal/promdef"
)

// Records that are not what a gateway writes (poison): each is counted,
// summed up in the log once per poisonLogEvery, and never applied; none
// stops its partition. See docs/aggregator.md and docs/operations.md.

// poisonLogEvery is how often refused, held and anomalous events are
// logged (with their counts since the last time), never once per record.
const poisonLogEvery = 10 * time.Second

// refusals are the records of one transaction refused for a field out of
// its bounds, by reason, and the last one, described for the log.
type refusals struct {
	counts  map[string]int
	example string
}

func (r *refusals) add(reason string, ev *event, rec *kgo.Record) {
	if r.counts == nil {
		r.counts = map[string]int{}
	}
	r.counts[reason]++
	gw := ev.Gateway
	if len(gw) > 64 {
		gw = gw[:64]
	}
	r.example = fmt.Sprintf("reason=%s partition=%d offset=%d gateway_id=%q epoch=%d seq=%d",
		reason, rec.Partition, rec.Offset, gw, ev.Epoch, ev.Seq)
}

// poisonLog accumulates what the committed transactions refused, held or
// found anomalous, and logs it at most once per poisonLogEvery. Owned by
// the processing loop.
type poisonLog struct {
	last    time.Time
	counts  map[string]int
	example string
}

func (l *poisonLog) add(what string, n int) {
	if n == 0 {
		return
	}
	if l.counts == nil {
		l.counts = map[string]int{}
	}
	l.counts[what] += n
}

func (l *poisonLog) flush(log *slog.Logger, now time.Time) {
	if len(l.counts) == 0 || now.Sub(l.last) < poisonLogEvery {
		return
	}
	attrs := make([]any, 0, len(l.counts)+1)
	for what, n := range l.counts {
		attrs = append(attrs, slog.Int(what, n))
	}
	if l.example != "" {
		attrs = append(attrs, slog.String("last_refused", l.example))
	}
	log.Warn("decision events refused or held (tollgate_aggregator_events_invalid_total, tollgate_aggregator_sequence_anomalies_total)", attrs...)
	l.last, l.counts, l.example = now, nil, ""
}

// poisonMetrics are the collectors of refused events and sequence
// anomalies.
type poisonMetrics struct {
	invalid   *prometheus.CounterVec
	anomalies *prometheus.CounterVec
	oversized *prometheus.CounterVec
}

// Kinds of sequence anomalies (tollgate_aggregator_sequence_anomalies_total).
const (
	anomalyDiscarded  = "held_discarded"
	anomalyAccepted   = "jump_accepted"
	anomalyFilled     = "gap_filled"
	anomalyAfterClose = "after_close"
)

func newPoisonMetrics() *poisonMetrics {
	m := &poisonMetrics{
		invalid:   promdef.CounterVec("tollgate_aggregator_events_invalid_total", "Decision events refused and never applied, by reason: identity (no gateway id, epoch or seq, or a partition field that is not the record's), marker (an EpochClosed marker whose seq is not last_seq + 1), cost, time, length, retry_after (a field outside its documented bound).", "reason"),
		anomalies: promdef.CounterVec("tollgate_aggregator_sequence_anomalies_total", "Sequence numbers that no gateway's own records produce, by kind: held_discarded (events that jumped beyond the bound, held, then dropped because their source went on from below), jump_accepted (held runs confirmed: their gap counts as missing), gap_filled (events applied in a gap already counted missing), after_close (events applied above the mark of a closed epoch).", "kind"),
		oversized: promdef.CounterVec("tollgate_aggregator_rollups_oversized_total", "Closed windows whose usage record would exceed the usage topic's message size, by action: truncated (published with the endpoint cut and truncated set), skipped (not published even cut; the report rows are whole).", "action"),
	}
	for _, r := range invalidReasons {
		m.invalid.WithLabelValues(r)
	}
	for _, k := range []string{anomalyDiscarded, anomalyAccepted, anomalyFilled, anomalyAfterClose} {
		m.anomalies.WithLabelValues(k)
	}
	for _, a := range []string{"truncated", "skipped"} {
		m.oversized.WithLabelValues(a)
	}
	return m
}

func (m *poisonMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.invalid, m.anomalies, m.oversized}
}

// countPoison adds a committed transaction's refusals and anomalies to the
// metrics and the log.
func (p *Processor) countPoison(bad []*refusals, stats windows.Stats) {
	l := &p.poison
	for _, r := range bad {
		for reason, n := range r.counts {
			p.m.poison.invalid.WithLabelValues(reason).Add(float64(n))
			p.m.events.WithLabelValues("invalid").Add(float64(n))
			l.add("invalid_"+reason, n)
		}
		if r.example != "" {
			l.example = r.example
		}
	}
	p.m.events.WithLabelValues("held").Add(float64(stats.Held))
	l.add("held", stats.Held)
	for kind, n := range map[string]int{anomalyDiscarded: stats.Discarded, anomalyAccepted: stats.Accepted,
		anomalyFilled: stats.Filled, anomalyAfterClose: stats.AfterClose} {
		p.m.poison.anomalies.WithLabelValues(kind).Add(float64(n))
		l.add(kind, n)
	}
}

// Message sizes: Kafka's default max.message.bytes (franz-go's default
// batch limit), and the least a topic the processor writes must take (a
// row of the longest endpoint, a mark, a penalty state, an audit entry).
const (
	defaultMaxMessageBytes = 1_000_012
	minMaxMessageBytes     = 16 << 10
)

// topicLimits reads max.message.bytes of the topics the processor writes
// (Kafka's default when it cannot tell): the largest record batch it may
// produce to each, which also bounds the usage records (fitRollup). It
// warns of a topic whose limit is below minMaxMessageBytes.
func (p *Processor) topicLimits(ctx context.Context, adm *kadm.Client) map[string]int32 {
	t := p.cfg.Topics
	topics := []string{t.Changelog, t.Usage, t.Penalties, t.Audit}
	limits := map[string]int32{}
	for _, topic := range topics {
		limits[topic] = defaultMaxMessageBytes
	}
	rcs, err := adm.DescribeTopicConfigs(ctx, topics...)
	if err != nil {
		p.log.Warn("cannot read the topics' max.message.bytes; assuming Kafka's default", slog.Int("bytes", defaultMaxMessageBytes),
			slog.String("error", err.Error()))
	}
	for _, rc := range rcs {
		if rc.Err != nil {
			continue
		}
		for _, c := range rc.Configs {
			if c.Key != "max.message.bytes" || c.Value == nil {
				continue
			}
			if n, err := strconv.ParseInt(*c.Value, 10, 32); err == nil && n > 0 {
				limits[rc.Name] = int32(min(n, defaultMaxMessageBytes))
			}
		}
	}
	for _, topic := range topics {
		if n := limits[topic]; n < minMaxMessageBytes {
			p.log.Warn("a topic's max.message.bytes is below what the aggregator's records may need", slog.String("topic", topic),
				slog.Int("max_message_bytes", int(n)), slog.Int("want_at_least", minMaxMessageBytes))
		}
	}
	return limits
}

// oversizedRollups collects, from the produce callbacks of one
// transaction, the usage records the broker refused as too large.
type oversizedRollups struct {
	mu      sync.Mutex
	largest int // the largest size refused, 0: none
}

func (o *oversizedRollups) note(r *kgo.Record, err error) {
	if !errors.Is(err, kerr.MessageTooLarge) {
		return
	}
	size := len(r.Key) + len(r.Value) + recordOverhead
	o.mu.Lock()
	defer o.mu.Unlock()
	o.largest = max(o.largest, size)
}

// limitRollups halves the size rollups are cut to, below the largest
// record of a batch the broker refused as too large (its
// max.message.bytes was lowered while the processor ran), so that the
// retried transaction publishes it cut: a few retries find a size that
// fits. The producer's batches keep the limit read at start until the
// aggregator restarts.
func (p *Processor) limitRollups(refused int) {
	if refused <= 0 {
		return
	}
	p.rollupLimit = min(p.rollupLimit, refused/2)
	p.log.Error("the broker refused usage records as too large: its max.message.bytes is lower than when the aggregator started; cutting rollups smaller (restart the aggregator to read the new limit)",
		slog.Int("bytes", p.rollupLimit), slog.String("topic", p.cfg.Topics.Usage))
}
