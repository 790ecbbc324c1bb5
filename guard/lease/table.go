package lease

import (
	"hash/maphash"
	"sync/atomic"
)

// probe is how many slots a counter may occupy from its hash on.
const probe = 8

// table maps counter names to their local state: open addressing over a
// fixed array of atomic pointers, so that a look-up takes no lock and
// writes nothing, and memory stays bounded. A full neighbourhood makes
// room by evicting an idle counter (no usable lease, no live negative
// entry); when none is idle the new counter gets no local state.
type table struct {
	size  int
	slots []atomic.Pointer[entry]
	mask  uint64
	seed  maphash.Seed
}

func (t *table) init() {
	n := 1
	for n < t.size || n < probe {
		n <<= 1
	}
	t.slots = make([]atomic.Pointer[entry], n)
	t.mask = uint64(n - 1)
	t.seed = maphash.MakeSeed()
}

// get returns the state of a counter, or nil.
func (t *table) get(name string) *entry {
	h := maphash.String(t.seed, name)
	for i := uint64(0); i < probe; i++ {
		if e := t.slots[(h+i)&t.mask].Load(); e != nil && e.name == name {
			return e
		}
	}
	return nil
}

// getOrCreate returns the state of a counter, creating it (at local time
// now) when there is room; nil when there is none. evicted is the idle
// counter that made room, if any: its lease (expired, perhaps with units
// left) is the caller's to give back.
func (t *table) getOrCreate(name string, now int64) (e, evicted *entry) {
	h := maphash.String(t.seed, name)
	var free, victim *atomic.Pointer[entry]
	var old *entry
	for i := uint64(0); i < probe; i++ {
		p := &t.slots[(h+i)&t.mask]
		e := p.Load()
		switch {
		case e == nil:
			if free == nil {
				free = p
			}
		case e.name == name:
			return e, nil
		case victim == nil && e.idle(now):
			victim, old = p, e
		}
	}
	if free != nil {
		victim, old = free, nil
	}
	if victim == nil {
		return nil, nil
	}
	ne := &entry{name: name, created: now, since: now}
	if !victim.CompareAndSwap(old, ne) {
		// Another call took the slot: use its state if it is this counter.
		return t.get(name), nil
	}
	if old != nil {
		old.dead.Store(true)
	}
	return ne, old
}

// minAge is how long a counter's state is kept at least, idle or not, so
// that counters sharing a neighbourhood do not evict each other before
// they had a chance to become hot (µs).
const minAge = 1_000_000

// idle reports whether e may be evicted at local time now: no lease being
// renewed or still usable, no negative entry still answering.
func (e *entry) idle(now int64) bool {
	if now-e.created < minAge || e.refilling.Load() {
		return false
	}
	if l := e.lease.Load(); l != nil && now < l.until && l.units.Load() > 0 {
		return false
	}
	if sn := e.last.Load(); sn != nil && sn.rejected && now < sn.until {
		return false
	}
	return true
}

// each calls fn for every counter held.
func (t *table) each(fn func(*entry)) {
	for i := range t.slots {
		if e := t.slots[i].Load(); e != nil {
			fn(e)
		}
	}
}
