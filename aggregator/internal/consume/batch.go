package consume

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"github.com/tollgate/tollgate/aggregator/internal/abuse"
	"github.com/tollgate/tollgate/aggregator/internal/audit"
	"github.com/tollgate/tollgate/aggregator/internal/state"
	"github.com/tollgate/tollgate/aggregator/internal/windows"
)

// part is the state of one decisions partition the loop owns: its usage
// windows and its keys' penalty state.
type part struct {
	win *windows.Table
	pen *abuse.Table
}

// txn is one transaction's changes to a part, and the records it refused.
type txn struct {
	win *windows.Txn
	pen *abuse.Txn
	bad *refusals
}

func (x txn) empty() bool { return x.win.Empty() && x.pen.Empty() && len(x.pen.Steps()) == 0 }

// batch is the work of one Kafka transaction: the changes of every
// partition polled or ticked since the last commit. One transaction spans
// the polls of up to CommitInterval (or MaxTxnRecords events): a row that
// many events touch is written to the changelog once per transaction, not
// once per poll (Kafka Streams' commit interval). A lull commits at once.
type batch struct {
	txns   map[int32]txn
	start  time.Time // when the first poll of the open transaction came
	events int       // records polled into it
}

// open notes when the transaction's first poll came.
func (b *batch) open(now time.Time) {
	if len(b.txns) == 0 {
		b.start = now
	}
}

// evaluate runs the detectors over what the batch observed.
func (b *batch) evaluate(now time.Time) {
	for _, x := range b.txns {
		x.pen.Evaluate(now)
	}
}

// changed reports whether any partition's transaction holds a change.
func (b *batch) changed() bool {
	for _, x := range b.txns {
		if !x.empty() {
			return true
		}
	}
	return false
}

// folds reports whether the next poll joins this transaction: a poll that
// came back (nearly) full means a backlog, while the transaction is
// younger than CommitInterval and smaller than MaxTxnRecords. Anything
// less is a lull, which commits at once.
func (b *batch) folds(polled int, now time.Time, cfg *Config) bool {
	backlog := polled >= cfg.MaxPoll/4
	return backlog && now.Sub(b.start) < cfg.CommitInterval && b.events < cfg.MaxTxnRecords
}

// discard drops the partitions' changes (a revocation aborts them, an
// idle poll has none).
func (b *batch) discard() { clear(b.txns) }

// reset empties the batch once its transaction has ended.
func (b *batch) reset() {
	clear(b.txns)
	b.events = 0
}

// produced gathers the produce results of one transaction; franz-go calls
// promise from its own goroutines.
type produced struct {
	changelog, usage string
	tooLarge         oversizedRollups

	mu      sync.Mutex
	written map[int32]int64 // the last changelog offset, per partition
	err     error           // the last produce error
}

