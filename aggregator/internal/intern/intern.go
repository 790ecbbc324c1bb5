// Package intern gives byte strings small integer ids and keeps their
// bytes in one arena, so that tables of millions of entries hold ids
// instead of strings and the Go collector never scans them. It is not safe
// for concurrent use.
package intern

import (
	"hash/maphash"
	"unsafe"
)

// entry is one string of a Table: its bytes in the arena, the
// number of references to it, and the next string whose hash has the same
// index bucket (0: none).
type entry struct {
	hash uint64
	off  uint64
	n    uint32
	refs uint32
	next uint32
}

// Table gives each distinct byte string a small id (never 0) and keeps the
// bytes in one arena. Nothing in it holds a pointer but the arena and the
// two slices, so the collector does not scan millions of strings; ids are
// reused once nothing refers to them, and the arena is compacted when most
// of it is dead.
//
// The arena's bytes are never overwritten: compaction copies the live
// strings into a new arena, so a string returned by Str stays valid
// after its id is released (it keeps the old arena alive until dropped).
type Table struct {
	seed  maphash.Seed
	arena []byte
	ents  []entry // ents[0] unused: id 0 is "none"
	free  []uint32
	index index // hash → first id with it
	dead  int   // arena bytes of released strings
}

// New returns an empty table.
func New() *Table {
	return &Table{seed: maphash.MakeSeed(), ents: make([]entry, 1)}
}

// Bytes is id's string, aliasing the arena.
func (in *Table) Bytes(id uint32) []byte {
	e := &in.ents[id]
	return in.arena[e.off : e.off+uint64(e.n) : e.off+uint64(e.n)]
}

// Str is id's string without a copy (the arena's bytes never change).
func (in *Table) Str(id uint32) string {
	e := &in.ents[id]
	if e.n == 0 {
		return ""
	}
	return unsafe.String(&in.arena[e.off], int(e.n))
}

// Find is the id of b, or 0.
func (in *Table) Find(b []byte) uint32 {
	h := maphash.Bytes(in.seed, b)
	for id := in.index.get(h); id != 0; id = in.ents[id].next {
		if e := &in.ents[id]; e.hash == h && string(in.Bytes(id)) == string(b) {
			return id
		}
	}
	return 0
}

// Ref is the id of b, added if new, with one more reference.
func (in *Table) Ref(b []byte) uint32 {
	h := maphash.Bytes(in.seed, b)
	first := in.index.get(h)
	for id := first; id != 0; id = in.ents[id].next {
		if e := &in.ents[id]; e.hash == h && string(in.Bytes(id)) == string(b) {
			e.refs++
			return id
		}
	}
	var id uint32
	if n := len(in.free); n > 0 {
		id, in.free = in.free[n-1], in.free[:n-1]
	} else {
		id = uint32(len(in.ents))
		in.ents = append(in.ents, entry{})
	}
	off := uint64(len(in.arena))
	in.arena = append(in.arena, b...)
	in.ents[id] = entry{hash: h, off: off, n: uint32(len(b)), refs: 1, next: first}
	in.index.set(h, id)
	return id
}

// Unref drops one reference to id (0: nothing); the last one releases
// it, and Unref reports whether it did.
func (in *Table) Unref(id uint32) bool {
	if id == 0 {
		return false
	}
	e := &in.ents[id]
	if e.refs--; e.refs > 0 {
		return false
	}
	if first := in.index.get(e.hash); first == id {
		if e.next == 0 {
			in.index.del(e.hash)
		} else {
			in.index.set(e.hash, e.next)
		}
	} else {
		p := first
		for in.ents[p].next != id {
			p = in.ents[p].next
		}
		in.ents[p].next = e.next
	}
	in.dead += int(e.n)
	*e = entry{}
	in.free = append(in.free, id)
	if in.dead > 1<<16 && in.dead > len(in.arena)/2 {
		in.compact()
	}
	return true
}

// compact copies the live strings into a new arena.
func (in *Table) compact() {
	arena := make([]byte, 0, len(in.arena)-in.dead+len(in.arena)/4)
	for id := 1; id < len(in.ents); id++ {
		e := &in.ents[id]
		if e.refs == 0 {
			continue
		}
		off := uint64(len(arena))
		arena = append(arena, in.arena[e.off:e.off+uint64(e.n)]...)
		e.off = off
	}
	in.arena, in.dead = arena, 0
}

// Live is the number of strings held.
func (in *Table) Live() int { return len(in.ents) - 1 - len(in.free) }

// FindString is Find of s's bytes, without copying them.
func (in *Table) FindString(s string) uint32 {
	return in.Find(unsafe.Slice(unsafe.StringData(s), len(s)))
}

// RefString is Ref of s's bytes, which it copies into the arena.
func (in *Table) RefString(s string) uint32 {
	return in.Ref(unsafe.Slice(unsafe.StringData(s), len(s)))
}

// AddRef adds one reference to id, a live string.
func (in *Table) AddRef(id uint32) { in.ents[id].refs++ }

// IDs is one more than the largest id ever given: a slice of that length
// indexed by id holds something for every live string.
func (in *Table) IDs() int { return len(in.ents) }

// ArenaCap is the arena's capacity in bytes.
func (in *Table) ArenaCap() int { return cap(in.arena) }
