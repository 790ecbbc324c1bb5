// Package state owns the aggregator's Pebble store — opening it, every
// write, restoring a partition from it, snapshots — as each instance's
// local materialization of the changelog topic (usage rows, deduplication
// marks and the penalty state of keys, of every partition) and of the
// audit topic, with each topic's offsets written in the same Pebble batch
// as the state they reflect, the indexes reports need, and consistent
// checkpoints.
//
// The changelog is the truth. Pebble is rebuilt from it: the Materializer
// is the only writer of rows, marks and penalty states, tailing the
// changelog with read_committed; the processor reads through it (Row,
// Materializer.Restore) and never writes it. A DB made against another
// Kafka cluster or topic is wiped on open (CheckIdentity), so a reused
// data directory never mixes two histories.
//
// Keys (see codec.go): rows are ordered by tenant, granularity and window
// start so a tenant's report is one range scan; an index by key_id serves
// key reports, one by window end serves retention, and one of unpublished
// rows lets a new owner of a partition find the windows it must close.
//
// A DB is safe for concurrent use.
package state

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"

	"github.com/tollgate/tollgate/aggregator/internal/abuse"
	"github.com/tollgate/tollgate/aggregator/internal/windows"
)

// Errors.
var (
	// ErrBadCursor is returned for a continuation token this package did
	// not write.
	ErrBadCursor = errors.New("state: bad cursor")
)

// DB is an aggregator instance's Pebble store.
type DB struct {
	db  *pebble.DB
	log *slog.Logger
}

// Open opens (creating) the store in dir. log may be nil.
func Open(dir string, log *slog.Logger) (*DB, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	db, err := pebble.Open(dir, options(log, false))
	if err != nil {
		return nil, fmt.Errorf("state: open %s: %w", dir, err)
	}
	return &DB{db: db, log: log}, nil
}

// options are the store's Pebble options: bloom filters on every level,
// because the processor looks up rows that mostly do not exist (the first
// event of a window), and a miss must not read sstable blocks.
func options(log *slog.Logger, readOnly bool) *pebble.Options {
	o := &pebble.Options{Logger: pebbleLogger{log}, ReadOnly: readOnly}
	for i := range o.Levels {
		o.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	return o
}

// OpenReadOnly opens a checkpoint (or a stopped instance's store) without
// writing to it.
func OpenReadOnly(dir string, log *slog.Logger) (*DB, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if _, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("state: open %s: %w", dir, err)
	}
	db, err := pebble.Open(dir, options(log, true))
	if err != nil {
		return nil, fmt.Errorf("state: open %s: %w", dir, err)
	}
	return &DB{db: db, log: log}, nil
}

// Close closes the store.
func (d *DB) Close() error { return d.db.Close() }

// Checkpoint writes a consistent snapshot of the store into dir, which must
// not exist.
func (d *DB) Checkpoint(dir string) error {
	if err := d.db.Checkpoint(dir, pebble.WithFlushedWAL()); err != nil {
		return fmt.Errorf("state: checkpoint %s: %w", dir, err)
	}
	return nil
}

// CheckIdentity compares id (the Kafka cluster and changelog topic the
// store is a materialization of) with the one recorded. When they differ,
// everything is deleted and id recorded: the store is rebuilt from the new
// changelog. It reports whether it wiped anything.
func (d *DB) CheckIdentity(id string) (bool, error) {
	cur, closer, err := d.db.Get(metaKey("identity"))
	switch {
	case err == nil:
		same := string(cur) == id
		_ = closer.Close()
		if same {
			return false, nil
		}
	case !errors.Is(err, pebble.ErrNotFound):
		return false, fmt.Errorf("state: read identity: %w", err)
	}
	wiped := err == nil
	if !wiped {
		// A store without an identity may still hold rows (a crash before
		// the first identity write): wipe unless it is empty.
		it, ierr := d.db.NewIter(nil)
		if ierr != nil {
			return false, ierr
		}
		wiped = it.First()
		_ = it.Close()
	}
	b := d.db.NewBatch()
	defer b.Close()
	if wiped {
		if err := b.DeleteRange([]byte{0}, []byte{0xff, 0xff}, nil); err != nil {
			return false, err
		}
	}
	if err := b.Set(metaKey("identity"), []byte(id), nil); err != nil {
		return false, err
	}
	if err := d.db.Apply(b, pebble.Sync); err != nil {
		return false, fmt.Errorf("state: write identity: %w", err)
	}
	return wiped, nil
}

