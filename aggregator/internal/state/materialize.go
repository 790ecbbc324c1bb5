package state

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tollgate/tollgate/aggregator/internal/abuse"
	"github.com/tollgate/tollgate/aggregator/internal/windows"
)

// Materializer tails the changelog into a DB: it is the only writer of
// rows, marks and penalty states, and it knows, per partition, the next
// offset the DB holds, so that a new owner of a partition can wait until
// the DB reflects every committed transaction of the previous owner
// (Restore). Create it with NewMaterializer, call Resume, then Run once;
// its other methods are safe from any goroutine.
type Materializer struct {
	db      *DB
	log     *slog.Logger
	records prometheus.Counter

	mu       sync.Mutex
	next     map[int32]int64 // the next changelog offset the DB holds, per partition
	want     map[int32]int64 // the offsets Run's start and Restore wait for, per partition
	advanced chan struct{}   // closed and replaced when next moves
	ready    bool            // every partition has reached Run's start
}

// idlePoll is how long Run waits for changelog records before it looks
// whether the offsets still awaited can be read at all (skipUnreadable).
const idlePoll = time.Second

// NewMaterializer returns the materializer of db. records, when not nil,
// counts the changelog records materialized; log may be nil.
func NewMaterializer(db *DB, log *slog.Logger, records prometheus.Counter) *Materializer {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Materializer{db: db, log: log, records: records, next: map[int32]int64{}, want: map[int32]int64{},
		advanced: make(chan struct{})}
}

// Resume returns, for each of partitions, the changelog offset the DB
// holds up to: where the consumer of the changelog that Run reads starts.
func (m *Materializer) Resume(partitions map[int32]bool) (map[int32]int64, error) {
	out := make(map[int32]int64, len(partitions))
	for q := range partitions {
		off, err := m.db.Offset(TopicChangelog, q)
		if err != nil {
			return nil, err
		}
		out[q] = off
		m.advance(q, off)
	}
	return out, nil
}

// Ready reports whether every partition has reached the offsets Run
// started with: the DB reflects the changelog as it was then.
func (m *Materializer) Ready() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ready
}

// Next returns the next changelog offset of partition q the DB holds.
func (m *Materializer) Next(q int32) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.next[q]
}

// advance records that the DB holds partition q up to off (or, for 0,
// nothing of it).
func (m *Materializer) advance(q int32, off int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if off > m.next[q] || off == 0 {
		m.next[q] = off
		close(m.advanced)
		m.advanced = make(chan struct{})
	}
}

// caughtUp reports whether every partition has reached start, and
// records it.
func (m *Materializer) caughtUp(start map[int32]int64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for q, off := range start {
		m.want[q] = max(m.want[q], off)
	}
	for q, off := range start {
		if m.next[q] < off {
			return false
		}
	}
	m.ready = true
	return true
}

// Run materializes what cl polls (a read_committed consumer of the
// changelog partitions from Resume's offsets, keeping control records)
// until ctx is done, when it returns nil. ready is called once, when every
// partition has reached start (their last stable offsets when Run
// started). topic is the changelog's name; reader, a client that
// consumes nothing, reads the gaps described below (cl would queue those
// reads behind its own long-polling fetches).
//
// A partition counts as caught up to an offset when the DB holds every
// record a read_committed reader can read before it. Kafka ends every
// transaction with a marker, which cl keeps, so the records read reach the
// last stable offset by themselves; a broker that recovered from a crash
// may abort the transactions left open without writing their markers, and
// nothing is ever read at their offsets. When the changelog is idle and a
// partition is still short of an offset awaited, Run reads the gap itself
// and skips what is aborted (skipUnreadable).
func (m *Materializer) Run(ctx context.Context, cl, reader *kgo.Client, topic string, start map[int32]int64, ready func()) error {
	isReady := m.caughtUp(start)
	if isReady {
		m.restored(start, ready)
	}
	var recs []Record
	next := map[int32]int64{}
	for {
		pollCtx, cancel := context.WithTimeout(ctx, idlePoll)
		fs := cl.PollFetches(pollCtx)
		idle := pollCtx.Err() != nil
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		fs.EachError(func(t string, q int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				m.logFetchError(t, q, err)
			}
		})
		recs = changelogRecords(fs, recs[:0])
		if len(recs) == 0 {
			if idle {
				m.skipUnreadable(ctx, reader, topic)
			}
		} else {
			if err := m.db.Materialize(recs); err != nil {
				return err
			}
			if m.records != nil {
				m.records.Add(float64(len(recs)))
			}
			clear(next)
			for _, r := range recs {
				next[r.Partition] = max(next[r.Partition], r.Offset+1)
			}
			for q, off := range next {
				m.advance(q, off)
			}
		}
		if !isReady && m.caughtUp(start) {
			isReady = true
			m.restored(start, ready)
		}
	}
}

// behind returns the partitions whose next offset is short of the one
// awaited, with both.
func (m *Materializer) behind() map[int32][2]int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out map[int32][2]int64
	for q, want := range m.want {
		if next := m.next[q]; next < want {
			if out == nil {
				out = map[int32][2]int64{}
			}
			out[q] = [2]int64{next, want}
		}
	}
	return out
}

