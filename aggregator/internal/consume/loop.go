package consume

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tollgate/tollgate/aggregator/internal/abuse"
	"github.com/tollgate/tollgate/aggregator/internal/windows"
)

// loop is one transactional session: poll → apply → commit, around the
// batch of the open transaction. It is owned by the processing goroutine
// (Processor.process), which needs no lock for it.
type loop struct {
	p    *Processor
	sess *kgo.GroupTransactSession
	adm  *kadm.Client
	out  outParts

	// tables are the partitions owned, built from Pebble at their first
	// poll or tick after an assignment, dropped at a revocation.
	tables map[int32]*part
	batch  batch

	lastClose time.Time // the last tick: windows closed, ladders stepped
	ticks     int
	ev        event // the record being applied (decoded into, reused)
}

// outParts are the partition counts of the topics the loop produces to
// besides the changelog (co-partitioned with the decisions topic).
type outParts struct{ usage, penalties, audit int32 }

// session runs one GroupTransactSession until ctx is done. It returns an
// *errSession when a transaction could not begin or commit: the session
// is then unusable (franz-go: no End error is retryable), and process
// replaces it. It returns nil once ctx is done, whatever was under way.
func (p *Processor) session(ctx context.Context, base []kgo.Opt, adm *kadm.Client) error {
	l, err := p.openSession(ctx, base, adm)
	if err != nil {
		return err
	}
	defer l.close()
	for ctx.Err() == nil {
		if err := l.step(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
	return nil
}

// openSession joins the consumer group with a transactional session whose
// batches never exceed a topic's max.message.bytes, nor a rollup the
// usage topic's (fitRollup cuts it).
func (p *Processor) openSession(ctx context.Context, base []kgo.Opt, adm *kadm.Client) (*loop, error) {
	t := p.cfg.Topics
	limits := p.topicLimits(ctx, adm)
	p.rollupLimit = int(limits[t.Usage])
	sess, err := kgo.NewGroupTransactSession(append(base,
		kgo.ProducerBatchMaxBytesFn(batchLimit(limits)),
		kgo.ConsumerGroup(p.cfg.Group),
		kgo.ConsumeTopics(t.Decisions),
		kgo.TransactionalID("tollgate-aggregator-"+p.cfg.InstanceID),
		kgo.TransactionTimeout(p.cfg.TxnTimeout),
		kgo.SessionTimeout(p.cfg.SessionTimeout),
		kgo.HeartbeatInterval(min(3*time.Second, p.cfg.SessionTimeout/4)),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.RequireStableFetchOffsets(),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.OnPartitionsAssigned(p.assigned),
		kgo.OnPartitionsRevoked(p.revoked),
		kgo.OnPartitionsLost(p.revoked),
	)...)
	if err != nil {
		return nil, fmt.Errorf("consume: transact session: %w", err)
	}
	return &loop{p: p, sess: sess, adm: adm, out: p.outParts(ctx, adm), tables: map[int32]*part{},
		batch: batch{txns: map[int32]txn{}}, lastClose: p.cfg.Now()}, nil
}

// batchLimit is the producer's batch limit per topic: the limits read,
// else Kafka's default.
func batchLimit(limits map[string]int32) func(string) int32 {
	return func(topic string) int32 {
		if n, ok := limits[topic]; ok {
			return n
		}
		return defaultMaxMessageBytes
	}
}

// assigned and revoked are the group's callbacks: they queue the change
// for the loop (applyMembership).
func (p *Processor) assigned(_ context.Context, _ *kgo.Client, m map[string][]int32) {
	p.member(m[p.cfg.Topics.Decisions], true)
}

func (p *Processor) revoked(_ context.Context, _ *kgo.Client, m map[string][]int32) {
	p.member(m[p.cfg.Topics.Decisions], false)
}

// outParts reads the partition counts of the topics produced to besides
// the changelog (the configured count when Kafka does not say).
func (p *Processor) outParts(ctx context.Context, adm *kadm.Client) outParts {
	t := p.cfg.Topics
	out := outParts{usage: p.cfg.Partitions, penalties: p.cfg.Partitions, audit: p.cfg.Partitions}
	meta, err := adm.Metadata(ctx, t.Usage, t.Penalties, t.Audit)
	if err != nil {
		return out
	}
	for topic, dst := range map[string]*int32{t.Usage: &out.usage, t.Penalties: &out.penalties, t.Audit: &out.audit} {
		if n := len(meta.Topics[topic].Partitions); n > 0 {
			*dst = int32(n)
		}
	}
	return out
}

// close leaves the group at once so the partitions move without waiting
// for the session timeout. Should leaving fail (Kafka away), the member
// lingers until then: it is not another instance.
func (l *loop) close() {
	l.p.lastMember, _ = l.sess.Client().GroupMetadata()
	l.sess.Close()
}

// step polls once, applies what came to the batch, ticks when a tick is
// due, and commits the batch, unless the poll says a backlog is waiting:
// then the next poll is folded into the same transaction.
func (l *loop) step(ctx context.Context) error {
	p := l.p
	fs := l.poll(ctx)
	if ctx.Err() != nil {
		return nil
	}
	if p.applyMembership(l.tables) {
		// A revocation aborts the open transaction (the session refuses
		// to commit it): its changes go too.
		l.batch.discard()
	}
	now := p.cfg.Now()
	l.batch.open(now)
	if !fs.Empty() {
		p.busy(now)
	}
	polled, err := l.apply(ctx, fs, now)
	if err != nil {
		return err
	}
	l.batch.evaluate(now)
	if now.Sub(l.lastClose) >= p.cfg.CloseEvery {
		if err := l.tick(ctx, now); err != nil {
			return err
		}
	}
	if l.batch.events == 0 && !l.batch.changed() {
		p.idle()
		l.batch.discard()
		return nil
	}
	p.busy(now)
	if l.batch.folds(polled, now, &p.cfg) {
		return nil
	}
	return l.commit(ctx, now)
}

// poll waits for records at most CloseEvery, so that ticks come on time
// however idle the partitions.
func (l *loop) poll(ctx context.Context) kgo.Fetches {
	pollCtx, cancel := context.WithTimeout(ctx, l.p.cfg.CloseEvery)
	defer cancel()
	fs := l.sess.PollRecords(pollCtx, l.p.cfg.MaxPoll)
	fs.EachError(l.p.logFetchError)
	return fs
}

// logFetchError logs a failed fetch of the decisions topic (not the poll's
// own deadline).
func (p *Processor) logFetchError(_ string, q int32, err error) {
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
		p.log.Warn("decisions fetch failed", slog.Int("partition", int(q)), slog.String("error", err.Error()))
	}
}

// txn returns partition q's transaction in the batch, beginning it (and
// building q's tables from Pebble first, after an assignment).
func (l *loop) txn(ctx context.Context, q int32) (txn, error) {
	if x, ok := l.batch.txns[q]; ok {
		return x, nil
	}
	tab, ok := l.tables[q]
	if !ok {
		var err error
		if tab, err = l.p.restore(ctx, l.adm, q); err != nil {
			return txn{}, err
		}
		l.tables[q] = tab
	}
	x := txn{win: tab.win.Begin(), pen: tab.pen.Begin(), bad: &refusals{}}
	l.batch.txns[q] = x
	return x, nil
}

// apply applies a poll's records to the batch. It returns how many
// records came.
func (l *loop) apply(ctx context.Context, fs kgo.Fetches, now time.Time) (int, error) {
	polled := 0
	for _, f := range fs {
		for _, t := range f.Topics {
			for _, fp := range t.Partitions {
				if len(fp.Records) == 0 {
					continue
				}
				n, err := l.applyPartition(ctx, fp, now)
				polled += n
				if err != nil {
					return polled, err
				}
			}
		}
	}
	l.batch.events += polled
	return polled, nil
}

// applyPartition applies one partition's records to its transaction; it
// returns how many it read.
func (l *loop) applyPartition(ctx context.Context, fp kgo.FetchPartition, now time.Time) (int, error) {
	x, err := l.txn(ctx, fp.Partition)
	if err != nil {
		return 0, err
	}
	last := fp.Records[len(fp.Records)-1]
	l.p.m.lag.WithLabelValues(fmt.Sprint(fp.Partition)).Set(float64(max(0, fp.HighWatermark-last.Offset-1)))
	for i, r := range fp.Records {
		if err := l.applyRecord(x, fp.Partition, r, now); err != nil {
			return i + 1, err
		}
	}
	return len(fp.Records), nil
}

// applyRecord applies one record of partition q: a decision or a marker
// to the usage windows (and a counted decision to the detectors), a lift
// to the ladder. A record that is not a decision event, or carries a
// field out of its bounds, is counted and never applied: it is not an
// error, and the partition goes on.
func (l *loop) applyRecord(x txn, q int32, r *kgo.Record, now time.Time) error {
	p, ev := l.p, &l.ev
	nowSec := now.Unix()
	if err := decodeEvent(r.Value, ev); err != nil || (ev.Kind == 0 && !ev.Lift) {
		p.m.events.WithLabelValues("malformed").Inc()
		return nil
	}
	if reason, identity := check(ev, q, r.Timestamp, now); reason != "" {
		// A bad field of a well-identified event uses its number (it is
		// not missing); a bad identity touches no mark.
		if identity || ev.Lift || x.win.Refuse(&ev.Event, nowSec) {
			x.bad.add(reason, ev, r)
		}
		return nil
	}
	if ev.Lift {
		// A command: applying it twice changes nothing, so it needs no
		// sequence number (docs/aggregator.md).
		p.m.events.WithLabelValues("command").Inc()
		x.pen.Lift(abuse.Lift{KeyID: ev.KeyID, Tenant: ev.Tenant, TimeMicros: ev.TimeMicros,
			Actor: ev.Actor, Reason: ev.CmdReason}, now)
		return nil
	}
	applied, err := x.win.Apply(&ev.Event, nowSec)
	if err != nil {
		return err
	}
	if applied && ev.Kind == windows.KindDecision {
		d := abuse.Decision{KeyID: ev.KeyID, KeyPrefix: ev.KeyPrefix, Tenant: ev.Tenant, TimeMicros: ev.TimeMicros,
			Allowed: ev.Allowed, RetryAfter: ev.RetryAfter}
		if ev.Allowlisted {
			d.Reason = abuse.ReasonAllowlisted
		}
		x.pen.Observe(&d, now)
		if p.cfg.Observe != nil {
			p.cfg.Observe(&ev.Event)
		}
	}
	return nil
}

// tick runs every CloseEvery over every partition owned, idle or not:
// windows close and penalties step down without new decisions, and every
// 60th tick expires rows past their retention.
func (l *loop) tick(ctx context.Context, now time.Time) error {
	p := l.p
	nowSec := now.Unix()
	l.lastClose = now
	l.ticks++
	for _, q := range p.Owned() {
		if _, err := l.txn(ctx, q); err != nil {
			return err
		}
	}
	for q := range l.tables {
		x, err := l.txn(ctx, q)
		if err != nil {
			return err
		}
		if err := x.win.CloseDue(nowSec); err != nil {
			return err
		}
		x.pen.Tick(now)
		if l.ticks%60 == 1 {
			if err := p.expire(q, x.win, nowSec); err != nil {
				return err
			}
		}
	}
	p.gaugePenalties(l.tables, now)
	return nil
}

// expire deletes partition q's rows whose retention has passed: those in
// memory and, a bounded number per call, those only in Pebble.
func (p *Processor) expire(q int32, x *windows.Txn, nowSec int64) error {
	x.Expire(nowSec)
	budget := 10_000
	for _, g := range windows.All {
		cut := nowSec - int64(p.cfg.Windows.Retention[g]/time.Second)
		err := p.db.ExpiredRows(q, g, cut, func(k windows.RowKey) bool {
			x.ExpireRow(k, nowSec)
			budget--
			return budget > 0
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// commit ends the batch's transaction and counts the outcome. After a
// committed tick it evicts from memory what Pebble holds.
func (l *loop) commit(ctx context.Context, now time.Time) error {
	p := l.p
	committed, err := l.transact(ctx, &l.batch, now)
	l.batch.reset()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		p.m.txns.WithLabelValues("error").Inc()
		return &errSession{err}
	}
	if !committed {
		p.m.txns.WithLabelValues("aborted").Inc()
		return nil
	}
	p.m.txns.WithLabelValues("committed").Inc()
	p.committed(now)
	if l.ticks > 0 && now.Equal(l.lastClose) {
		l.evict()
	}
	return nil
}

// evict drops from memory the rows Pebble holds (materialized), and
// updates the gauges of what memory holds.
func (l *loop) evict() {
	p := l.p
	for q, tab := range l.tables {
		tab.win.Evict(p.mat.Next(q) - 1)
	}
	var n, keys int
	for _, tab := range l.tables {
		n += tab.win.Len()
		keys += tab.pen.Len()
	}
	p.m.rows.Set(float64(n))
	p.m.penaltyKeys.Set(float64(keys))
}
