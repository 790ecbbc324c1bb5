package windows

import (
	"encoding/binary"
	"slices"
	"unsafe"

	"github.com/tollgate/tollgate/aggregator/internal/intern"
)

// rowID is a row's key inside a table: the interned (partition, tenant,
// key_id, endpoint) and the window.
type rowID struct {
	series uint32
	gran   Granularity
	start  int64
}

// slot is a row the table holds, with the changelog position of its last
// write (0 while it was never written by this table). It holds no
// pointer: its strings are interned ids.
type slot struct {
	id       rowID
	prefix   uint32 // interned KeyPrefix, 0 for ""
	rules    uint32 // interned rule list, 0 for none
	revision uint32
	closed   bool
	live     bool
	next     uint32 // the series' next slot (plus one; 0: none)
	allowed  int64
	rejected int64
	cost     int64
	written  int64
}

// rowStore is a table's rows: pages of pointer-free slots, so that the
// collector does not scan them however many rows there are, and a growing
// table never copies the slots it holds. A row is
// found through its interned series (one hash of its strings), whose
// slots are chained newest first: a series holds the few windows that are
// open or not yet evicted, and the current ones lead.
type rowStore struct {
	series   *intern.Table
	heads    []uint32 // by series id: its first slot (plus one)
	prefixes *intern.Table
	sets     *intern.Table
	decoded  map[uint32][]string // rule lists by id: few distinct ones
	slots    intern.Pages[slot]
	used     uint32 // slots below it have been used; the others never
	free     []uint32
	n        int // slots held
	scratch  []byte
	// gen counts the slots added and removed: a slot or series id found
	// at one gen is still right while it has not moved.
	gen uint64
}

func newRowStore(n int) *rowStore {
	s := &rowStore{series: intern.New(), prefixes: intern.New(), sets: intern.New(), decoded: map[uint32][]string{}}
	s.slots.Grow(n)
	return s
}

// seriesBytes encodes k's (partition, tenant, key_id, endpoint) into the
// scratch buffer.
func (s *rowStore) seriesBytes(k *RowKey) []byte {
	b := binary.AppendVarint(s.scratch[:0], int64(k.Partition))
	b = binary.AppendUvarint(b, uint64(len(k.Tenant)))
	b = append(b, k.Tenant...)
	b = binary.AppendUvarint(b, uint64(len(k.KeyID)))
	b = append(b, k.KeyID...)
	b = append(b, k.Endpoint...)
	s.scratch = b
	return b
}

// seriesOf is the interned series of k, 0 when no row of it is held.
func (s *rowStore) seriesOf(k *RowKey) uint32 { return s.series.Find(s.seriesBytes(k)) }

// find is the slot of k, given its series (seriesOf).
func (s *rowStore) find(series uint32, k *RowKey) (uint32, bool) {
	if series == 0 || int(series) >= len(s.heads) {
		return 0, false
	}
	id := rowID{series: series, gran: k.Gran, start: k.Start}
	for n := s.heads[series]; n != 0; n = s.slots.At(n - 1).next {
		if s.slots.At(n-1).id == id {
			return n - 1, true
		}
	}
	return 0, false
}

// lookup is the slot of k.
func (s *rowStore) lookup(k *RowKey) (uint32, bool) { return s.find(s.seriesOf(k), k) }

// row copies slot i's row into r.
func (s *rowStore) row(i uint32, r *Row) {
	e := s.slots.At(i)
	*r = Row{KeyPrefix: s.prefixes.Str(e.prefix), Allowed: e.allowed, Rejected: e.rejected, Cost: e.cost,
		Rules: slices.Clone(s.decoded[e.rules]), Closed: e.closed, Revision: e.revision}
}

// key is slot i's key; its strings alias the series arena.
func (s *rowStore) key(i uint32) RowKey {
	e := s.slots.At(i)
	b := s.series.Bytes(e.id.series)
	p, n := binary.Varint(b)
	b = b[n:]
	k := RowKey{Partition: int32(p), Gran: e.id.gran, Start: e.id.start}
	k.Tenant, b = cut(b)
	k.KeyID, b = cut(b)
	k.Endpoint = bytesString(b)
	return k
}

