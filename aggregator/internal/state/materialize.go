package state

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

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
	advanced chan struct{}   // closed and replaced when next moves
	ready    bool            // every partition has reached Run's start
}

// NewMaterializer returns the materializer of db. records, when not nil,
// counts the changelog records materialized; log may be nil.
func NewMaterializer(db *DB, log *slog.Logger, records prometheus.Counter) *Materializer {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Materializer{db: db, log: log, records: records, next: map[int32]int64{}, advanced: make(chan struct{})}
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
// started).
func (m *Materializer) Run(ctx context.Context, cl *kgo.Client, start map[int32]int64, ready func()) error {
	isReady := m.caughtUp(start)
	if isReady {
		m.restored(start, ready)
	}
	var recs []Record
	next := map[int32]int64{}
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil
		}
		fs.EachError(m.logFetchError)
		recs = changelogRecords(fs, recs[:0])
		if len(recs) == 0 {
			continue
		}
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
		if !isReady && m.caughtUp(start) {
			isReady = true
			m.restored(start, ready)
		}
	}
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
