// Package audit keeps Tollgate's audit trail: every penalty,
// blocklist, override and rule change with who, why, when, before/after
// and evidence.
//
// Entries are appended to the retained topic tollgate.audit.v1 (Writer, or
// inside the aggregator's Kafka transaction for penalties) and every
// aggregator instance materializes the whole topic into its Pebble (Tailer
// and Store), so no entry depends on one disk; Pebble checkpoints of the
// aggregator's store are the audit snapshots, and Store reads them offline
// as well as live.
package audit

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"github.com/tollgate/tollgate/aggregator/internal/state"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// Kinds of entries.
const (
	KindRules     = "rules"
	KindRollback  = "rollback"
	KindBlocklist = "blocklist"
	KindAllowlist = "allowlist"
	KindOverride  = "override"
	KindPenalty   = "penalty"
	KindReset     = "reset"
	KindQuota     = "quota"
)

// PenaltyState is the JSON of a key's ladder state in the before and after
// of a penalty step's entry (kind "penalty", subject the key_id).
type PenaltyState struct {
	Level  int    `json:"level"`
	Action string `json:"action"` // what the level enforces: none, reduced_limit, cooldown, blocklist
	// Change is the step (after only): reduced_limit, cooldown, blocklist,
	// step_down or lifted.
	Change    string  `json:"change,omitempty"`
	Step      uint64  `json:"step,omitempty"`
	Factor    float64 `json:"factor,omitempty"`
	Enforced  bool    `json:"enforced,omitempty"`
	ExpiresAt string  `json:"expires_at,omitempty"` // RFC 3339
}

// Key spaces in the aggregator's Pebble (see package state).
const (
	spaceByTime    = 'a' // a time(8) id → entry
	spaceBySubject = 'A' // A len subject time(8) id → (index)
)

// NewID returns a new entry id: its time in microseconds and 8 random
// bytes, hex (sortable by time).
func NewID(t time.Time) string {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], uint64(t.UnixMicro()))
	_, _ = rand.Read(b[8:])
	return hex.EncodeToString(b[:])
}

// Complete fills an entry's id and time when they are empty.
func Complete(e *tollgatev1.AuditEntry, now time.Time) {
	if e.TimeUnixMicros == 0 {
		e.TimeUnixMicros = now.UnixMicro()
	}
	if e.Id == "" {
		e.Id = NewID(time.UnixMicro(e.TimeUnixMicros))
	}
}

// Record returns the Kafka record of an entry for topic.
func Record(topic string, e *tollgatev1.AuditEntry) (*kgo.Record, error) {
	v, err := proto.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("audit: encode: %w", err)
	}
	return &kgo.Record{Topic: topic, Key: []byte(e.Subject), Value: v}, nil
}

// Writer appends entries to the audit topic, one acknowledged produce
// each, so an operator change is answered only once its entry is durable.
type Writer struct {
	cl    *kgo.Client
	topic string
}

// NewWriter returns a writer producing with cl (which the caller owns).
func NewWriter(cl *kgo.Client, topic string) *Writer { return &Writer{cl: cl, topic: topic} }

// Write completes e and appends it.
func (w *Writer) Write(ctx context.Context, e *tollgatev1.AuditEntry) error {
	Complete(e, time.Now())
	r, err := Record(w.topic, e)
	if err != nil {
		return err
	}
	if err := w.cl.ProduceSync(ctx, r).FirstErr(); err != nil {
		return fmt.Errorf("audit: write: %w", err)
	}
	return nil
}

// Store is the materialized audit log in the aggregator's Pebble.
type Store struct {
	db  *state.DB
	log *slog.Logger
}

// NewStore returns the audit log kept in db.
func NewStore(db *state.DB, log *slog.Logger) *Store {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Store{db: db, log: log}
}

func timeKey(e *tollgatev1.AuditEntry) []byte {
	b := []byte{spaceByTime}
	b = binary.BigEndian.AppendUint64(b, uint64(e.TimeUnixMicros)^(1<<63))
	return append(b, e.Id...)
}

func subjectKey(e *tollgatev1.AuditEntry) []byte {
	b := []byte{spaceBySubject}
	b = binary.AppendUvarint(b, uint64(len(e.Subject)))
	b = append(b, e.Subject...)
	b = binary.BigEndian.AppendUint64(b, uint64(e.TimeUnixMicros)^(1<<63))
	return append(b, e.Id...)
}

// TopicRecord is one audit topic record to materialize.
type TopicRecord struct {
	Partition int32
	Offset    int64
	Value     []byte
	Control   bool
}