// Record is one changelog record.
type Record struct {
	Partition int32
	Offset    int64
	Key       []byte
	Value     []byte // nil: a tombstone
	// Control marks a transaction marker: only its offset counts.
	Control bool
}

// Materialize applies changelog records, in offset order per partition, in
// one batch together with the next offset of each partition. Records below
// a partition's recorded offset are skipped, so replaying is harmless.
func (d *DB) Materialize(recs []Record) error {
	return materialize(d, TopicChangelog, "materialize", recs, func(r *Record) (int32, int64) { return r.Partition, r.Offset },
		func(b *pebble.Batch, r *Record) error {
			if r.Control || len(r.Key) == 0 {
				return nil
			}
			if err := applyRecord(b, r); err != nil {
				d.log.Warn("changelog record skipped", slog.Int("partition", int(r.Partition)),
					slog.Int64("offset", r.Offset), slog.String("error", err.Error()))
			}
			return nil
		})
}

// materialize applies the records of a materialized topic (op names the
// step in errors) in one batch together with the next offset of each
// partition: put adds each record at or past its partition's recorded
// offset to the batch (at gives a record's partition and offset); records
// below it are skipped, so replaying is harmless. An error of put aborts
// the batch.
func materialize[R any](d *DB, topic byte, op string, recs []R, at func(r *R) (int32, int64), put func(b *pebble.Batch, r *R) error) error {
	if len(recs) == 0 {
		return nil
	}
	b := d.db.NewBatch()
	defer b.Close()
	next := cursor{d: d, topic: topic}
	for i := range recs {
		r := &recs[i]
		fresh, err := next.take(at(r))
		if err != nil {
			return err
		}
		if !fresh {
			continue
		}
		if err := put(b, r); err != nil {
			return err
		}
	}
	if err := next.write(b); err != nil {
		return err
	}
	if err := d.db.Apply(b, pebble.NoSync); err != nil {
		return fmt.Errorf("state: %s: %w", op, err)
	}
	return nil
}

// cursor follows, while a batch of a materialized topic's records is
// built, the next offset of each partition, so that the batch writes them
// with the records.
type cursor struct {
	d     *DB
	topic byte
	next  map[int32]int64
}

// take reports whether the record at off of partition p is new (not below
// the offset recorded), and moves past it.
func (c *cursor) take(p int32, off int64) (bool, error) {
	from, ok := c.next[p]
	if !ok {
		var err error
		if from, err = c.d.Offset(c.topic, p); err != nil {
			return false, err
		}
		if c.next == nil {
			c.next = map[int32]int64{}
		}
	}
	if off < from {
		c.next[p] = from
		return false, nil
	}
	c.next[p] = off + 1
	return true, nil
}

// write adds the partitions' next offsets to b.
func (c *cursor) write(b *pebble.Batch) error {
	for p, off := range c.next {
		if err := b.Set(offsetKey(c.topic, p), appendInt64(nil, off), nil); err != nil {
			return err
		}
	}
	return nil
}

func applyRecord(b *pebble.Batch, r *Record) error {
	switch r.Key[0] {
	case spaceRow:
		k, err := DecodeRowKey(r.Key)
		if err != nil {
			return err
		}
		if r.Value == nil {
			for _, key := range [][]byte{r.Key, byKeyKey(k, r.Key), openKey(k.Partition, r.Key), expiryKey(k, r.Key)} {
				if err := b.Delete(key, nil); err != nil {
					return err
				}
			}
			return nil
		}
		row, err := DecodeRowValue(r.Value)
		if err != nil {
			return err
		}
		if err := b.Set(r.Key, r.Value, nil); err != nil {
			return err
		}
		if err := b.Set(byKeyKey(k, r.Key), nil, nil); err != nil {
			return err
		}
		if err := b.Set(expiryKey(k, r.Key), nil, nil); err != nil {
			return err
		}
		if row.Closed {
			return b.Delete(openKey(k.Partition, r.Key), nil)
		}
		return b.Set(openKey(k.Partition, r.Key), nil, nil)
	case spaceMark:
		if _, err := DecodeMarkKey(r.Key); err != nil {
			return err
		}
		if r.Value == nil {
			return b.Delete(r.Key, nil)
		}
		if _, err := DecodeMarkValue(r.Value); err != nil {
			return err
		}
		return b.Set(r.Key, r.Value, nil)
	case spacePenalty:
		p, id, err := DecodePenaltyKey(r.Key)
		if err != nil {
			return err
		}
		if r.Value == nil {
			if err := b.Delete(r.Key, nil); err != nil {
				return err
			}
			return b.Delete(penaltyByKeyKey(id, p), nil)
		}
		if _, err := DecodePenaltyValue(r.Value); err != nil {
			return err
		}
		if err := b.Set(r.Key, r.Value, nil); err != nil {
			return err
		}
		return b.Set(penaltyByKeyKey(id, p), nil, nil)
	}
	return fmt.Errorf("%w: unknown key space %q", errCorrupt, r.Key[0])
}

