package guard

import (
	"sync"

	"github.com/tollgate/tollgate/guard/rules"
)

// Controls are the dynamic, per-key and per-tenant settings the control
// plane pushes to gateways: blocklist and allowlist entries by key_id,
// penalties (429 cooldowns) by key_id, and temporary overrides by key_id
// (key-scope rules) or tenant (tenant-scope rules). Entries carry an expiry
// and are ignored once it has passed. Controls is safe for concurrent use;
// reads take a shared lock and do not allocate.
type Controls struct {
	mu        sync.RWMutex
	blocked   map[string]Entry
	allowed   map[string]Entry
	penalties map[string]Penalty
	keyOv     map[string]Override
	tenantOv  map[string]Override
}

// Entry is a blocklist or allowlist entry. Expiry is Unix microseconds, 0
// for none.
type Entry struct {
	Expiry int64
	Reason string
}

// Penalty is a 429 cooldown on a key (SPEC §6). Until is Unix microseconds.
// Level is the penalty ladder's level; Close asks gateways to answer the key
// at the connection level (Connection: close) where the peer is the client.
type Penalty struct {
	Level  int
	Until  int64
	Reason string
	Close  bool
}

// Override is a temporary override of every rule of one scope (key or
// tenant), or of one rule when Rule is set.
type Override struct {
	rules.Override
	Rule string
}

// NewControls returns empty Controls.
func NewControls() *Controls {
	return &Controls{
		blocked:   map[string]Entry{},
		allowed:   map[string]Entry{},
		penalties: map[string]Penalty{},
		keyOv:     map[string]Override{},
		tenantOv:  map[string]Override{},
	}
}

// Block puts a key_id on the blocklist.
func (c *Controls) Block(keyID string, e Entry) { c.set(c.blocked, keyID, e) }

// Unblock removes a key_id from the blocklist.
func (c *Controls) Unblock(keyID string) { c.del(c.blocked, keyID) }

// Allow puts a key_id on the allowlist.
func (c *Controls) Allow(keyID string, e Entry) { c.set(c.allowed, keyID, e) }

// Disallow removes a key_id from the allowlist.
func (c *Controls) Disallow(keyID string) { c.del(c.allowed, keyID) }

// SetPenalty puts a key_id under a penalty.
func (c *Controls) SetPenalty(keyID string, p Penalty) {
	c.mu.Lock()
	c.penalties[keyID] = p
	c.mu.Unlock()
}

// LiftPenalty removes a key_id's penalty.
func (c *Controls) LiftPenalty(keyID string) {
	c.mu.Lock()
	delete(c.penalties, keyID)
	c.mu.Unlock()
}

// SetKeyOverride sets a temporary override on a key_id's key-scope rules.
func (c *Controls) SetKeyOverride(keyID string, o Override) {
	c.mu.Lock()
	c.keyOv[keyID] = o
	c.mu.Unlock()
}

// SetTenantOverride sets a temporary override on a tenant's tenant-scope
// rules.
func (c *Controls) SetTenantOverride(tenant string, o Override) {
	c.mu.Lock()
	c.tenantOv[tenant] = o
	c.mu.Unlock()
}

// DeleteKeyOverride removes a key_id's override.
func (c *Controls) DeleteKeyOverride(keyID string) {
	c.mu.Lock()
	delete(c.keyOv, keyID)
	c.mu.Unlock()
}

// DeleteTenantOverride removes a tenant's override.
func (c *Controls) DeleteTenantOverride(tenant string) {
	c.mu.Lock()
	delete(c.tenantOv, tenant)
	c.mu.Unlock()
}

func (c *Controls) set(m map[string]Entry, k string, e Entry) {
	c.mu.Lock()
	m[k] = e
	c.mu.Unlock()
}

func (c *Controls) del(m map[string]Entry, k string) {
	c.mu.Lock()
	delete(m, k)
	c.mu.Unlock()
}

func live(expiry, now int64) bool { return expiry == 0 || expiry > now }

// status returns the list status of a key_id at time now (µs).
func (c *Controls) status(keyID string, now int64) rules.ListStatus {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if e, ok := c.blocked[keyID]; ok && live(e.Expiry, now) {
		return rules.Blocklisted
	}
	if e, ok := c.allowed[keyID]; ok && live(e.Expiry, now) {
		return rules.Allowlisted
	}
	return rules.Unlisted
}

func (c *Controls) penalty(keyID string, now int64) (Penalty, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	p, ok := c.penalties[keyID]
	return p, ok && p.Until > now
}

// override returns the live override for a rule of the given scope.
func (c *Controls) override(r *rules.Rule, keyID, tenant string, now int64) (rules.Override, bool) {
	var m map[string]Override
	var k string
	switch r.Scope {
	case rules.ScopeKey:
		m, k = c.keyOv, keyID
	case rules.ScopeTenant:
		m, k = c.tenantOv, tenant
	default:
		return rules.Override{}, false
	}
	if k == "" {
		return rules.Override{}, false
	}
	c.mu.RLock()
	o, ok := m[k]
	c.mu.RUnlock()
	if !ok || !live(o.Expiry, now) || (o.Rule != "" && o.Rule != r.ID) {
		return rules.Override{}, false
	}
	return o.Override, true
}
