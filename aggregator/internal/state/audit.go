package state

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// The audit log's key spaces: entries by time, and an index by subject.
//
//	a time(8) id → entry
//	A len subject time(8) id → (index)
//
// A time is Unix microseconds with the sign bit flipped, big-endian, so
// that keys sort by time.
const (
	spaceAuditByTime    = 'a'
	spaceAuditBySubject = 'A'
)

// AuditRecord is one audit topic record to materialize. Entry is false
// for a transaction marker or a record that is not an audit entry: only
// its offset counts.
type AuditRecord struct {
	Partition int32
	Offset    int64
	Entry     bool
	// The entry's time (Unix microseconds), id and subject key it; Value
	// is the encoded entry, stored as is.
	TimeMicros int64
	ID         string
	Subject    string
	Value      []byte
}

func auditTime(micros int64) []byte {
	return binary.BigEndian.AppendUint64(nil, uint64(micros)^(1<<63))
}

func auditTimeKey(r *AuditRecord) []byte {
	b := append([]byte{spaceAuditByTime}, auditTime(r.TimeMicros)...)
	return append(b, r.ID...)
}

func auditSubjectPrefix(subject string) []byte {
	b := binary.AppendUvarint([]byte{spaceAuditBySubject}, uint64(len(subject)))
	return append(b, subject...)
}

func auditSubjectKey(r *AuditRecord) []byte {
	b := append(auditSubjectPrefix(r.Subject), auditTime(r.TimeMicros)...)
	return append(b, r.ID...)
}

// MaterializeAudit applies audit topic records, in offset order per
// partition, in one batch together with the partitions' next offsets;
// records below a partition's recorded offset are skipped (replays are
// harmless, and an entry's key is its time and id, so a duplicate
// overwrites itself).
func (d *DB) MaterializeAudit(recs []AuditRecord) error {
	return materialize(d, TopicAudit, "materialize audit", recs, func(r *AuditRecord) (int32, int64) { return r.Partition, r.Offset },
		func(b *pebble.Batch, r *AuditRecord) error {
			if !r.Entry {
				return nil
			}
			if err := b.Set(auditTimeKey(r), r.Value, nil); err != nil {
				return err
			}
			return b.Set(auditSubjectKey(r), nil, nil)
		})
}

// AuditEntries calls fn with each encoded audit entry of subject (any
// when "") whose time is in [from, to) (zero: unbounded), oldest first,
// until fn returns false or an error. The bytes are valid only during the
// call.
func (d *DB) AuditEntries(subject string, from, to time.Time, fn func(entry []byte) (bool, error)) error {
	lo := uint64(from.UnixMicro()) ^ (1 << 63)
	if from.IsZero() {
		lo = 0
	}
	hi := uint64(1<<64 - 1)
	if !to.IsZero() {
		hi = uint64(to.UnixMicro()) ^ (1 << 63)
	}
	prefix := []byte{spaceAuditByTime}
	if subject != "" {
		prefix = auditSubjectPrefix(subject)
	}
	lower := binary.BigEndian.AppendUint64(bytes.Clone(prefix), lo)
	upper := binary.BigEndian.AppendUint64(bytes.Clone(prefix), hi)
	stop := errors.New("stop")
	err := d.scan(lower, upper, func(k, v []byte) error {
		if subject != "" {
			primary := append([]byte{spaceAuditByTime}, k[len(prefix):]...)
			pv, closer, err := d.db.Get(primary)
			if errors.Is(err, pebble.ErrNotFound) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("state: read audit entry: %w", err)
			}
			defer closer.Close()
			v = pv
		}
		more, err := fn(v)
		if err == nil && !more {
			return stop
		}
		return err
	})
	if errors.Is(err, stop) {
		return nil
	}
	return err
}
