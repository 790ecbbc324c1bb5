package windows

import (
	"hash/maphash"
	"unsafe"
)

// interned is one string of an interner: its bytes in the arena, the
// number of rows using it, and the next string whose hash has the same
// index bucket (0: none).
type interned struct {
	hash uint64
	off  uint64
	n    uint32
	refs uint32
	next uint32
}

// interner gives each distinct byte string a small id and keeps the bytes
// in one arena. Nothing in it holds a pointer but the arena and the two
// slices, so the collector does not scan millions of rows' strings; ids
// are reused once nothing refers to them, and the arena is compacted when
// most of it is dead.
//
// The arena's bytes are never overwritten: compaction copies the live
// strings into a new arena, so a string returned by str stays valid
// after its id is released (it keeps the old arena alive until dropped).
type interner struct {
	seed  maphash.Seed
	arena []byte
	ents  []interned // ents[0] unused: id 0 is "none"
	free  []uint32
	index map[uint64]uint32 // hash → first id with it
	dead  int               // arena bytes of released strings
}

func newInterner() *interner {
	return &interner{seed: maphash.MakeSeed(), ents: make([]interned, 1), index: map[uint64]uint32{}}
}

// bytes is id's string, aliasing the arena.
func (in *interner) bytes(id uint32) []byte {
	e := &in.ents[id]
	return in.arena[e.off : e.off+uint64(e.n) : e.off+uint64(e.n)]
}

// str is id's string without a copy (the arena's bytes never change).
func (in *interner) str(id uint32) string {
	e := &in.ents[id]
	if e.n == 0 {
		return ""
	}
	return unsafe.String(&in.arena[e.off], int(e.n))
}

// find is the id of b, or 0.
func (in *interner) find(b []byte) uint32 {
	h := maphash.Bytes(in.seed, b)
	for id := in.index[h]; id != 0; id = in.ents[id].next {
		if e := &in.ents[id]; e.hash == h && string(in.bytes(id)) == string(b) {
			return id
		}
	}
	return 0
}

// ref is the id of b, added if new, with one more reference.
func (in *interner) ref(b []byte) uint32 {
	h := maphash.Bytes(in.seed, b)
	for id := in.index[h]; id != 0; id = in.ents[id].next {
		if e := &in.ents[id]; e.hash == h && string(in.bytes(id)) == string(b) {
			e.refs++
			return id
		}
	}
	var id uint32
	if n := len(in.free); n > 0 {
		id, in.free = in.free[n-1], in.free[:n-1]
	} else {
		id = uint32(len(in.ents))
		in.ents = append(in.ents, interned{})
	}
	off := uint64(len(in.arena))
	in.arena = append(in.arena, b...)
	in.ents[id] = interned{hash: h, off: off, n: uint32(len(b)), refs: 1, next: in.index[h]}
	in.index[h] = id
	return id
}

// unref drops one reference to id (0: nothing); the last one releases
// it, and unref reports whether it did.
func (in *interner) unref(id uint32) bool {
	if id == 0 {
		return false
	}
	e := &in.ents[id]
	if e.refs--; e.refs > 0 {
		return false
	}
	if first := in.index[e.hash]; first == id {
		if e.next == 0 {
			delete(in.index, e.hash)
		} else {
			in.index[e.hash] = e.next
		}
	} else {
		p := first
		for in.ents[p].next != id {
			p = in.ents[p].next
		}
		in.ents[p].next = e.next
	}
	in.dead += int(e.n)
	*e = interned{}
	in.free = append(in.free, id)
	if in.dead > 1<<16 && in.dead > len(in.arena)/2 {
		in.compact()
	}
	return true
}

// compact copies the live strings into a new arena.
func (in *interner) compact() {
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

// live is the number of strings held.
func (in *interner) live() int { return len(in.ents) - 1 - len(in.free) }
