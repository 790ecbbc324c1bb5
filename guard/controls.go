package guard

import (
	"maps"
	"math"
	"sync"
	"sync/atomic"

	"github.com/tollgate/tollgate/guard/rules"
)

// Controls are the dynamic, per-key and per-tenant settings the control
// plane pushes to gateways: blocklist and allowlist entries by key_id,
// penalties (429 cooldowns) by key_id, and temporary overrides by key_id
// (key-scope rules) or tenant (tenant-scope rules). Entries carry an expiry
// and are ignored once it has passed; Sweep drops them.
//
// Controls hold one immutable ControlSet at a time. A decision loads it
// once, through an atomic pointer, and reads every control from that one
// set: no lock, no allocation.
// Writes are copy-on-write, so a decision sees either the state before a
// change or the state after it, never half of one (a key moved from a
// penalty to the blocklist is never seen in neither). Writers serialize on
// a mutex. Single-entry changes (Block, SetPenalty, …, and batches of them
// through Edit) do not copy the lists: the set they publish shares the
// maps of the one before and carries the entries changed since in a small
// overlay of its own, which a decision reads first. The overlay is folded into new maps when it grows past the
// square root of the entries (at least 64), at Sweep, and when Snapshot
// is asked for the maps. Replace and Update publish whole sets (Update
// copies every map). Controls is safe for concurrent use.
//
// Every change increments Generation, which caches of anything derived
// from the controls key on (see Generation).
type Controls struct {
	cur atomic.Pointer[ControlSet]
	mu  sync.Mutex // serializes writers; readers never take it
}

// ControlSet is one state of Controls: five maps, each keyed by key_id
// except TenantOverrides (keyed by tenant). A nil map is empty.
//
// A ControlSet given to Replace, or returned by Snapshot, belongs to the
// Controls and must never be modified: readers share it without a lock.
// Edit a copy (Clone, or Update's argument) instead. Its methods Block,
// Unblock, … (ControlWriter) write its maps, for a set being built.
type ControlSet struct {
	Blocked         map[string]Entry
	Allowed         map[string]Entry
	Penalties       map[string]Penalty
	KeyOverrides    map[string]Override
	TenantOverrides map[string]Override

	// gen is the Generation this set was published as.
	gen uint64
	// recent are the entries Edit changed since the maps were last
	// folded, read before the maps; nil in a set Snapshot returns.
	recent *overlay
}

// overlay holds the entries changed since a set's maps were made, by
// kind: each one set (gone false) or removed (gone true). Its maps are
// copied on write, like the sets'.
type overlay struct {
	blocked, allowed              map[string]pending[Entry]
	penalties                     map[string]pending[Penalty]
	keyOverrides, tenantOverrides map[string]pending[Override]
	// mask is, by kind, a filter of the keys in its map (keyBit): a read
	// of a key whose bit is clear skips the map, and its hashing. any is
	// the masks of every kind together.
	mask [kinds]uint64
	any  uint64
}

// keyBit is k's bit in an overlay's mask: from its length and two of its
// bytes, a few instructions where a map lookup hashes the whole key.
func keyBit(k string) uint64 {
	n := uint(len(k))
	if n == 0 {
		return 1
	}
	return 1 << ((n + uint(k[n-1]) + 7*uint(k[n/2])) & 63)
}

// pending is an overlay's entry: v set, or the key removed.
type pending[V any] struct {
	v    V
	gone bool
}

// size is the number of entries of o.
func (o *overlay) size() int {
	return len(o.blocked) + len(o.allowed) + len(o.penalties) + len(o.keyOverrides) + len(o.tenantOverrides)
}

// The reads of one entry, overlay first: what decisions read. Each is
// look on its kind's maps; look and changes inline into it, so a read is
// one call, as when each kind's was written out.
func (s *ControlSet) blocked(k string) (Entry, bool) {
	o := s.changes()
	return look(o.mask[kindBlocked], o.blocked, s.Blocked, k)
}

func (s *ControlSet) allowed(k string) (Entry, bool) {
	o := s.changes()
	return look(o.mask[kindAllowed], o.allowed, s.Allowed, k)
}

func (s *ControlSet) penaltyOf(k string) (Penalty, bool) {
	o := s.changes()
	return look(o.mask[kindPenalties], o.penalties, s.Penalties, k)
}