// Offset returns the next offset to read of a partition of a materialized
// topic (0 when nothing was read).
func (d *DB) Offset(topic byte, p int32) (int64, error) {
	v, closer, err := d.db.Get(offsetKey(topic, p))
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("state: read offset: %w", err)
	}
	defer closer.Close()
	r := reader{b: v}
	return r.int64(), r.err()
}

// Row reads a row (windows.Loader).
func (d *DB) Row(k windows.RowKey) (windows.Row, bool, error) {
	v, closer, err := d.db.Get(RowKey(k))
	if errors.Is(err, pebble.ErrNotFound) {
		return windows.Row{}, false, nil
	}
	if err != nil {
		return windows.Row{}, false, fmt.Errorf("state: read row: %w", err)
	}
	defer closer.Close()
	r, err := DecodeRowValue(v)
	return r, err == nil, err
}

var _ windows.Loader = (*DB)(nil)

// LoadPartition returns partition p's unpublished rows and its marks: what
// a new owner of p needs in memory.
func (d *DB) LoadPartition(p int32) (map[windows.RowKey]windows.Row, map[windows.Source]windows.Mark, error) {
	open := map[windows.RowKey]windows.Row{}
	prefix := appendPartition([]byte{spaceOpen}, p)
	err := d.scan(prefix, prefixEnd(prefix), func(k, _ []byte) error {
		primary := k[len(prefix):]
		rk, err := DecodeRowKey(primary)
		if err != nil {
			return err
		}
		r, ok, err := d.Row(rk)
		if err != nil {
			return err
		}
		if ok {
			open[rk] = r
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	marks := map[windows.Source]windows.Mark{}
	err = scanInto(d, markPrefix(p), DecodeMarkKey, DecodeMarkValue, marks)
	return open, marks, err
}

// scanInto decodes every entry under prefix into out, each key with key
// and each value with val; the first error ends the scan.
func scanInto[K comparable, V any](d *DB, prefix []byte, key func([]byte) (K, error), val func([]byte) (V, error), out map[K]V) error {
	return d.scan(prefix, prefixEnd(prefix), func(k, v []byte) error {
		kk, vv, err := decodeEntry(k, v, key, val)
		if err != nil {
			return err
		}
		out[kk] = vv
		return nil
	})
}

// decodeEntry decodes an entry's key with key and its value with val.
func decodeEntry[K, V any](k, v []byte, key func([]byte) (K, error), val func([]byte) (V, error)) (K, V, error) {
	kk, err := key(k)
	if err != nil {
		var vv V
		return kk, vv, err
	}
	vv, err := val(v)
	return kk, vv, err
}

// LoadPenalties returns the penalty state of every key of partition p:
// what a new owner of p needs in memory (package abuse keeps every key's
// state it holds in memory; quiet keys are dropped with a tombstone).
func (d *DB) LoadPenalties(p int32) (map[string]abuse.State, error) {
	out := map[string]abuse.State{}
	keyID := func(k []byte) (string, error) {
		_, id, err := DecodePenaltyKey(k)
		return id, err
	}
	err := scanInto(d, penaltyPrefix(p), keyID, DecodePenaltyValue, out)
	return out, err
}

// PenaltyState is a key's penalty state in one decisions partition.
type PenaltyState struct {
	Partition int32
	abuse.State
}

// Penalties returns a key's penalty states, one per decisions partition
// holding one (normally one: the partition of the key's tenant), as the
// materialized changelog holds them.
func (d *DB) Penalties(keyID string) ([]PenaltyState, error) {
	var out []PenaltyState
	prefix := appendString([]byte{spacePenaltyByKey}, keyID)
	err := d.scan(prefix, prefixEnd(prefix), func(k, _ []byte) error {
		r := reader{b: k[len(prefix):]}
		p := r.partition()
		if err := r.end(); err != nil {
			return err
		}
		v, closer, err := d.db.Get(PenaltyKey(p, keyID))
		if errors.Is(err, pebble.ErrNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("state: read penalty: %w", err)
		}
		s, err := DecodePenaltyValue(v)
		_ = closer.Close()
		if err != nil {
			return err
		}
		out = append(out, PenaltyState{Partition: p, State: s})
		return nil
	})
	return out, err
}

// ExpiredRows calls fn with every row key of partition p and granularity g
// whose window ended before endBefore (Unix seconds), oldest first, until
// fn returns false.
func (d *DB) ExpiredRows(p int32, g windows.Granularity, endBefore int64, fn func(windows.RowKey) bool) error {
	prefix := append(appendPartition([]byte{spaceExpiry}, p), byte(g))
	stop := errors.New("stop")
	err := d.scan(prefix, appendInt64(bytes.Clone(prefix), endBefore), func(k, _ []byte) error {
		rk, err := DecodeRowKey(k[len(prefix)+8:])
		if err != nil {
			return err
		}
		if !fn(rk) {
			return stop
		}
		return nil
	})
	if errors.Is(err, stop) {
		return nil
	}
	return err
}

func (d *DB) scan(lower, upper []byte, fn func(k, v []byte) error) error {
	it, err := d.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return err
	}
	for it.First(); it.Valid(); it.Next() {
		if err := fn(it.Key(), it.Value()); err != nil {
			_ = it.Close()
			return err
		}
	}
	return it.Close()
}

// ReportRow is one row of a usage report: the sum over partitions of one
// (window, key_id, endpoint).
type ReportRow struct {
	Start     int64
	KeyID     string
	KeyPrefix string
	Endpoint  string
	Allowed   int64
	Rejected  int64
	Cost      int64
}

// Query selects report rows: a tenant's or a key_id's, of one granularity,
// windows starting in [From, To).
type Query struct {
	Tenant string // or
	KeyID  string
	Gran   windows.Granularity
	From   int64
	To     int64
	// Limit bounds the rows returned; Cursor continues an earlier answer.
	Limit  int
	Cursor string
}

// prefix is the start of the index entries q reads: a key's (byKey) or
// a tenant's, at q's granularity.
func (q Query) prefix() (prefix []byte, byKey bool) {
	if q.Tenant == "" {
		return keyPrefix(q.KeyID, q.Gran), true
	}
	return tenantPrefix(q.Tenant, q.Gran), false
}

// Report answers q, in window order, with the cursor of the rest ("" when
// complete).
func (d *DB) Report(q Query) ([]ReportRow, string, error) {
	prefix, byKey := q.prefix()
	lower := appendInt64(bytes.Clone(prefix), q.From)
	upper := appendInt64(bytes.Clone(prefix), q.To)
	if q.Cursor != "" {
		c, err := base64.RawURLEncoding.DecodeString(q.Cursor)
		if err != nil || !bytes.HasPrefix(c, prefix) || bytes.Compare(c, lower) < 0 {
			return nil, "", ErrBadCursor
		}
		lower = append(c, 0) // just after it
	}
	if q.Limit <= 0 {
		q.Limit = 10_000
	}
	var rows []ReportRow
	var last []byte
	full := errors.New("full")
	// A key_id's index entries come in the order of their rows' keys, so
	// one iterator seeking forward reads the rows: far cheaper than a
	// point lookup per row, which starts from the top of every level.
	var rowIt *pebble.Iterator
	if byKey {
		var err error
		if rowIt, err = d.db.NewIter(&pebble.IterOptions{LowerBound: []byte{spaceRow}, UpperBound: []byte{spaceRow + 1}}); err != nil {
			return nil, "", fmt.Errorf("state: report: %w", err)
		}
		defer rowIt.Close()
	}
	err := d.scan(lower, upper, func(k, v []byte) error {
		primary := k
		if byKey {
			primary = k[len(prefix)+8:]
			if !rowIt.SeekGE(primary) || !bytes.Equal(rowIt.Key(), primary) {
				if err := rowIt.Error(); err != nil {
					return err
				}
				return nil
			}
			v = bytes.Clone(rowIt.Value())
		}
		rk, r, err := decodeEntry(primary, v, DecodeRowKey, DecodeRowValue)
		if err != nil {
			return err
		}
		if n := len(rows); n > 0 && rows[n-1].Start == rk.Start && rows[n-1].KeyID == rk.KeyID && rows[n-1].Endpoint == rk.Endpoint {
			rows[n-1].Allowed = windows.AddSat(rows[n-1].Allowed, r.Allowed)
			rows[n-1].Rejected = windows.AddSat(rows[n-1].Rejected, r.Rejected)
			rows[n-1].Cost = windows.AddSat(rows[n-1].Cost, r.Cost)
			last = bytes.Clone(k)
			return nil
		}
		if len(rows) == q.Limit {
			return full
		}
		rows = append(rows, ReportRow{Start: rk.Start, KeyID: rk.KeyID, KeyPrefix: r.KeyPrefix, Endpoint: rk.Endpoint,
			Allowed: r.Allowed, Rejected: r.Rejected, Cost: r.Cost})
		last = bytes.Clone(k)
		return nil
	})
	if errors.Is(err, full) {
		return rows, base64.RawURLEncoding.EncodeToString(last), nil
	}
	return rows, "", err
}

// pebbleLogger sends Pebble's log lines to slog.
type pebbleLogger struct{ log *slog.Logger }

func (l pebbleLogger) Infof(format string, args ...any) {
	l.log.Debug(fmt.Sprintf(format, args...), slog.String("lib", "pebble"))
}

func (l pebbleLogger) Errorf(format string, args ...any) {
	l.log.Error(fmt.Sprintf(format, args...), slog.String("lib", "pebble"))
}

func (l pebbleLogger) Fatalf(format string, args ...any) {
	l.log.Error(fmt.Sprintf(format, args...), slog.String("lib", "pebble"))
	panic(fmt.Sprintf(format, args...))
}

// Totals sums every row q selects (its Limit and Cursor are ignored).
func (d *DB) Totals(q Query) (allowed, rejected, cost int64, err error) {
	q.Cursor, q.Limit = "", 1<<62
	prefix, byKey := q.prefix()
	err = d.scan(appendInt64(bytes.Clone(prefix), q.From), appendInt64(bytes.Clone(prefix), q.To), func(k, v []byte) error {
		if byKey {
			pv, closer, err := d.db.Get(k[len(prefix)+8:])
			if errors.Is(err, pebble.ErrNotFound) {
				return nil
			}
			if err != nil {
				return err
			}
			defer closer.Close()
			v = pv
		}
		r, err := DecodeRowValue(v)
		if err != nil {
			return err
		}
		allowed = windows.AddSat(allowed, r.Allowed)
		rejected = windows.AddSat(rejected, r.Rejected)
		cost = windows.AddSat(cost, r.Cost)
		return nil
	})
	return allowed, rejected, cost, err
}

// TenantTotal is one tenant's usage summed over every day row held.
type TenantTotal struct {
	Tenant                  string
	Allowed, Rejected, Cost int64
	From, To                int64 // first window start, last window end (Unix seconds)
}

// TenantTotals sums the day rows of every tenant (what a snapshot holds).
func (d *DB) TenantTotals() ([]TenantTotal, error) {
	var out []TenantTotal
	err := d.scan([]byte{spaceRow}, []byte{spaceRow + 1}, func(k, v []byte) error {
		rk, err := DecodeRowKey(k)
		if err != nil || rk.Gran != windows.Day {
			return err
		}
		r, err := DecodeRowValue(v)
		if err != nil {
			return err
		}
		if n := len(out); n == 0 || out[n-1].Tenant != rk.Tenant {
			out = append(out, TenantTotal{Tenant: rk.Tenant, From: rk.Start, To: rk.End()})
		}
		t := &out[len(out)-1]
		t.Allowed = windows.AddSat(t.Allowed, r.Allowed)
		t.Rejected = windows.AddSat(t.Rejected, r.Rejected)
		t.Cost = windows.AddSat(t.Cost, r.Cost)
		t.From, t.To = min(t.From, rk.Start), max(t.To, rk.End())
		return nil
	})
	return out, err
}
