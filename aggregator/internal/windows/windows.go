// Package windows is the aggregator's usage logic without Kafka or disk:
// decision events in, per-(tenant, key_id, endpoint) minute, hour and day
// rows out, with the deduplication and gap counting that make the stream
// exactly once.
//
// A Table holds the state of one decisions partition: its rows that are
// still open or recently written, and one Mark per event source (gateway,
// boot epoch, partition). Changes are made in a Txn, which reads through
// to the Table (and, for rows the Table no longer holds, to a Loader) and
// holds every change privately until Commit; Discard drops them, which is
// what an aborted Kafka transaction needs. Everything runs on an injected
// clock; nothing here starts goroutines or is safe for concurrent use: one
// partition's table is owned by one processing loop.
//
// Deduplication: a gateway numbers its events per (epoch, partition) from
// 1 and delivers them in order, possibly repeating a prefix after a
// reconnect or a spool replay. An event whose sequence number is not above
// its source's high-water mark is a duplicate and changes nothing. A jump
// over numbers counts them as missing; an EpochClosed marker counts the
// numbers after the mark up to the last one the gateway used.
//
// No single record can silence a source: a jump of more than MaxSeqJump
// numbers is held, not applied, until a run of ConfirmRun events continues
// it with nothing arriving from below (an event from below discards it);
// the numbers the last jump skipped stay open, so that events arriving in
// them later are applied rather than taken for duplicates (an in-order
// gateway never sends them: only a record that is not the gateway's makes
// this happen); and a closed source still applies events above its mark.
package windows