func (s *ControlSet) keyOverride(k string) (Override, bool) {
	o := s.changes()
	return look(o.mask[kindKeyOverrides], o.keyOverrides, s.KeyOverrides, k)
}

func (s *ControlSet) tenantOverride(k string) (Override, bool) {
	o := s.changes()
	return look(o.mask[kindTenantOverrides], o.tenantOverrides, s.TenantOverrides, k)
}

// look reads k of one kind: from the overlay's map over when the kind's
// mask may hold k, else from the set's map.
func look[V any](mask uint64, over map[string]pending[V], maps map[string]V, k string) (V, bool) {
	if mask&keyBit(k) != 0 {
		if p, ok := over[k]; ok {
			return p.v, !p.gone
		}
	}
	v, ok := maps[k]
	return v, ok
}

// noOverlay stands for the overlay of a set without one: every mask is
// clear, so no read reaches its (nil) maps. Nothing writes it.
var noOverlay overlay

// changes is s's overlay, or noOverlay.
func (s *ControlSet) changes() *overlay {
	if s.recent != nil {
		return s.recent
	}
	return &noOverlay
}

// Entry is a blocklist or allowlist entry. Expiry is Unix microseconds, 0
// for none. Level is the penalty ladder's level of a block the ladder
// imposed (0 for an operator's entry), reported in Decision.PenaltyLevel;
// Close asks gateways to answer the key at the connection level where the
// peer is the client itself, as for Penalty.Close. What each level means,
// and which may close, is the control plane's (package
// schemas/tollgatev1); the guard only carries them.
type Entry struct {
	Expiry int64
	Reason string
	Level  int
	Close  bool
}

// Penalty is a 429 cooldown on a key. Until is Unix microseconds;
// a penalty applies while Until is in the future (math.MaxInt64: until it
// is lifted). Level is the penalty ladder's level; Close asks gateways to
// answer the key at the connection level (Connection: close) where the
// peer is the client.
type Penalty struct {
	Level  int
	Until  int64
	Reason string
	Close  bool
}

// Override is a temporary override of every rule of one scope (key or
// tenant), or of one rule when Rule is set. Level is the penalty ladder's
// level of an override the ladder imposed, 0 for an operator's.
type Override struct {
	rules.Override
	Rule  string
	Level int
}

// NewControls returns empty Controls, at Generation 0.
func NewControls() *Controls {
	c := &Controls{}
	c.cur.Store(&ControlSet{})
	return c
}

// Len is the number of entries of every kind, expired ones included until
// Sweep drops them.
func (s *ControlSet) Len() int {
	var r overlay
	if s.recent != nil {
		r = *s.recent
	}
	return count(s.Blocked, r.blocked) + count(s.Allowed, r.allowed) + count(s.Penalties, r.penalties) +
		count(s.KeyOverrides, r.keyOverrides) + count(s.TenantOverrides, r.tenantOverrides)
}

// count is the number of entries of base with the overlay's map r on top.
func count[V any](base map[string]V, r map[string]pending[V]) int {
	n := len(base)
	for k, p := range r {
		_, in := base[k]
		switch {
		case p.gone && in:
			n--
		case !p.gone && !in:
			n++
		}
	}
	return n
}

// Clone returns a deep copy of s that the caller owns (nil maps stay nil,
// unless an entry was set in them since they were made).
func (s *ControlSet) Clone() *ControlSet {
	var r overlay
	if s.recent != nil {
		r = *s.recent
	}
	return &ControlSet{
		Blocked:         fold(s.Blocked, r.blocked),
		Allowed:         fold(s.Allowed, r.allowed),
		Penalties:       fold(s.Penalties, r.penalties),
		KeyOverrides:    fold(s.KeyOverrides, r.keyOverrides),
		TenantOverrides: fold(s.TenantOverrides, r.tenantOverrides),
	}
}

// fold returns a new map of base with the overlay's map r on top (a
// clone of base when r is empty).
func fold[V any](base map[string]V, r map[string]pending[V]) map[string]V {
	if len(r) == 0 {
		return maps.Clone(base)
	}
	out := make(map[string]V, len(base)+len(r))
	maps.Copy(out, base)
	for k, p := range r {
		if p.gone {
			delete(out, k)
		} else {
			out[k] = p.v
		}
	}
	return out
}

