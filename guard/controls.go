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
// Writes are copy-on-write: a writer copies the maps it changes, edits the
// copy and publishes it whole, so a decision sees either the state before
// a change or the state after it, never half of one (a key moved from a
// penalty to the blocklist is never seen in neither). Writers serialize on
// a mutex; a write costs a copy of the maps it touches, which suits state
// that changes rarely (operator and penalty-ladder changes) and is read on
// every request. Controls is safe for concurrent use.
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
// Edit a copy (Clone, or Update's argument) instead.
type ControlSet struct {
	Blocked         map[string]Entry
	Allowed         map[string]Entry
	Penalties       map[string]Penalty
	KeyOverrides    map[string]Override
	TenantOverrides map[string]Override

	// gen is the Generation this set was published as.
	gen uint64
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
	return len(s.Blocked) + len(s.Allowed) + len(s.Penalties) + len(s.KeyOverrides) + len(s.TenantOverrides)
}

// Clone returns a deep copy of s that the caller owns (nil maps stay nil).
func (s *ControlSet) Clone() *ControlSet {
	return &ControlSet{
		Blocked:         maps.Clone(s.Blocked),
		Allowed:         maps.Clone(s.Allowed),
		Penalties:       maps.Clone(s.Penalties),
		KeyOverrides:    maps.Clone(s.KeyOverrides),
		TenantOverrides: maps.Clone(s.TenantOverrides),
	}
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

// Snapshot returns the current state. It is shared: never modify it. It
// does not change when c changes later.
func (c *Controls) Snapshot() *ControlSet { return c.cur.Load() }

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
// Generation.
func (c *Controls) Sweep(now int64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	cur := c.cur.Load()
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

// edit applies one single-entry change: it copies the current set (maps
// shared), lets fn replace the one map it changes with a changed copy, and
// publishes the result.
func (c *Controls) edit(fn func(next *ControlSet)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	next := *c.cur.Load()
	fn(&next)
	c.publish(&next)
}

// with returns a copy of m with k set to v.
func with[V any](m map[string]V, k string, v V) map[string]V {
	out := make(map[string]V, len(m)+1)
	maps.Copy(out, m)
	out[k] = v
	return out
}

// without returns a copy of m without k.
func without[V any](m map[string]V, k string) map[string]V {
	out := maps.Clone(m)
	delete(out, k)
	return out
}

// Block puts a key_id on the blocklist.
func (c *Controls) Block(keyID string, e Entry) {
	c.edit(func(n *ControlSet) { n.Blocked = with(n.Blocked, keyID, e) })
}

// Unblock removes a key_id from the blocklist.
func (c *Controls) Unblock(keyID string) {
	c.edit(func(n *ControlSet) { n.Blocked = without(n.Blocked, keyID) })
}

// Allow puts a key_id on the allowlist.
func (c *Controls) Allow(keyID string, e Entry) {
	c.edit(func(n *ControlSet) { n.Allowed = with(n.Allowed, keyID, e) })
}

// Disallow removes a key_id from the allowlist.
func (c *Controls) Disallow(keyID string) {
	c.edit(func(n *ControlSet) { n.Allowed = without(n.Allowed, keyID) })
}

// SetPenalty puts a key_id under a penalty.
func (c *Controls) SetPenalty(keyID string, p Penalty) {
	c.edit(func(n *ControlSet) { n.Penalties = with(n.Penalties, keyID, p) })
}

// LiftPenalty removes a key_id's penalty.
func (c *Controls) LiftPenalty(keyID string) {
	c.edit(func(n *ControlSet) { n.Penalties = without(n.Penalties, keyID) })
}

// SetKeyOverride sets a temporary override on a key_id's key-scope rules.
func (c *Controls) SetKeyOverride(keyID string, o Override) {
	c.edit(func(n *ControlSet) { n.KeyOverrides = with(n.KeyOverrides, keyID, o) })
}

// SetTenantOverride sets a temporary override on a tenant's tenant-scope
// rules.
func (c *Controls) SetTenantOverride(tenant string, o Override) {
	c.edit(func(n *ControlSet) { n.TenantOverrides = with(n.TenantOverrides, tenant, o) })
}

// DeleteKeyOverride removes a key_id's override.
func (c *Controls) DeleteKeyOverride(keyID string) {
	c.edit(func(n *ControlSet) { n.KeyOverrides = without(n.KeyOverrides, keyID) })
}

// DeleteTenantOverride removes a tenant's override.
func (c *Controls) DeleteTenantOverride(tenant string) {
	c.edit(func(n *ControlSet) { n.TenantOverrides = without(n.TenantOverrides, tenant) })
}

func live(expiry, now int64) bool { return expiry == 0 || expiry > now }

// status returns the list status of a key_id at time now (µs).
func (s *ControlSet) status(keyID string, now int64) rules.ListStatus {
	if e, ok := s.Blocked[keyID]; ok && live(e.Expiry, now) {
		return rules.Blocklisted
	}
	if e, ok := s.Allowed[keyID]; ok && live(e.Expiry, now) {
		return rules.Allowlisted
	}
	return rules.Unlisted
}

// blockEntry returns a key_id's live blocklist entry, if any: its Level
// says whether the penalty ladder imposed it (0: an operator's block). A
// decision reads it only once it knows the key is blocked, from the
// controls as they are then (a cached resolution carries the list status,
// not the entry).
func (s *ControlSet) blockEntry(keyID string, now int64) (Entry, bool) {
	if e, ok := s.Blocked[keyID]; ok && live(e.Expiry, now) {
		return e, true
	}
	return Entry{}, false
}

// penalty returns a key_id's penalty, if one applies at now (µs).
func (s *ControlSet) penalty(keyID string, now int64) (Penalty, bool) {
	p, ok := s.Penalties[keyID]
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
	o, ok := m[k]
	if !ok || !live(o.Expiry, now) || (o.Rule != "" && o.Rule != r.ID) {
		return rules.Override{}, false
	}
	return o.Override, true
}

// statusExpiry is status with the expiry of the entry that decided it (0
// for none, or an entry that never expires), for caches that must honour
// it.
func (s *ControlSet) statusExpiry(keyID string, now int64) (rules.ListStatus, int64) {
	if e, ok := s.Blocked[keyID]; ok && live(e.Expiry, now) {
		return rules.Blocklisted, e.Expiry
	}
	if e, ok := s.Allowed[keyID]; ok && live(e.Expiry, now) {
		return rules.Allowlisted, e.Expiry
	}
	return rules.Unlisted, 0
}

// overrideExpiry is override with the override's expiry (0: never).
func (s *ControlSet) overrideExpiry(r *rules.Rule, keyID, tenant string, now int64) (rules.Override, int64, bool) {
	o, ok := s.override(r, keyID, tenant, now)
	return o, o.Expiry, ok
}
