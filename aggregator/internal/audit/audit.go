// Package audit keeps Tollgate's audit trail: every penalty,
// blocklist, override and rule change with who, why, when, before/after
// and evidence.
//
// Entries are appended to the retained topic tollgate.audit.v1 (Writer, or
// inside the aggregator's Kafka transaction for penalties) and every
// aggregator instance materializes the whole topic into its state
// (Store.Tail, through package state, which owns Pebble), so no entry
// depends on one disk; the state's snapshots are the audit snapshots, and
// Store reads them offline as well as live.
package audit

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"github.com/tollgate/tollgate/aggregator/internal/state"
	"github.com/tollgate/tollgate/internal/kafkalog"
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
// entry's key is its time and id, so a duplicate overwrites itself). A
// record that is not an entry is logged and skipped.
func (s *Store) Apply(recs []TopicRecord) error {
	out := make([]state.AuditRecord, 0, len(recs))
	for _, r := range recs {
		ar := state.AuditRecord{Partition: r.Partition, Offset: r.Offset}
		if !r.Control && len(r.Value) > 0 {
			var e tollgatev1.AuditEntry
			if err := proto.Unmarshal(r.Value, &e); err != nil || e.Id == "" {
				s.log.Warn("audit record skipped: not an AuditEntry", slog.Int("partition", int(r.Partition)), slog.Int64("offset", r.Offset))
			} else {
				ar.Entry, ar.TimeMicros, ar.ID, ar.Subject, ar.Value = true, e.TimeUnixMicros, e.Id, e.Subject, r.Value
			}
		}
		out = append(out, ar)
	}
	if err := s.db.MaterializeAudit(out); err != nil {
		return fmt.Errorf("audit: %w", err)
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
	var out []*tollgatev1.AuditEntry
	err := s.db.AuditEntries(q.Subject, q.From, q.To, func(v []byte) (bool, error) {
		var e tollgatev1.AuditEntry
		if err := proto.Unmarshal(v, &e); err != nil {
			return false, fmt.Errorf("audit: decode: %w", err)
		}
		if q.Kind == "" || e.Kind == q.Kind {
			out = append(out, &e)
		}
		return len(out) < q.Limit, nil
	})
	return out, err
}

// TailConfig says where the audit topic is.
type TailConfig struct {
	Brokers []string
	Topic   string
}

// Tail materializes the audit topic into s until ctx is done, when it
// returns nil: once the topic exists (the aggregator's processor creates
// it), a read_committed consumer of every partition, from the offsets
// Pebble holds. Tail owns its one Kafka client, closed when it returns.
func (s *Store) Tail(ctx context.Context, cfg TailConfig) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(cfg.Brokers...), kgo.WithLogger(kafkalog.New(s.log)),
		kgo.MetadataMinAge(250*time.Millisecond), kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords())
	if err != nil {
		return fmt.Errorf("audit: kafka client: %w", err)
	}
	defer cl.Close()
	parts := awaitTopic(ctx, kadm.NewClient(cl), cfg.Topic)
	if ctx.Err() != nil {
		return nil
	}
	offsets := map[int32]kgo.Offset{}
	for p := range parts {
		off, err := s.db.Offset(state.TopicAudit, p)
		if err != nil {
			return fmt.Errorf("audit: %w", err)
		}
		offsets[p] = kgo.NewOffset().At(off)
	}
	cl.AddConsumePartitions(map[string]map[int32]kgo.Offset{cfg.Topic: offsets})
	return s.tail(ctx, cl)
}

// awaitTopic returns the topic's partition count once Kafka lists it with
// partitions, polling every 200ms until ctx is done (then 0).
func awaitTopic(ctx context.Context, adm *kadm.Client, topic string) int32 {
	for {
		meta, err := adm.Metadata(ctx, topic)
		if err == nil {
			if n := int32(len(meta.Topics[topic].Partitions)); n > 0 {
				return n
			}
		}
		select {
		case <-ctx.Done():
			return 0
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// tail polls cl and materializes what it returns until ctx is done.
func (s *Store) tail(ctx context.Context, cl *kgo.Client) error {
	var recs []TopicRecord
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil
		}
		fs.EachError(s.logFetchError)
		recs = recs[:0]
		for it := fs.RecordIter(); !it.Done(); {
			r := it.Next()
			recs = append(recs, TopicRecord{Partition: r.Partition, Offset: r.Offset, Value: r.Value, Control: r.Attrs.IsControl()})
		}
		if err := s.Apply(recs); err != nil {
			return err
		}
	}
}

func (s *Store) logFetchError(_ string, p int32, err error) {
	s.log.Warn("audit fetch failed", slog.Int("partition", int(p)), slog.String("error", err.Error()))
}
