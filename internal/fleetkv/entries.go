package fleetkv

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/keyid"
	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// Entries are the blocklist and overrides buckets' entries by KV key, as a
// gateway holds them: each one decoded, or corrupt. ControlSet says what
// they mean to guard.Controls:
//
//   - a blocklist entry maps by its action: block → Blocked (403
//     KEY_BLOCKED), penalty → Penalties (429 PENALTY, until its expiry or
//     until lifted), allow → Allowed. The penalty ladder's level travels
//     with it, and its close flag is obeyed only at a level that calls
//     for it (tollgatev1.LadderRung);
//   - an override maps to KeyOverrides (key.<key_id>) or TenantOverrides
//     (tenant.<base64url>): limit is absolute, factor multiplicative
//     (rules.Override);
//   - a corrupt blocklist entry under a key_id's KV key blocks that key_id
//     until it is replaced or deleted: the entries there are blocks and
//     penalties, so the one that is unreadable most likely restricted the
//     key, and failing closed for that one key is visible and bounded,
//     where failing open would let a revoked or abusive key back in. A
//     corrupt allow.<key_id> entry allowlists nothing; a KV key that is no
//     key_id matches no request (CorruptBlock);
//   - a corrupt override is no override: the rules' own limits apply.
//
// This follows from the buckets' content alone, never from what a gateway
// held before, so that every gateway — one that ran through a change, one
// that restarts from a copy on disk, a new one — enforces the same.
type Entries struct {
	Lists            map[string]*tollgatev1.ListEntry
	Overrides        map[string]*tollgatev1.OverrideEntry
	CorruptLists     map[string]*CorruptError
	CorruptOverrides map[string]*CorruptError
}

// NewEntries returns empty Entries.
func NewEntries() Entries {
	return Entries{Lists: map[string]*tollgatev1.ListEntry{}, Overrides: map[string]*tollgatev1.OverrideEntry{},
		CorruptLists: map[string]*CorruptError{}, CorruptOverrides: map[string]*CorruptError{}}
}

// Apply records a change of the blocklist or overrides bucket (a change
// of another bucket changes nothing) and returns the edit that brings
// controls of the entries before it up to date (for guard.Controls.Edit,
// which does not copy the lists, or a guard.ControlSet).
func (es *Entries) Apply(c Change) func(guard.ControlWriter) {
	switch c.Bucket {
	case tollgatev1.BucketBlocklist:
		old, oldCorrupt := replace(es.Lists, es.CorruptLists, c.Key, c.List, c.Corrupt)
		return func(cs guard.ControlWriter) {
			if old != nil {
				removeList(cs, old)
			}
			if oldCorrupt {
				removeCorruptList(cs, c.Key)
			}
			if c.List != nil {
				addList(cs, c.List)
			}
			if c.Corrupt != nil {
				addCorruptList(cs, c.Corrupt)
			}
		}
	case tollgatev1.BucketOverrides:
		old, _ := replace(es.Overrides, es.CorruptOverrides, c.Key, c.Override, c.Corrupt)
		return func(cs guard.ControlWriter) {
			if old != nil {
				removeOverride(cs, old)
			}
			if c.Override != nil {
				addOverride(cs, c.Override)
			}
		}
	}
	return func(guard.ControlWriter) {}
}

// replace puts a bucket's entry under key — decoded (v), corrupt (ce) or
// neither (deleted) — in place of the one before, which it returns.
func replace[V any](vals map[string]*V, corrupt map[string]*CorruptError, key string, v *V, ce *CorruptError) (old *V, oldCorrupt bool) {
	old, oldCorrupt = vals[key], corrupt[key] != nil
	delete(vals, key)
	delete(corrupt, key)
	if v != nil {
		vals[key] = v
	}
	if ce != nil {
		corrupt[key] = ce
	}
	return old, oldCorrupt
}

// ControlSet is the whole guard.ControlSet of the entries.
func (es *Entries) ControlSet() *guard.ControlSet {
	cs := &guard.ControlSet{
		Blocked:         map[string]guard.Entry{},
		Allowed:         map[string]guard.Entry{},
		Penalties:       map[string]guard.Penalty{},
		KeyOverrides:    map[string]guard.Override{},
		TenantOverrides: map[string]guard.Override{},
	}
	for _, e := range es.Lists {
		addList(cs, e)
	}
	for _, ce := range es.CorruptLists {
		addCorruptList(cs, ce)
	}
	for _, e := range es.Overrides {
		addOverride(cs, e)
	}
	return cs
}