// Apply materializes audit topic records, in offset order per partition,
// with the partitions' next offsets, in one batch; records below a
// partition's recorded offset are skipped (replays are harmless, and an
// entry's key is its time and id, so a duplicate overwrites itself).
func (s *Store) Apply(recs []TopicRecord) error {
	if len(recs) == 0 {
		return nil
	}
	db := s.db.Pebble()
	b := db.NewBatch()
	defer b.Close()
	next := map[int32]int64{}
	for _, r := range recs {
		from, ok := next[r.Partition]
		if !ok {
			var err error
			if from, err = s.db.Offset(state.TopicAudit, r.Partition); err != nil {
				return err
			}
		}
		if r.Offset < from {
			next[r.Partition] = from
			continue
		}
		next[r.Partition] = r.Offset + 1
		if r.Control || len(r.Value) == 0 {
			continue
		}
		var e tollgatev1.AuditEntry
		if err := proto.Unmarshal(r.Value, &e); err != nil || e.Id == "" {
			s.log.Warn("audit record skipped: not an AuditEntry", slog.Int("partition", int(r.Partition)), slog.Int64("offset", r.Offset))
			continue
		}
		if err := b.Set(timeKey(&e), r.Value, nil); err != nil {
			return err
		}
		if err := b.Set(subjectKey(&e), nil, nil); err != nil {
			return err
		}
	}
	for p, off := range next {
		if err := b.Set(state.OffsetKey(state.TopicAudit, p), state.EncodeOffset(off), nil); err != nil {
			return err
		}
	}
	if err := db.Apply(b, pebble.NoSync); err != nil {
		return fmt.Errorf("audit: materialize: %w", err)
	}
	return nil
}

// Query selects entries.
type Query struct {
	Subject string // a key_id, "rules", …; empty: any
	Kind    string // empty: any
	From    time.Time
	To      time.Time // zero: no bound
	Limit   int       // default 1000
}

// Query returns the entries q selects, oldest first.
func (s *Store) Query(q Query) ([]*tollgatev1.AuditEntry, error) {
	if q.Limit <= 0 {
		q.Limit = 1000
	}
	from := uint64(q.From.UnixMicro()) ^ (1 << 63)
	if q.From.IsZero() {
		from = 0
	}
	to := uint64(1<<64 - 1)
	if !q.To.IsZero() {
		to = uint64(q.To.UnixMicro()) ^ (1 << 63)
	}
	var prefix []byte
	if q.Subject != "" {
		prefix = binary.AppendUvarint([]byte{spaceBySubject}, uint64(len(q.Subject)))
		prefix = append(prefix, q.Subject...)
	} else {
		prefix = []byte{spaceByTime}
	}
	lower := binary.BigEndian.AppendUint64(bytes.Clone(prefix), from)
	upper := binary.BigEndian.AppendUint64(bytes.Clone(prefix), to)
	db := s.db.Pebble()
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var out []*tollgatev1.AuditEntry
	for it.First(); it.Valid() && len(out) < q.Limit; it.Next() {
		v := it.Value()
		if q.Subject != "" {
			k := append([]byte{spaceByTime}, it.Key()[len(prefix):]...)
			pv, closer, err := db.Get(k)
			if errors.Is(err, pebble.ErrNotFound) {
				continue
			}
			if err != nil {
				return nil, err
			}
			v = bytes.Clone(pv)
			_ = closer.Close()
		}
		var e tollgatev1.AuditEntry
		if err := proto.Unmarshal(v, &e); err != nil {
			return nil, fmt.Errorf("audit: decode: %w", err)
		}
		if q.Kind != "" && e.Kind != q.Kind {
			continue
		}
		out = append(out, &e)
	}
	return out, it.Error()
}

// Tail materializes the audit topic into s until ctx is done: a
// read_committed consumer of every partition, from the offsets Pebble
// holds. It owns cl's consumption (create cl with ConsumePartitions from
// Offsets).
func (s *Store) Tail(ctx context.Context, cl *kgo.Client) error {
	var recs []TopicRecord
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil
		}
		fs.EachError(func(_ string, p int32, err error) {
			s.log.Warn("audit fetch failed", slog.Int("partition", int(p)), slog.String("error", err.Error()))
		})
		recs = recs[:0]
		fs.EachRecord(func(r *kgo.Record) {
			recs = append(recs, TopicRecord{Partition: r.Partition, Offset: r.Offset, Value: r.Value, Control: r.Attrs.IsControl()})
		})
		if err := s.Apply(recs); err != nil {
			return err
		}
	}
}

// Offsets returns where Tail must resume for each of the topic's
// partitions.
func (s *Store) Offsets(topic string, partitions int32) (map[string]map[int32]kgo.Offset, error) {
	m := map[int32]kgo.Offset{}
	for p := range partitions {
		off, err := s.db.Offset(state.TopicAudit, p)
		if err != nil {
			return nil, err
		}
		m[p] = kgo.NewOffset().At(off)
	}
	return map[string]map[int32]kgo.Offset{topic: m}, nil
}