func (r *produced) promise(rec *kgo.Record, err error) {
	if err != nil && rec.Topic == r.usage {
		r.tooLarge.note(rec, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.err = err
		return
	}
	if rec.Topic == r.changelog && rec.Offset > r.written[rec.Partition] {
		r.written[rec.Partition] = rec.Offset
	}
}

func (r *produced) failed() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// tally is what a transaction did, counted once it commits.
type tally struct {
	stats     windows.Stats
	published int
	truncated int
	skipped   int
	bad       []*refusals
	steps     []abuse.Step
	firings   map[string]int
}

func (t *tally) add(s windows.Stats) {
	t.stats.Applied += s.Applied
	t.stats.Duplicates += s.Duplicates
	t.stats.Late += s.Late
	t.stats.Missing += s.Missing
	t.stats.Expired += s.Expired
	t.stats.Held += s.Held
	t.stats.Discarded += s.Discarded
	t.stats.Accepted += s.Accepted
	t.stats.Filled += s.Filled
	t.stats.AfterClose += s.AfterClose
}

// transact produces the batch's changes and commits them with the
// consumed offsets in one Kafka transaction. The tables take the changes
// only when it reports committed.
func (l *loop) transact(ctx context.Context, b *batch, now time.Time) (bool, error) {
	p, t := l.p, l.p.cfg.Topics
	if err := l.sess.Begin(); err != nil {
		return false, fmt.Errorf("consume: begin transaction: %w", err)
	}
	res := &produced{changelog: t.Changelog, usage: t.Usage, written: map[int32]int64{}}
	done := &tally{firings: map[string]int{}}
	for q, tx := range b.txns {
		if err := l.produceWindows(ctx, q, tx, res, done, now); err != nil {
			return false, err
		}
		if err := l.producePenalties(ctx, q, tx, res, done, now); err != nil {
			return false, err
		}
	}
	if err := l.sess.Client().Flush(ctx); err != nil {
		return false, err
	}
	failed := res.failed()
	committed, err := l.sess.End(ctx, kgo.TransactionEndTry(failed == nil))
	if err != nil {
		return false, fmt.Errorf("consume: end transaction: %w", errors.Join(err, failed))
	}
	if failed != nil {
		p.log.Warn("transaction aborted: a record was not produced", slog.String("error", failed.Error()))
		p.limitRollups(res.tooLarge.largest)
	}
	if !committed {
		return false, nil
	}
	for q, x := range b.txns {
		x.win.Commit(res.written[q])
		x.pen.Commit()
	}
	p.account(done, now)
	return true, nil
}

// produceWindows produces partition q's changed rows and marks to the
// changelog, and its closed windows to the usage topic.
func (l *loop) produceWindows(ctx context.Context, q int32, tx txn, res *produced, done *tally, now time.Time) error {
	t := l.p.cfg.Topics
	done.add(tx.win.Stats())
	if tx.bad != nil {
		done.bad = append(done.bad, tx.bad)
	}
	for _, c := range tx.win.Changes() {
		rec := &kgo.Record{Topic: t.Changelog, Partition: q}
		switch {
		case c.Row != nil:
			rec.Key = state.RowKey(*c.Row)
			if !c.Deleted {
				rec.Value = state.RowValue(c.Value)
			}
		default:
			rec.Key = state.MarkKey(c.Source)
			if !c.Deleted {
				rec.Value = state.MarkValue(c.Mark)
			}
		}
		l.sess.Produce(ctx, rec, res.promise)
		if !c.Publish {
			continue
		}
		// Cut to fit the topic: one oversized window must not abort every
		// transaction (and freeze every rollup).
		k, v, cut, ok, err := fitRollup(*c.Row, &c.Value, now.Unix(), l.p.rollupLimit)
		if err != nil {
			return err
		}
		switch {
		case !ok:
			done.skipped++
			continue
		case cut:
			done.truncated++
		}
		l.sess.Produce(ctx, &kgo.Record{Topic: t.Usage, Partition: q % l.out.usage, Key: k, Value: v}, res.promise)
		done.published++
	}
	return nil
}

// producePenalties produces partition q's changed penalty states to the
// changelog, and its ladder steps to the penalties and audit topics.
func (l *loop) producePenalties(ctx context.Context, q int32, tx txn, res *produced, done *tally, now time.Time) error {
	t := l.p.cfg.Topics
	for _, c := range tx.pen.Changes() {
		rec := &kgo.Record{Topic: t.Changelog, Partition: q, Key: state.PenaltyKey(q, c.KeyID)}
		if !c.Deleted {
			rec.Value = state.PenaltyValue(c.State)
		}
		l.sess.Produce(ctx, rec, res.promise)
	}
	for _, st := range tx.pen.Steps() {
		pe, ae := stepRecords(st, now)
		pv, err := proto.Marshal(pe)
		if err != nil {
			return fmt.Errorf("consume: encode penalty event: %w", err)
		}
		l.sess.Produce(ctx, &kgo.Record{Topic: t.Penalties, Partition: q % l.out.penalties, Key: []byte(st.KeyID), Value: pv}, res.promise)
		ar, err := audit.Record(t.Audit, ae)
		if err != nil {
			return err
		}
		ar.Partition = q % l.out.audit
		l.sess.Produce(ctx, ar, res.promise)
		done.steps = append(done.steps, st)
	}
	for d, n := range tx.pen.Firings() {
		done.firings[d] += n
	}
	return nil
}

// account counts and logs what a committed transaction did.
func (p *Processor) account(done *tally, now time.Time) {
	for _, st := range done.steps {
		p.m.penalties.WithLabelValues(strconv.Itoa(st.Level), st.Action).Inc()
		p.log.Info("penalty step", slog.String("key_id", st.KeyID), slog.String("key_prefix", st.KeyPrefix),
			slog.Int("level", st.Level), slog.Int("previous_level", st.Previous), slog.String("action", st.Action),
			slog.String("issued_by", st.IssuedBy), slog.String("reason", st.Reason))
	}
	for d, n := range done.firings {
		p.m.firings.WithLabelValues(d).Add(float64(n))
	}
	stats := done.stats
	p.m.events.WithLabelValues("applied").Add(float64(stats.Applied))
	p.m.events.WithLabelValues("duplicate").Add(float64(stats.Duplicates))
	p.m.late.Add(float64(stats.Late))
	p.m.missing.Add(float64(stats.Missing))
	p.m.expired.Add(float64(stats.Expired))
	p.m.published.Add(float64(done.published))
	p.m.poison.oversized.WithLabelValues("truncated").Add(float64(done.truncated))
	p.m.poison.oversized.WithLabelValues("skipped").Add(float64(done.skipped))
	if done.truncated+done.skipped > 0 {
		p.log.Warn("usage records too large for the usage topic were cut", slog.Int("truncated", done.truncated),
			slog.Int("skipped", done.skipped), slog.Int("max_bytes", p.rollupLimit))
	}
	p.countPoison(done.bad, stats)
	p.poison.flush(p.log, now)
}