// skipUnreadable advances each partition short of an awaited offset over
// the offsets a read_committed reader can never read (records of aborted
// transactions), up to the first record it can read. It asks the
// partition's leader directly, since cl delivers no fetch that yields no
// record. Failures are logged and left for the next idle poll.
func (m *Materializer) skipUnreadable(ctx context.Context, cl *kgo.Client, topic string) {
	gaps := m.behind()
	if len(gaps) == 0 {
		return
	}
	md, err := kadm.NewClient(cl).Metadata(ctx, topic)
	if err == nil {
		err = md.Topics.Error()
	}
	if err != nil {
		m.log.Debug("changelog metadata for the restore failed", slog.String("error", err.Error()))
		return
	}
	td := md.Topics[topic]
	for q, gap := range gaps {
		p, ok := td.Partitions[q]
		if !ok || p.Leader < 0 {
			continue
		}
		to, err := unreadableUntil(ctx, cl.Broker(int(p.Leader)), topic, td.ID, q, gap[0], gap[1])
		if err != nil {
			m.log.Debug("changelog gap read failed", slog.Int("partition", int(q)), slog.String("error", err.Error()))
			continue
		}
		if to > gap[0] {
			m.log.Info("changelog offsets skipped: transactions aborted without their markers",
				slog.Int("partition", int(q)), slog.Int64("from", gap[0]), slog.Int64("to", to))
			m.advance(q, to)
		}
	}
}

// unreadableUntil returns the end of the run of offsets from from in which
// a read_committed reader that keeps control records reads nothing: the
// offset of the first record it can read, or target when there is none
// before it (or where a few fetches got to), from itself when from is
// readable.
func unreadableUntil(ctx context.Context, br *kgo.Broker, topic string, id kadm.TopicID, q int32, from, target int64) (int64, error) {
	off := from
	for range 8 {
		if off >= target {
			return target, nil
		}
		req := kmsg.NewPtrFetchRequest()
		req.ReplicaID = -1
		req.MaxBytes = 1 << 20
		req.IsolationLevel = 1
		req.SessionEpoch = -1
		rt := kmsg.NewFetchRequestTopic()
		rt.Topic, rt.TopicID = topic, id
		rp := kmsg.NewFetchRequestTopicPartition()
		rp.Partition, rp.FetchOffset, rp.PartitionMaxBytes = q, off, 1<<20
		rp.CurrentLeaderEpoch, rp.LogStartOffset = -1, -1
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		kresp, err := br.Request(ctx, req)
		if err != nil {
			return off, fmt.Errorf("state: fetch changelog partition %d at %d: %w", q, off, err)
		}
		resp := kresp.(*kmsg.FetchResponse)
		if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
			return off, fmt.Errorf("state: fetch changelog partition %d at %d: a response without the partition", q, off)
		}
		part := &resp.Topics[0].Partitions[0]
		fp, after := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{
			KeepControlRecords: true,
			Offset:             off,
			IsolationLevel:     kgo.ReadCommitted(),
			Topic:              topic,
			Partition:          q,
		}, part, kgo.DefaultDecompressor(), nil)
		if fp.Err != nil {
			return off, fmt.Errorf("state: fetch changelog partition %d at %d: %w", q, off, fp.Err)
		}
		if len(fp.Records) > 0 {
			return fp.Records[0].Offset, nil
		}
		if after <= off {
			return off, nil
		}
		off = after
	}
	return min(off, target), nil
}

func (m *Materializer) restored(start map[int32]int64, ready func()) {
	ready()
	m.log.Info("state restored", slog.Int("partitions", len(start)))
}

func (m *Materializer) logFetchError(_ string, q int32, err error) {
	m.log.Warn("changelog fetch failed", slog.Int("partition", int(q)), slog.String("error", err.Error()))
}

// changelogRecords appends the records of fs to recs.
func changelogRecords(fs kgo.Fetches, recs []Record) []Record {
	for _, f := range fs {
		for _, t := range f.Topics {
			for _, p := range t.Partitions {
				for _, r := range p.Records {
					rec := Record{Partition: r.Partition, Offset: r.Offset, Key: r.Key, Control: r.Attrs.IsControl()}
					if len(r.Value) > 0 {
						rec.Value = r.Value
					}
					recs = append(recs, rec)
				}
			}
		}
	}
	return recs
}

// Partition is what a new owner of a decisions partition needs in memory:
// its unpublished rows, its sources' marks and its keys' penalty states.
type Partition struct {
	Open      map[windows.RowKey]windows.Row
	Marks     map[windows.Source]windows.Mark
	Penalties map[string]abuse.State
}

// Restore waits until the DB holds partition q's changelog up to target
// (its last stable offset: every transaction its previous owner
// committed), then loads what a new owner of q needs.
func (m *Materializer) Restore(ctx context.Context, q int32, target int64) (Partition, error) {
	if err := m.wait(ctx, q, target); err != nil {
		return Partition{}, err
	}
	open, marks, err := m.db.LoadPartition(q)
	if err != nil {
		return Partition{}, err
	}
	pens, err := m.db.LoadPenalties(q)
	if err != nil {
		return Partition{}, err
	}
	return Partition{Open: open, Marks: marks, Penalties: pens}, nil
}

// wait blocks until the DB holds partition q's changelog up to target.
func (m *Materializer) wait(ctx context.Context, q int32, target int64) error {
	m.mu.Lock()
	m.want[q] = max(m.want[q], target)
	m.mu.Unlock()
	for {
		m.mu.Lock()
		off, ch := m.next[q], m.advanced
		m.mu.Unlock()
		if off >= target {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("state: restore partition %d: %w", q, ctx.Err())
		}
	}
}