// Generation counts the changes of c: it starts at 0 and every call that
// changes the controls (Replace, Update, Sweep when it drops an entry, and
// each single-entry method) publishes a new ControlSet one generation
// higher. A value computed from the controls at generation g (say a
// per-(key, route) resolution of the local fast path: listed, penalised,
// which overrides apply) stays valid while Generation() == g; checking it
// is one atomic load. Take g from the ControlSet the value is computed
// from (Snapshot, then ControlSet.Generation), so that a change in between
// makes the cached value stale rather than wrongly current. Expiry is not
// a change: a cache must still honour the expiries of what it cached.
func (c *Controls) Generation() uint64 { return c.cur.Load().gen }

// Generation is the generation s was published as (see
// Controls.Generation); 0 for a set not published yet.
func (s *ControlSet) Generation() uint64 { return s.gen }

// Snapshot returns the current state, its maps whole. It is shared: never
// modify it. It does not change when c changes later. When single-entry
// changes are pending in an overlay, Snapshot folds them into new maps
// first (a copy of the lists, published as the same generation); a
// decision reads the overlay instead.
func (c *Controls) Snapshot() *ControlSet {
	if cur := c.cur.Load(); cur.recent == nil {
		return cur
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	cur := c.cur.Load()
	if cur.recent != nil {
		cur = c.folded(cur)
		c.cur.Store(cur)
	}
	return cur
}

// BlockEntry returns a key_id's blocklist entry, expired or not, as a
// decision reads it now: from the current set, its overlay first, without
// folding it (Snapshot would).
func (c *Controls) BlockEntry(keyID string) (Entry, bool) { return c.current().blocked(keyID) }

// current is the state a decision reads: maybe with an overlay.
func (c *Controls) current() *ControlSet { return c.cur.Load() }

// folded returns cur with its overlay folded into new maps (none nil),
// at cur's generation.
func (c *Controls) folded(cur *ControlSet) *ControlSet {
	var r overlay
	if cur.recent != nil {
		r = *cur.recent
	}
	// A kind without changes keeps its map: published maps are never
	// written.
	next := &ControlSet{
		Blocked:         foldShared(cur.Blocked, r.blocked),
		Allowed:         foldShared(cur.Allowed, r.allowed),
		Penalties:       foldShared(cur.Penalties, r.penalties),
		KeyOverrides:    foldShared(cur.KeyOverrides, r.keyOverrides),
		TenantOverrides: foldShared(cur.TenantOverrides, r.tenantOverrides),
		gen:             cur.gen,
	}
	next.init()
	return next
}

// foldShared is fold that returns base itself when r is empty.
func foldShared[V any](base map[string]V, r map[string]pending[V]) map[string]V {
	if len(r) == 0 {
		return base
	}
	return fold(base, r)
}

// Replace makes s the whole state at once, as after an initial load or a
// resync of the control plane, or a last-known-good copy read from disk.
// Controls take s over: the caller must not modify it afterwards. A nil s
// empties the controls.
func (c *Controls) Replace(s *ControlSet) {
	if s == nil {
		s = &ControlSet{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.publish(s)
}

// Update applies a batch of changes atomically: fn edits a private copy of
// the current state (every map cloned, nil maps made empty), which is then
// published whole. fn runs with writers excluded and must not call back
// into c.
func (c *Controls) Update(fn func(next *ControlSet)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	next := c.cur.Load().Clone()
	next.init()
	fn(next)
	c.publish(next)
}

// Sweep drops the entries that have expired at now (Unix µs) and returns
// how many it dropped. Expired entries are already ignored by decisions;
// sweeping only frees their memory, so a gateway calls it every few
// seconds. A sweep that finds nothing to drop changes nothing, not even
// Generation. It also folds the single-entry changes pending in an
// overlay into new maps.
func (c *Controls) Sweep(now int64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	cur := c.cur.Load()
	if cur.recent != nil {
		// The periodic fold of the overlay: the same state, the same
		// generation.
		cur = c.folded(cur)
		c.cur.Store(cur)
	}
	n := countExpired(cur.Blocked, now, entryExpiry) + countExpired(cur.Allowed, now, entryExpiry) +
		countExpired(cur.Penalties, now, penaltyExpiry) + countExpired(cur.KeyOverrides, now, overrideExpiry) +
		countExpired(cur.TenantOverrides, now, overrideExpiry)
	if n == 0 {
		return 0
	}
	next := &ControlSet{
		Blocked:         dropExpired(cur.Blocked, now, entryExpiry),
		Allowed:         dropExpired(cur.Allowed, now, entryExpiry),
		Penalties:       dropExpired(cur.Penalties, now, penaltyExpiry),
		KeyOverrides:    dropExpired(cur.KeyOverrides, now, overrideExpiry),
		TenantOverrides: dropExpired(cur.TenantOverrides, now, overrideExpiry),
	}
	c.publish(next)
	return n
}

// publish makes next current with the next generation. c.mu must be held.
func (c *Controls) publish(next *ControlSet) {
	next.gen = c.cur.Load().gen + 1
	c.cur.Store(next)
}

// init makes s's nil maps empty.
func (s *ControlSet) init() {
	if s.Blocked == nil {
		s.Blocked = map[string]Entry{}
	}
	if s.Allowed == nil {
		s.Allowed = map[string]Entry{}
	}
	if s.Penalties == nil {
		s.Penalties = map[string]Penalty{}
	}
	if s.KeyOverrides == nil {
		s.KeyOverrides = map[string]Override{}
	}
	if s.TenantOverrides == nil {
		s.TenantOverrides = map[string]Override{}
	}
}

func entryExpiry(e Entry) int64       { return e.Expiry }
func overrideExpiry(o Override) int64 { return o.Expiry }

// penaltyExpiry is a penalty's Until, which 0 does not mean "never".
func penaltyExpiry(p Penalty) int64 {
	if p.Until <= 0 {
		return math.MinInt64 // already over
	}
	return p.Until
}

func countExpired[V any](m map[string]V, now int64, exp func(V) int64) int {
	n := 0
	for _, v := range m {
		if !live(exp(v), now) {
			n++
		}
	}
	return n
}

// dropExpired returns m without its expired entries: m itself when none
// expired (shared, never modified), else a new map.
func dropExpired[V any](m map[string]V, now int64, exp func(V) int64) map[string]V {
	if countExpired(m, now, exp) == 0 {
		return m
	}
	out := make(map[string]V, len(m))
	for k, v := range m {
		if live(exp(v), now) {
			out[k] = v
		}
	}
	return out
}

// ControlWriter sets and removes single entries. *Controls is one (each
// call a change of its own), so is the writer Edit hands its function (the
// calls one change), and so is a *ControlSet being built (its maps
// written in place, nil ones made).
type ControlWriter interface {
	// Block puts a key_id on the blocklist.
	Block(keyID string, e Entry)
	// Unblock removes a key_id from the blocklist.
	Unblock(keyID string)
	// Allow puts a key_id on the allowlist.
	Allow(keyID string, e Entry)
	// Disallow removes a key_id from the allowlist.
	Disallow(keyID string)
	// SetPenalty puts a key_id under a penalty.
	SetPenalty(keyID string, p Penalty)
	// LiftPenalty removes a key_id's penalty.
	LiftPenalty(keyID string)
	// SetKeyOverride sets a temporary override on a key_id's key-scope
	// rules.
	SetKeyOverride(keyID string, o Override)
	// DeleteKeyOverride removes a key_id's override.
	DeleteKeyOverride(keyID string)
	// SetTenantOverride sets a temporary override on a tenant's
	// tenant-scope rules.
	SetTenantOverride(tenant string, o Override)
	// DeleteTenantOverride removes a tenant's override.
	DeleteTenantOverride(tenant string)
}

// Edit applies a batch of single-entry changes atomically, without a copy
// of the lists: fn's calls are recorded in the overlay of a new set that
// shares the current set's maps (see Controls), published once fn
// returns. fn runs with writers
// excluded, must not call back into c, and must not keep w.
func (c *Controls) Edit(fn func(w ControlWriter)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cur := c.cur.Load()
	e := &editor{cur: cur}
	if cur.recent != nil {
		e.next = *cur.recent
	}
	fn(e)
	for _, m := range e.next.mask {
		e.next.any |= m
	}
	next := &ControlSet{Blocked: cur.Blocked, Allowed: cur.Allowed, Penalties: cur.Penalties,
		KeyOverrides: cur.KeyOverrides, TenantOverrides: cur.TenantOverrides}
	if e.next.size() > 0 {
		next.recent = &e.next
	}
	if next.recent != nil && next.recent.size() > foldAt(cur) {
		next = c.folded(next)
	}
	c.publish(next)
}

// minFold is the fewest overlay entries that are folded into new maps.
const minFold = 64

// foldAt is the size of overlay past which Edit folds it into new maps:
// the square root of the entries (at least minFold), which balances a
// change's copy of the overlay against its share of the next fold's copy
// of the lists — each about the square root of the entries.
func foldAt(s *ControlSet) int {
	n := len(s.Blocked) + len(s.Allowed) + len(s.Penalties) + len(s.KeyOverrides) + len(s.TenantOverrides)
	return max(minFold, int(math.Sqrt(float64(n))))
}

// editor is Edit's ControlWriter: it writes a copy of the current set's
// overlay, each of whose maps it copies at its first write.
type editor struct {
	cur    *ControlSet
	next   overlay
	copied [kinds]bool // next's map of each kind is this edit's own
}

// The overlay's kinds, as its mask and editor.copied count them.
const (
	kindBlocked = iota
	kindAllowed
	kindPenalties
	kindKeyOverrides
	kindTenantOverrides
	kinds
)

// own returns r as a map this edit may write: a copy at the first write.
func own[V any](r map[string]pending[V], copied *bool) map[string]pending[V] {
	if *copied {
		return r
	}
	*copied = true
	out := make(map[string]pending[V], len(r)+1)
	maps.Copy(out, r)
	return out
}

// set records k set to v.
func set[V any](r *map[string]pending[V], copied *bool, mask *uint64, k string, v V) {
	*r = own(*r, copied)
	(*r)[k] = pending[V]{v: v}
	*mask |= keyBit(k)
}

// remove records k removed: a tombstone when base holds k, else no entry.
func remove[V any](r *map[string]pending[V], copied *bool, mask *uint64, base map[string]V, k string) {
	_, inBase := base[k]
	if _, inRecent := (*r)[k]; !inBase && !inRecent {
		return
	}
	*r = own(*r, copied)
	if inBase {
		(*r)[k] = pending[V]{gone: true}
		*mask |= keyBit(k)
	} else {
		delete(*r, k) // its bit stays: a filter may say yes in vain
	}
}

func (e *editor) Block(keyID string, v Entry) {
	set(&e.next.blocked, &e.copied[kindBlocked], &e.next.mask[kindBlocked], keyID, v)
}

func (e *editor) Unblock(keyID string) {
	remove(&e.next.blocked, &e.copied[kindBlocked], &e.next.mask[kindBlocked], e.cur.Blocked, keyID)
}

func (e *editor) Allow(keyID string, v Entry) {
	set(&e.next.allowed, &e.copied[kindAllowed], &e.next.mask[kindAllowed], keyID, v)
}

func (e *editor) Disallow(keyID string) {
	remove(&e.next.allowed, &e.copied[kindAllowed], &e.next.mask[kindAllowed], e.cur.Allowed, keyID)
}

func (e *editor) SetPenalty(keyID string, p Penalty) {
	set(&e.next.penalties, &e.copied[kindPenalties], &e.next.mask[kindPenalties], keyID, p)
}

func (e *editor) LiftPenalty(keyID string) {
	remove(&e.next.penalties, &e.copied[kindPenalties], &e.next.mask[kindPenalties], e.cur.Penalties, keyID)
}

func (e *editor) SetKeyOverride(keyID string, o Override) {
	set(&e.next.keyOverrides, &e.copied[kindKeyOverrides], &e.next.mask[kindKeyOverrides], keyID, o)
}

func (e *editor) DeleteKeyOverride(keyID string) {
	remove(&e.next.keyOverrides, &e.copied[kindKeyOverrides], &e.next.mask[kindKeyOverrides], e.cur.KeyOverrides, keyID)
}

func (e *editor) SetTenantOverride(tenant string, o Override) {
	set(&e.next.tenantOverrides, &e.copied[kindTenantOverrides], &e.next.mask[kindTenantOverrides], tenant, o)
}

func (e *editor) DeleteTenantOverride(tenant string) {
	remove(&e.next.tenantOverrides, &e.copied[kindTenantOverrides], &e.next.mask[kindTenantOverrides], e.cur.TenantOverrides, tenant)
}

// Block puts a key_id on the blocklist.
func (c *Controls) Block(keyID string, e Entry) { c.Edit(func(w ControlWriter) { w.Block(keyID, e) }) }

// Unblock removes a key_id from the blocklist.
func (c *Controls) Unblock(keyID string) { c.Edit(func(w ControlWriter) { w.Unblock(keyID) }) }

// Allow puts a key_id on the allowlist.
func (c *Controls) Allow(keyID string, e Entry) { c.Edit(func(w ControlWriter) { w.Allow(keyID, e) }) }

// Disallow removes a key_id from the allowlist.
func (c *Controls) Disallow(keyID string) { c.Edit(func(w ControlWriter) { w.Disallow(keyID) }) }

// SetPenalty puts a key_id under a penalty.
func (c *Controls) SetPenalty(keyID string, p Penalty) {
	c.Edit(func(w ControlWriter) { w.SetPenalty(keyID, p) })
}

// LiftPenalty removes a key_id's penalty.
func (c *Controls) LiftPenalty(keyID string) { c.Edit(func(w ControlWriter) { w.LiftPenalty(keyID) }) }

// SetKeyOverride sets a temporary override on a key_id's key-scope rules.
func (c *Controls) SetKeyOverride(keyID string, o Override) {
	c.Edit(func(w ControlWriter) { w.SetKeyOverride(keyID, o) })
}

// SetTenantOverride sets a temporary override on a tenant's tenant-scope
// rules.
func (c *Controls) SetTenantOverride(tenant string, o Override) {
	c.Edit(func(w ControlWriter) { w.SetTenantOverride(tenant, o) })
}

// DeleteKeyOverride removes a key_id's override.
func (c *Controls) DeleteKeyOverride(keyID string) {
	c.Edit(func(w ControlWriter) { w.DeleteKeyOverride(keyID) })
}

// DeleteTenantOverride removes a tenant's override.
func (c *Controls) DeleteTenantOverride(tenant string) {
	c.Edit(func(w ControlWriter) { w.DeleteTenantOverride(tenant) })
}

// Block puts a key_id on s's blocklist (a set being built: see ControlSet).
func (s *ControlSet) Block(keyID string, e Entry) { s.init(); s.Blocked[keyID] = e }

// Unblock removes a key_id from s's blocklist.
func (s *ControlSet) Unblock(keyID string) { delete(s.Blocked, keyID) }

// Allow puts a key_id on s's allowlist.
func (s *ControlSet) Allow(keyID string, e Entry) { s.init(); s.Allowed[keyID] = e }

// Disallow removes a key_id from s's allowlist.
func (s *ControlSet) Disallow(keyID string) { delete(s.Allowed, keyID) }

// SetPenalty puts a key_id of s under a penalty.
func (s *ControlSet) SetPenalty(keyID string, p Penalty) { s.init(); s.Penalties[keyID] = p }

// LiftPenalty removes a key_id's penalty from s.
func (s *ControlSet) LiftPenalty(keyID string) { delete(s.Penalties, keyID) }

// SetKeyOverride sets an override on a key_id's key-scope rules in s.
func (s *ControlSet) SetKeyOverride(keyID string, o Override) { s.init(); s.KeyOverrides[keyID] = o }

// DeleteKeyOverride removes a key_id's override from s.
func (s *ControlSet) DeleteKeyOverride(keyID string) { delete(s.KeyOverrides, keyID) }

// SetTenantOverride sets an override on a tenant's tenant-scope rules in s.
func (s *ControlSet) SetTenantOverride(tenant string, o Override) {
	s.init()
	s.TenantOverrides[tenant] = o
}

// DeleteTenantOverride removes a tenant's override from s.
func (s *ControlSet) DeleteTenantOverride(tenant string) { delete(s.TenantOverrides, tenant) }

func live(expiry, now int64) bool { return expiry == 0 || expiry > now }

// The reads below are what decisions read. Each takes the plain maps'
// path unless s's overlay may hold its key (inOverlay), and only then the
// overlay's, so that pending changes cost the reads of other keys a few
// instructions.

// inOverlay reports whether s's overlay may hold an entry of any kind
// under k.
func (s *ControlSet) inOverlay(k string) bool {
	r := s.recent
	return r != nil && r.any&keyBit(k) != 0
}

// status returns the list status of a key_id at time now (µs). (With an
// overlay, through statusExpiry: without one, the few lines a decision
// inlines.)
func (s *ControlSet) status(keyID string, now int64) rules.ListStatus {
	if s.recent != nil {
		st, _ := s.statusExpiry(keyID, now)
		return st
	}
	if e, ok := s.Blocked[keyID]; ok && live(e.Expiry, now) {
		return rules.Blocklisted
	}
	if e, ok := s.Allowed[keyID]; ok && live(e.Expiry, now) {
		return rules.Allowlisted
	}
	return rules.Unlisted
}

// statusExpiry is status with the expiry of the entry that decided it (0
// for none, or an entry that never expires), for caches that must honour
// it.
func (s *ControlSet) statusExpiry(keyID string, now int64) (rules.ListStatus, int64) {
	if s.inOverlay(keyID) {
		return s.statusOverlay(keyID, now)
	}
	if e, ok := s.Blocked[keyID]; ok && live(e.Expiry, now) {
		return rules.Blocklisted, e.Expiry
	}
	if e, ok := s.Allowed[keyID]; ok && live(e.Expiry, now) {
		return rules.Allowlisted, e.Expiry
	}
	return rules.Unlisted, 0
}

// statusOverlay is statusExpiry through the overlay.
func (s *ControlSet) statusOverlay(keyID string, now int64) (rules.ListStatus, int64) {
	if e, ok := s.blocked(keyID); ok && live(e.Expiry, now) {
		return rules.Blocklisted, e.Expiry
	}
	if e, ok := s.allowed(keyID); ok && live(e.Expiry, now) {
		return rules.Allowlisted, e.Expiry
	}
	return rules.Unlisted, 0
}

// blockEntry returns a key_id's live blocklist entry, if any: its Level
// says whether the penalty ladder imposed it (0: an operator's block). A
// decision reads it only once it knows the key is blocked, from the
// controls as they are then (a cached resolution carries the list status,
// not the entry).
func (s *ControlSet) blockEntry(keyID string, now int64) (Entry, bool) {
	if e, ok := s.blocked(keyID); ok && live(e.Expiry, now) {
		return e, true
	}
	return Entry{}, false
}

// penalty returns a key_id's penalty, if one applies at now (µs).
func (s *ControlSet) penalty(keyID string, now int64) (Penalty, bool) {
	if s.recent != nil {
		return s.penaltyOverlay(keyID, now)
	}
	p, ok := s.Penalties[keyID]
	return p, ok && p.Until > now
}

// penaltyOverlay is penalty for a set with an overlay.
func (s *ControlSet) penaltyOverlay(keyID string, now int64) (Penalty, bool) {
	var p Penalty
	var ok bool
	if s.inOverlay(keyID) {
		p, ok = s.penaltyOf(keyID)
	} else {
		p, ok = s.Penalties[keyID]
	}
	return p, ok && p.Until > now
}

// override returns the live override for a rule of the given scope.
func (s *ControlSet) override(r *rules.Rule, keyID, tenant string, now int64) (rules.Override, bool) {
	var m map[string]Override
	var k string
	switch r.Scope {
	case rules.ScopeKey:
		m, k = s.KeyOverrides, keyID
	case rules.ScopeTenant:
		m, k = s.TenantOverrides, tenant
	default:
		return rules.Override{}, false
	}
	if k == "" {
		return rules.Override{}, false
	}
	if s.inOverlay(k) {
		return s.overrideOverlay(r, k, now)
	}
	o, ok := m[k]
	if !ok || !live(o.Expiry, now) || (o.Rule != "" && o.Rule != r.ID) {
		return rules.Override{}, false
	}
	return o.Override, true
}

// overrideOverlay is override through the overlay, for a rule of scope
// key or tenant and its key k.
func (s *ControlSet) overrideOverlay(r *rules.Rule, k string, now int64) (rules.Override, bool) {
	var o Override
	var ok bool
	if r.Scope == rules.ScopeKey {
		o, ok = s.keyOverride(k)
	} else {
		o, ok = s.tenantOverride(k)
	}
	if !ok || !live(o.Expiry, now) || (o.Rule != "" && o.Rule != r.ID) {
		return rules.Override{}, false
	}
	return o.Override, true
}

// overrideExpiry is override with the override's expiry (0: never).
func (s *ControlSet) overrideExpiry(r *rules.Rule, keyID, tenant string, now int64) (rules.Override, int64, bool) {
	o, ok := s.override(r, keyID, tenant, now)
	return o, o.Expiry, ok
}