import (
	"math"
	"slices"
	"time"

	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// Granularity is the size of a usage window.
type Granularity uint8

// Granularities, in the order rows are written.
const (
	Minute Granularity = iota + 1
	Hour
	Day
)

// All lists the granularities every event is counted in.
var All = [...]Granularity{Minute, Hour, Day}

// Seconds is the window's length.
func (g Granularity) Seconds() int64 {
	switch g {
	case Minute:
		return 60
	case Hour:
		return 3600
	case Day:
		return 86400
	}
	return 0
}

func (g Granularity) String() string {
	switch g {
	case Minute:
		return "minute"
	case Hour:
		return "hour"
	case Day:
		return "day"
	}
	return "unknown"
}

// ParseGranularity is the inverse of String.
func ParseGranularity(s string) (Granularity, bool) {
	for _, g := range All {
		if g.String() == s {
			return g, true
		}
	}
	return 0, false
}

// Kind is what an event records.
type Kind uint8

// Event kinds (the DecisionEvent kinds of the schemas).
const (
	// KindDecision is an allowed or rejected request.
	KindDecision Kind = iota + 1
	// KindReport is a charge after the fact: it adds cost only.
	KindReport
	// KindEpochClosed closes an earlier epoch of its gateway on its
	// partition, naming the last sequence number reserved in it.
	KindEpochClosed
)

// Source identifies a stream of numbered events.
type Source struct {
	Gateway   string
	Epoch     uint64
	Partition int32
}

// Event is one decision event, as the processor decoded it.
type Event struct {
	Source
	Seq        uint64
	TimeMicros int64
	Kind       Kind
	Tenant     string
	KeyID      string
	KeyPrefix  string
	Endpoint   string
	Rule       string
	Allowed    bool
	Cost       int64
	// LastSeq is the last sequence reserved (KindEpochClosed only).
	LastSeq uint64
}

// RowKey identifies a usage row. Partition is the decisions partition the
// row's events came from: a row is only ever written by the owner of that
// partition, so rows of one tenant split over two partitions (gateways
// disagreeing on the partition count) never overwrite each other; reports
// add them up.
type RowKey struct {
	Partition int32
	Tenant    string
	KeyID     string
	Endpoint  string
	Gran      Granularity
	Start     int64 // Unix seconds, a multiple of Gran.Seconds()
}

// End is the Unix second the window ends at.
func (k RowKey) End() int64 { return k.Start + k.Gran.Seconds() }

// MaxRules bounds the distinct rule ids a row remembers.
const MaxRules = 16

// Row is the usage of one window.
type Row struct {
	KeyPrefix string
	Allowed   int64
	Rejected  int64
	Cost      int64
	// Rules holds the distinct deciding rule ids, sorted, at most MaxRules.
	Rules []string
	// Closed: the window has been published to the usage topic; Revision
	// counts its publications (late events republish it).
	Closed   bool
	Revision uint32
}

func (r *Row) addRule(id string) {
	if id == "" {
		return
	}
	i, found := slices.BinarySearch(r.Rules, id)
	if found || len(r.Rules) >= MaxRules {
		return
	}
	r.Rules = slices.Insert(r.Rules, i, id)
}

// Mark is a source's deduplication state.
type Mark struct {
	// HWM is the highest sequence number applied (or passed through the
	// marks and refused for a bad field).
	HWM uint64
	// Missing counts sequence numbers skipped and, after an EpochClosed
	// marker, used by the gateway and never delivered; less the numbers
	// that arrived late in the open gap.
	Missing uint64
	// Closed: an EpochClosed marker was applied. The gateway sends nothing
	// of the source after it; an event above HWM is applied all the same
	// (and counted in Stats.AfterClose), so a forged marker cannot silence
	// a live source.
	Closed bool
	// Seen is the Unix second the mark last changed (for retention).
	Seen int64
	// HeldFirst..HeldLast is a run of HeldCount consecutive events that
	// jumped more than MaxSeqJump above HWM, not applied; HeldCount 0: none.
	HeldFirst, HeldLast, HeldCount uint64
	// GapNext..GapLast are the numbers the last jump skipped that have not
	// arrived (counted in Missing); GapNext 0: none. An event in it is
	// applied, not taken for a duplicate.
	GapNext, GapLast uint64
}

// Config holds the windowing parameters.
type Config struct {
	// Lateness is how long after its end a window stays open for late
	// events before it is published (default 10s; a closed window still
	// takes late events, republished with a new revision, and counts them
	// as late).
	Lateness time.Duration
	// Retention per granularity: rows whose window ended longer ago are
	// deleted (defaults: minute 2 days, hour 90 days, day 2 years).
	Retention map[Granularity]time.Duration
	// MarkRetention: marks of closed epochs unchanged for this long are
	// deleted (default 30 days).
	MarkRetention time.Duration
	// MaxSeqJump is the largest jump of a source's high-water mark one
	// event may make; a longer one is held (default
	// tollgatev1.MaxSeqJump).
	MaxSeqJump uint64
	// ConfirmRun is the run of events that confirms a held jump (default
	// tollgatev1.SeqConfirmRun).
	ConfirmRun uint64
}

// SetDefaults fills zero fields.
func (c *Config) SetDefaults() {
	configs.DefaultPositive(&c.Lateness, 10*time.Second)
	def := map[Granularity]time.Duration{Minute: 48 * time.Hour, Hour: 90 * 24 * time.Hour, Day: 2 * 365 * 24 * time.Hour}
	if c.Retention == nil {
		c.Retention = map[Granularity]time.Duration{}
	}
	for g, d := range def {
		if c.Retention[g] <= 0 {
			c.Retention[g] = d
		}
	}
	configs.DefaultPositive(&c.MarkRetention, 30*24*time.Hour)
	configs.Default(&c.MaxSeqJump, tollgatev1.MaxSeqJump)
	configs.Default(&c.ConfirmRun, tollgatev1.SeqConfirmRun)
}

// Loader reads rows and marks the Table does not hold (from Pebble).
type Loader interface {
	Row(k RowKey) (Row, bool, error)
}

// Table is the state of one decisions partition.
type Table struct {
	cfg       Config
	partition int32
	load      Loader
	rows      *rowStore
	marks     map[Source]*Mark
	// lastRows and lastSeries are how many rows the last committed
	// transaction wrote and how many series it looked up: the next one's
	// map and slices start at that size instead of growing to it by
	// rehashing and copying, which a backlog of new keys would pay on every
	// transaction.
	lastRows, lastSeries int
}

// NewTable returns the table of partition p; rows it does not hold are
// read from load, and marks (all of which a table holds) start as given.
func NewTable(cfg Config, p int32, load Loader, open map[RowKey]Row, marks map[Source]Mark) *Table {
	cfg.SetDefaults()
	t := &Table{cfg: cfg, partition: p, load: load, rows: newRowStore(len(open)), marks: make(map[Source]*Mark, len(marks))}
	for k, r := range open {
		t.rows.put(&k, &r, 0)
	}
	for s, m := range marks {
		m := m
		t.marks[s] = &m
	}
	return t
}

// Partition is the table's decisions partition.
func (t *Table) Partition() int32 { return t.partition }

// Len is the number of rows held in memory.
func (t *Table) Len() int { return t.rows.len() }

// Marks returns a copy of the marks.
func (t *Table) Marks() map[Source]Mark {
	m := make(map[Source]Mark, len(t.marks))
	for s, v := range t.marks {
		m[s] = *v
	}
	return m
}

// Evict drops closed rows whose last write is at or below materialized
// (the changelog position Pebble holds), so memory holds only open rows and
// recent writes; the Loader serves them from then on.
func (t *Table) Evict(materialized int64) int {
	n := 0
	for i := range t.rows.used {
		if e := t.rows.slots.At(i); e.live && e.closed && e.written > 0 && e.written <= materialized {
			t.rows.remove(i)
			n++
		}
	}
	return n
}

// Begin starts a transaction on the table.
func (t *Table) Begin() *Txn {
	return &Txn{t: t, gen: t.rows.gen, list: make([]txnRow, 0, t.lastRows), bySeries: make(map[seriesKey]int32, t.lastSeries),
		series: make([]uint32, 0, t.lastSeries), heads: make([]int32, 0, t.lastSeries), marks: map[Source]*Mark{}}
}

// seriesKey is what the rows of one key on one endpoint share.
type seriesKey struct {
	Partition int32
	Tenant    string
	KeyID     string
	Endpoint  string
}

// txnRow is a row a transaction changes, with where the table holds it:
// its slot (plus one; 0: none) and its series, found when the row was
// read, so that Commit does not look them up again while the table has not
// changed since Begin.
type txnRow struct {
	Row
	key    RowKey
	series int32 // index in Txn.series
	next   int32 // the series' next row in Txn.list; -1: none
	slot   uint32
	gone   bool // expired in the transaction: found no more
}

// Txn is a set of changes to a Table, invisible to it until Commit.
type Txn struct {
	t   *Table
	gen uint64 // the table's rows.gen at Begin
	// list holds the rows in the order read, by value: a *Row into it
	// is good until the next row is read. A series' rows are chained
	// from heads, newest first, so that a row is found by its series
	// (one lookup per event) and a walk of the few windows the
	// transaction read of it: a new key costs one insert here, not one
	// per window.
	list  []txnRow
	nrows int // rows in list not gone
	// series holds the table's id of each series the transaction read
	// (0: not held when read, or not interned yet), so that Commit interns
	// a new series once; bySeries finds it, and heads holds its first row
	// in list (-1: none).
	series   []uint32
	heads    []int32
	bySeries map[seriesKey]int32
	marks    map[Source]*Mark
	deleted  map[RowKey]bool
	dmarks   map[Source]bool
	publish  map[RowKey]bool
	stats    Stats
}

// Stats counts what a transaction did.
type Stats struct {
	Applied    int // events counted
	Duplicates int // events at or below their source's mark
	Late       int // events for windows already published
	Missing    uint64
	Expired    int // rows deleted by retention
	// Refused counts events passed through the marks but not counted
	// (Refuse: a field out of bounds).
	Refused int
	// Held counts events that jumped beyond MaxSeqJump and were held;
	// Discarded, held events dropped because their source went on from
	// below; Accepted, held runs confirmed (their events count as
	// missing).
	Held      int
	Discarded int
	Accepted  int
	// Filled counts events applied in the open gap of their source, and
	// AfterClose events applied above the mark of a closed source: neither
	// happens with records that are all the gateway's.
	Filled     int
	AfterClose int
}

// Stats returns the transaction's counts so far.
func (x *Txn) Stats() Stats { return x.stats }

func (x *Txn) row(k RowKey) (*Row, error) {
	ser := x.seriesIn(&k)
	if i := x.find(ser, k.Gran, k.Start); i >= 0 {
		return &x.list[i].Row, nil
	}
	return x.rowFrom(k, ser)
}

// find is the index in list of series ser's row of window (g, start);
// -1 when the transaction has not read it.
func (x *Txn) find(ser int32, g Granularity, start int64) int32 {
	for i := x.heads[ser]; i >= 0; i = x.list[i].next {
		if r := &x.list[i]; r.key.Gran == g && r.key.Start == start && !r.gone {
			return i
		}
	}
	return -1
}

// seriesIn is k's series in the transaction, added with the table's id of
// it when the transaction had not read it yet.
func (x *Txn) seriesIn(k *RowKey) int32 {
	sk := seriesKey{k.Partition, k.Tenant, k.KeyID, k.Endpoint}
	if i, ok := x.bySeries[sk]; ok {
		return i
	}
	x.series = append(x.series, x.t.rows.seriesOf(k))
	x.heads = append(x.heads, -1)
	i := int32(len(x.series) - 1)
	x.bySeries[sk] = i
	return i
}

// rowFrom is row for a k not in the transaction yet, whose series is
// x.series[ser].
func (x *Txn) rowFrom(k RowKey, ser int32) (*Row, error) {
	r := txnRow{key: k, series: ser, next: x.heads[ser]}
	i, held := x.t.rows.find(x.series[ser], &k)
	if held && !x.deleted[k] {
		x.t.rows.row(i, &r.Row)
	} else if !x.deleted[k] && x.t.load != nil {
		base, ok, err := x.t.load.Row(k)
		if err != nil {
			return nil, err
		}
		if ok {
			r.Row = base
			r.Rules = slices.Clone(base.Rules)
		}
	}
	delete(x.deleted, k)
	if held {
		r.slot = i + 1
	}
	x.heads[ser] = int32(len(x.list))
	x.nrows++
	x.list = append(x.list, r)
	return &x.list[len(x.list)-1].Row, nil
}

func (x *Txn) mark(s Source) *Mark {
	if m, ok := x.marks[s]; ok {
		return m
	}
	m := &Mark{}
	if b, ok := x.t.marks[s]; ok {
		*m = *b
	}
	x.marks[s] = m
	return m
}

// admission is what the marks make of an event.
type admission uint8

const (
	admitDuplicate admission = iota // at or below the mark, or a closed source's marker again
	admitHeld                       // beyond MaxSeqJump: held, not applied
	admitNew                        // to be counted
	admitMarker                     // an EpochClosed marker that closed its source
)

// admit passes ev through its source's mark (see the package comment).
func (x *Txn) admit(ev *Event, nowSec int64) admission {
	m := x.mark(ev.Source)
	cfg := &x.t.cfg
	if ev.Kind == KindEpochClosed {
		if m.Closed {
			x.stats.Duplicates++
			return admitDuplicate
		}
		if m.HeldCount > 0 {
			// The gateway says it used numbers up to LastSeq: a held run
			// within them is its own.
			if ev.LastSeq >= m.HeldLast {
				x.accept(m)
			} else {
				x.discard(m)
			}
		}
		if ev.LastSeq > m.HWM {
			x.missing(m, ev.LastSeq-m.HWM)
		}
		m.Closed, m.Seen = true, nowSec
		return admitMarker
	}
	s := ev.Seq
	switch {
	case s <= m.HWM:
		if m.GapNext == 0 || s < m.GapNext || s > m.GapLast {
			x.stats.Duplicates++
			return admitDuplicate
		}
		// In the open gap: never applied, so not a duplicate. The numbers
		// below it stay missing.
		m.GapNext = s + 1
		if m.GapNext > m.GapLast {
			m.GapNext, m.GapLast = 0, 0
		}
		if m.Missing > 0 {
			m.Missing--
		}
		m.Seen = nowSec
		x.stats.Filled++
		return admitNew
	case s-m.HWM <= cfg.MaxSeqJump:
		if m.HeldCount > 0 {
			x.discard(m) // the source went on from below
		}
		if s > m.HWM+1 {
			x.missing(m, s-m.HWM-1)
			m.GapNext, m.GapLast = m.HWM+1, s-1
		}
		if m.Closed {
			x.stats.AfterClose++
		}
		m.HWM, m.Seen = s, nowSec
		return admitNew
	}
	// A jump beyond the bound.
	m.Seen = nowSec
	if m.HeldCount > 0 && s >= m.HeldFirst && s <= m.HeldLast {
		x.stats.Duplicates++ // a replay of the held run
		return admitDuplicate
	}
	if m.HeldCount > 0 && s == m.HeldLast+1 {
		m.HeldLast++
		m.HeldCount++
	} else {
		if m.HeldCount > 0 {
			x.discard(m)
		}
		m.HeldFirst, m.HeldLast, m.HeldCount = s, s, 1
	}
	x.stats.Held++
	if m.HeldCount >= cfg.ConfirmRun {
		x.accept(m)
	}
	return admitHeld
}

// missing counts n numbers of m as never delivered.
func (x *Txn) missing(m *Mark, n uint64) {
	m.Missing += n
	x.stats.Missing += n
}

// accept confirms m's held run: the numbers it skipped and its own events
// (never applied) count as missing, the skipped ones become the open gap,
// and the mark moves to the run's end.
func (x *Txn) accept(m *Mark) {
	x.missing(m, m.HeldLast-m.HWM)
	m.GapNext, m.GapLast = m.HWM+1, m.HeldFirst-1
	m.HWM = m.HeldLast
	m.HeldFirst, m.HeldLast, m.HeldCount = 0, 0, 0
	x.stats.Accepted++
}

// discard drops m's held run.
func (x *Txn) discard(m *Mark) {
	x.stats.Discarded += int(m.HeldCount)
	m.HeldFirst, m.HeldLast, m.HeldCount = 0, 0, 0
}

// Refuse passes ev through its source's mark without counting it (a field
// out of bounds): its number is used, so it is neither missing nor applied
// later. It reports whether ev was new (not a duplicate, not held).
func (x *Txn) Refuse(ev *Event, nowSec int64) bool {
	switch x.admit(ev, nowSec) {
	case admitNew:
		x.stats.Refused++
		return true
	case admitMarker:
		return true
	}
	return false
}

// Apply counts ev, decided at nowSec (Unix seconds, wall clock). It returns
// false for a duplicate and for an event held beyond MaxSeqJump. An error
// comes only from the Loader.
func (x *Txn) Apply(ev *Event, nowSec int64) (bool, error) {
	switch x.admit(ev, nowSec) {
	case admitDuplicate, admitHeld:
		return false, nil
	case admitMarker:
		return true, nil
	}
	x.stats.Applied++
	sec := FloorDiv(ev.TimeMicros, 1_000_000)
	late := false
	ser := int32(-1)
	for _, g := range All {
		k := RowKey{Partition: x.t.partition, Tenant: ev.Tenant, KeyID: ev.KeyID, Endpoint: ev.Endpoint, Gran: g}
		k.Start = sec - Mod(sec, g.Seconds())
		if ser < 0 {
			// The series is looked up once for the event's rows.
			ser = x.seriesIn(&k)
		}
		var r *Row
		if i := x.find(ser, g, k.Start); i >= 0 {
			r = &x.list[i].Row
		} else {
			var err error
			if r, err = x.rowFrom(k, ser); err != nil {
				return true, err
			}
		}
		if ev.KeyPrefix != "" {
			r.KeyPrefix = ev.KeyPrefix
		}
		switch {
		case ev.Kind == KindReport:
			r.Cost = AddSat(r.Cost, ev.Cost)
		case ev.Allowed:
			r.Allowed = AddSat(r.Allowed, 1)
			r.Cost = AddSat(r.Cost, ev.Cost)
		default:
			r.Rejected = AddSat(r.Rejected, 1)
		}
		r.addRule(ev.Rule)
		if r.Closed {
			// Late: publish the window again with its new totals.
			late = true
			x.markPublish(k)
		}
	}
	if late {
		x.stats.Late++
	}
	return true, nil
}

func (x *Txn) markPublish(k RowKey) {
	if x.publish == nil {
		x.publish = map[RowKey]bool{}
	}
	x.publish[k] = true
}

// CloseDue closes every open window whose end plus the allowed lateness is
// at or before nowSec: it is published (Revision 1). Windows already closed
// that took late events in this transaction are republished too.
func (x *Txn) CloseDue(nowSec int64) error {
	lateness := int64(x.t.cfg.Lateness / time.Second)
	for i := range x.t.rows.used {
		e := x.t.rows.slots.At(i)
		if !e.live || e.closed || e.id.start+e.id.gran.Seconds()+lateness > nowSec {
			continue
		}
		k := x.t.rows.key(i)
		if x.deleted[k] {
			continue
		}
		r, err := x.row(k)
		if err != nil {
			return err
		}
		if !r.Closed {
			x.markPublish(k)
		}
	}
	for i := range x.list {
		if r := &x.list[i]; !r.gone && !r.Closed && r.key.End()+lateness <= nowSec {
			x.markPublish(r.key)
		}
	}
	return nil
}

// Expire deletes the rows held in memory whose retention has passed, and
// marks of closed epochs unchanged for MarkRetention. Rows only on disk are
// expired by ExpireRow, which the processor calls while scanning them.
func (x *Txn) Expire(nowSec int64) {
	for i := range x.t.rows.used {
		if e := x.t.rows.slots.At(i); e.live && x.t.expired(e.id.gran, e.id.start+e.id.gran.Seconds(), nowSec) {
			x.ExpireRow(x.t.rows.key(i), nowSec)
		}
	}
	for s, m := range x.t.marks {
		if m.Closed && nowSec-m.Seen > int64(x.t.cfg.MarkRetention/time.Second) {
			if x.dmarks == nil {
				x.dmarks = map[Source]bool{}
			}
			x.dmarks[s] = true
			delete(x.marks, s)
		}
	}
}

// Expired reports whether k's retention has passed at nowSec.
func (t *Table) Expired(k RowKey, nowSec int64) bool { return t.expired(k.Gran, k.End(), nowSec) }

func (t *Table) expired(g Granularity, end, nowSec int64) bool {
	return nowSec-end > int64(t.cfg.Retention[g]/time.Second)
}

// ExpireRow deletes k when its retention has passed; it reports whether it
// did.
func (x *Txn) ExpireRow(k RowKey, nowSec int64) bool {
	if !x.t.Expired(k, nowSec) || x.deleted[k] {
		return false
	}
	if x.deleted == nil {
		x.deleted = map[RowKey]bool{}
	}
	x.deleted[k] = true
	if ser, ok := x.bySeries[seriesKey{k.Partition, k.Tenant, k.KeyID, k.Endpoint}]; ok {
		if i := x.find(ser, k.Gran, k.Start); i >= 0 {
			x.list[i].gone = true
			x.nrows--
		}
	}
	delete(x.publish, k)
	x.stats.Expired++
	return true
}

// Change is one row or mark a transaction writes; Deleted for a tombstone.
type Change struct {
	Row     *RowKey // nil for a mark
	Value   Row
	Source  Source
	Mark    Mark
	Deleted bool
	// Publish: the row is to be published to the usage topic with its
	// Revision (already incremented).
	Publish bool
}

// Changes finalizes the transaction's writes: windows to publish get
// Closed and their next Revision. The returned slice is what the processor
// writes to the changelog (and publishes), in no particular order (the
// transaction makes them visible together).
func (x *Txn) Changes() []Change {
	for k := range x.publish {
		r, _ := x.row(k) // read already: publish is set only for rows read
		if r != nil {
			r.Closed = true
			r.Revision++
		}
	}
	out := make([]Change, 0, x.nrows+len(x.marks)+len(x.deleted)+len(x.dmarks))
	for i := range x.list {
		if r := &x.list[i]; !r.gone {
			out = append(out, Change{Row: &r.key, Value: r.Row, Publish: x.publish[r.key]})
		}
	}
	for k := range x.deleted {
		k := k
		out = append(out, Change{Row: &k, Deleted: true})
	}
	for s, m := range x.marks {
		out = append(out, Change{Source: s, Mark: *m})
	}
	for s := range x.dmarks {
		out = append(out, Change{Source: s, Deleted: true})
	}
	x.publish = nil
	return out
}

// Commit applies the transaction's changes to the table, which records
// written as the changelog position of their write (the offset of the last
// changelog record of the transaction). Call it only once the Kafka
// transaction carrying Changes() committed; the Txn is spent afterwards.
func (x *Txn) Commit(written int64) {
	x.t.lastRows, x.t.lastSeries = len(x.list), len(x.series)
	// Unchanged since Begin: the slots and series found on reading hold.
	known := x.gen == x.t.rows.gen
	for i := range x.list {
		switch r := &x.list[i]; {
		case r.gone:
		case known:
			x.t.rows.putKnown(&r.key, &r.Row, r.slot, &x.series[r.series], written)
		default:
			x.t.rows.put(&r.key, &r.Row, written)
		}
	}
	for k := range x.deleted {
		if i, ok := x.t.rows.lookup(&k); ok {
			x.t.rows.remove(i)
		}
	}
	for s, m := range x.marks {
		x.t.marks[s] = m
	}
	for s := range x.dmarks {
		delete(x.t.marks, s)
	}
	*x = Txn{}
}

// Empty reports whether the transaction changes nothing.
func (x *Txn) Empty() bool {
	return x.nrows == 0 && len(x.marks) == 0 && len(x.deleted) == 0 && len(x.dmarks) == 0 && len(x.publish) == 0
}

// AddSat returns a+b, saturating at the bounds of int64 instead of
// wrapping: a total that reached them stays there.
func AddSat(a, b int64) int64 {
	s := a + b
	if (s > a) != (b > 0) {
		if b > 0 {
			return math.MaxInt64
		}
		return math.MinInt64
	}
	return s
}

// FloorDiv is a / b rounded toward negative infinity, so that a time
// before the epoch falls in the window that holds it.
func FloorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// Mod is a modulo b with b's sign (for b > 0, in [0, b)): a - Mod(a, b)
// is the start of a's window of width b.
func Mod(a, b int64) int64 { return a - FloorDiv(a, b)*b }
