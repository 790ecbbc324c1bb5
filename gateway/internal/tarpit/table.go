// Package tarpit throttles, at accept time, the client addresses the
// gateway has recently had to answer at the connection level: a client
// whose connection was closed for a key at the top of the penalty ladder
// and that comes straight back opens connections only to be
// rejected. For a cooldown after such a close ([Table.Mark]) every new
// connection from that address is held for a delay before the server reads
// it ([Listener]); the client waits instead of retrying, and the gateway
// spends a timer on it instead of a request. A held connection is then
// served normally (another key behind the same address is slowed, never
// refused); when too many are held at once, a new one from a throttled
// address is closed at once.
//
// Memory is fixed: the [Table] remembers a bounded number of addresses
// (IPv6 by /64, as rules count them), and the listener holds a bounded
// number of connections. The gateway never marks a trusted proxy: its
// connection is shared with innocent clients.
package tarpit

import (
	"hash/maphash"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// ways is the number of slots an address may occupy: a set-associative
// table, so that marking evicts at most the set's soonest expiry.
const ways = 4

// DefaultAddresses is the default capacity of a Table.
const DefaultAddresses = 4096

// Table remembers throttled client addresses until their cooldown ends.
// Its memory is fixed at creation (about 32 bytes per address); when a
// set is full, a new address replaces the entry that expires soonest. It
// is safe for concurrent use.
type Table struct {
	seed maphash.Seed
	mask uint64 // sets - 1

	// live counts occupied slots (expired ones included until reused), so
	// that an empty table answers Throttled without the lock.
	live atomic.Int64

	mu    sync.Mutex
	slots []slot // sets × ways
}

type slot struct {
	key   [16]byte
	until int64 // Unix ns; 0: free
}

// NewTable returns a Table for about n addresses (rounded up to a power
// of two sets of four; n ≤ 0 means DefaultAddresses).
func NewTable(n int) *Table {
	if n <= 0 {
		n = DefaultAddresses
	}
	sets := 1
	for sets*ways < n {
		sets *= 2
	}
	return &Table{seed: maphash.MakeSeed(), mask: uint64(sets - 1), slots: make([]slot, sets*ways)}
}

// Cap returns the number of addresses the table holds at most.
func (t *Table) Cap() int { return len(t.slots) }

// key is an address as the table knows it: IPv4 (and IPv4-mapped IPv6)
// as is, IPv6 by its /64.
func key(a netip.Addr) [16]byte {
	a = a.Unmap()
	if a.Is6() {
		p, _ := a.Prefix(64)
		a = p.Addr()
	}
	return a.As16()
}

func (t *Table) set(k *[16]byte) []slot {
	i := maphash.Bytes(t.seed, k[:]) & t.mask
	return t.slots[i*ways : (i+1)*ways]
}

// Mark throttles a until until (its cooldown's end), or extends its
// cooldown to until. An invalid address is ignored.
func (t *Table) Mark(a netip.Addr, until time.Time) {
	if !a.IsValid() {
		return
	}
	k := key(a)
	u := until.UnixNano()
	t.mu.Lock()
	defer t.mu.Unlock()
	set := t.set(&k)
	victim := 0
	for i := range set {
		s := &set[i]
		if s.until != 0 && s.key == k {
			s.until = max(s.until, u)
			return
		}
		if set[i].until < set[victim].until {
			victim = i
		}
	}
	if set[victim].until == 0 {
		t.live.Add(1)
	}
	set[victim] = slot{key: k, until: u}
}

// Throttled reports whether a is throttled at now.
func (t *Table) Throttled(a netip.Addr, now time.Time) bool {
	if t.live.Load() == 0 || !a.IsValid() {
		return false
	}
	k := key(a)
	n := now.UnixNano()
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, s := range t.set(&k) {
		if s.until > n && s.key == k {
			return true
		}
	}
	return false
}

// Len returns the number of addresses throttled at now.
func (t *Table) Len(now time.Time) int {
	if t.live.Load() == 0 {
		return 0
	}
	n := now.UnixNano()
	t.mu.Lock()
	defer t.mu.Unlock()
	c := 0
	for _, s := range t.slots {
		if s.until > n {
			c++
		}
	}
	return c
}