// micros converts an expiry to Unix microseconds; a zero time (never) is
// 0, as guard.Entry and rules.Override read it.
func micros(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMicro()
}

// penaltyUntil is a penalty's guard.Penalty.Until: its expiry, or forever
// (until it is lifted) when it has none.
func penaltyUntil(t time.Time) int64 {
	if t.IsZero() {
		return math.MaxInt64
	}
	return t.UnixMicro()
}

// addList puts a blocklist bucket entry's control into cs.
func addList(cs guard.ControlWriter, e *tollgatev1.ListEntry) {
	closes := e.Close && tollgatev1.LadderRung(e.Level).Close
	switch e.Action {
	case tollgatev1.ActionBlock:
		cs.Block(e.KeyID, guard.Entry{Expiry: micros(e.ExpiresAt), Reason: e.Reason, Level: e.Level, Close: closes})
	case tollgatev1.ActionAllow:
		cs.Allow(e.KeyID, guard.Entry{Expiry: micros(e.ExpiresAt), Reason: e.Reason})
	case tollgatev1.ActionPenalty:
		cs.SetPenalty(e.KeyID, guard.Penalty{Level: e.Level, Until: penaltyUntil(e.ExpiresAt), Reason: e.Reason, Close: closes})
	}
}

// removeList takes a blocklist bucket entry's control out of cs.
func removeList(cs guard.ControlWriter, e *tollgatev1.ListEntry) {
	switch e.Action {
	case tollgatev1.ActionBlock:
		cs.Unblock(e.KeyID)
	case tollgatev1.ActionAllow:
		cs.Disallow(e.KeyID)
	case tollgatev1.ActionPenalty:
		cs.LiftPenalty(e.KeyID)
	}
}

// addOverride puts an override entry into cs.
func addOverride(cs guard.ControlWriter, e *tollgatev1.OverrideEntry) {
	o := guard.Override{
		Override: rules.Override{Limit: e.Limit, Factor: e.Factor, Expiry: micros(e.ExpiresAt), Reason: e.Reason},
		Rule:     e.Rule,
		Level:    e.Level,
	}
	if e.Scope == tollgatev1.ScopeTenant {
		cs.SetTenantOverride(e.Subject, o)
	} else {
		cs.SetKeyOverride(e.Subject, o)
	}
}

// removeOverride takes an override entry out of cs.
func removeOverride(cs guard.ControlWriter, e *tollgatev1.OverrideEntry) {
	if e.Scope == tollgatev1.ScopeTenant {
		cs.DeleteTenantOverride(e.Subject)
	} else {
		cs.DeleteKeyOverride(e.Subject)
	}
}

// CorruptBlock returns the key_id a corrupt blocklist entry under kvKey
// blocks: kvKey itself, when it is a key_id (block and penalty entries sit
// under their key_id). It blocks none (ok false) for allow.<key_id>, a
// corrupt allowlisting, which allowlists nothing, or for a KV key that
// names no key_id; keyID is then kvKey without its "allow." prefix.
func CorruptBlock(kvKey string) (keyID string, ok bool) {
	if id, allow := strings.CutPrefix(kvKey, "allow."); allow || !keyid.Valid(kvKey) {
		return id, false
	}
	return kvKey, true
}

// addCorruptList puts a corrupt blocklist bucket entry's control into cs.
func addCorruptList(cs guard.ControlWriter, ce *CorruptError) {
	if id, ok := CorruptBlock(ce.Key); ok {
		cs.Block(id, guard.Entry{Reason: fmt.Sprintf("corrupt blocklist entry (revision %d)", ce.Revision)})
	}
}

// removeCorruptList takes a corrupt blocklist bucket entry's control out
// of cs.
func removeCorruptList(cs guard.ControlWriter, kvKey string) {
	if id, ok := CorruptBlock(kvKey); ok {
		cs.Unblock(id)
	}
}