// cut splits a length-prefixed string off b.
func cut(b []byte) (string, []byte) {
	l, n := binary.Uvarint(b)
	return bytesString(b[n : n+int(l)]), b[n+int(l):]
}

// bytesString is b as a string without a copy: b is arena bytes, which
// never change.
func bytesString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

// put stores r as k's row, written at position written.
func (s *rowStore) put(k *RowKey, r *Row, written int64) {
	series := s.seriesOf(k)
	i, ok := s.find(series, k)
	if !ok {
		i = s.add(s.series.Ref(s.seriesBytes(k)), k)
	}
	s.set(i, r, written)
}

// putKnown is put for a row read at the store's current gen: its slot
// (plus one; 0: none) and its series' id (0: none, set here when the
// series is added) are known.
func (s *rowStore) putKnown(k *RowKey, r *Row, slot uint32, series *uint32, written int64) {
	i := slot - 1
	if slot == 0 {
		if *series == 0 {
			*series = s.series.Ref(s.seriesBytes(k))
		} else {
			s.series.AddRef(*series)
		}
		i = s.add(*series, k)
	}
	s.set(i, r, written)
}

// add is a new slot for k's window of series, which the caller has
// referenced for it.
func (s *rowStore) add(series uint32, k *RowKey) uint32 {
	var i uint32
	if n := len(s.free); n > 0 {
		i, s.free = s.free[n-1], s.free[:n-1]
	} else {
		i = s.used
		s.used++
		s.slots.Grow(int(s.used))
	}
	for int(series) >= len(s.heads) {
		s.heads = append(s.heads, 0)
	}
	*s.slots.At(i) = slot{id: rowID{series: series, gran: k.Gran, start: k.Start}, live: true, next: s.heads[series]}
	s.heads[series] = i + 1
	s.n++
	s.gen++
	return i
}

// set writes r into slot i.
func (s *rowStore) set(i uint32, r *Row, written int64) {
	e := s.slots.At(i)
	if s.prefixes.Str(e.prefix) != r.KeyPrefix {
		old := e.prefix
		e.prefix = 0
		if r.KeyPrefix != "" {
			e.prefix = s.prefixes.Ref(append(s.scratch[:0], r.KeyPrefix...))
		}
		s.prefixes.Unref(old)
	}
	if !slices.Equal(s.decoded[e.rules], r.Rules) {
		old := e.rules
		e.rules = s.refRules(r.Rules)
		s.unrefRules(old)
	}
	e.allowed, e.rejected, e.cost = r.Allowed, r.Rejected, r.Cost
	e.closed, e.revision, e.written = r.Closed, r.Revision, written
}

// refRules is the id of the rule list, with one more reference.
func (s *rowStore) refRules(rules []string) uint32 {
	if len(rules) == 0 {
		return 0
	}
	b := s.scratch[:0]
	for _, r := range rules {
		b = binary.AppendUvarint(b, uint64(len(r)))
		b = append(b, r...)
	}
	s.scratch = b
	id := s.sets.Ref(b)
	if _, ok := s.decoded[id]; !ok {
		s.decoded[id] = slices.Clone(rules)
	}
	return id
}

func (s *rowStore) unrefRules(id uint32) {
	if id == 0 {
		return
	}
	if s.sets.Unref(id) {
		delete(s.decoded, id)
	}
}

// remove drops slot i.
func (s *rowStore) remove(i uint32) {
	e := s.slots.At(i)
	if h := &s.heads[e.id.series]; *h == i+1 {
		*h = e.next
	} else {
		p := *h - 1
		for s.slots.At(p).next != i+1 {
			p = s.slots.At(p).next - 1
		}
		s.slots.At(p).next = e.next
	}
	s.series.Unref(e.id.series)
	s.prefixes.Unref(e.prefix)
	s.unrefRules(e.rules)
	*e = slot{}
	s.free = append(s.free, i)
	s.n--
	s.gen++
}

// len is the number of rows held.
func (s *rowStore) len() int { return s.n }
