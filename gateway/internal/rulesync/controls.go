package rulesync

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

// addList puts a blocklist bucket entry's control into c.
func addList(c *guard.ControlSet, e *tollgatev1.ListEntry) {
	switch e.Action {
	case tollgatev1.ActionBlock:
		c.Blocked[e.KeyID] = guard.Entry{Expiry: micros(e.ExpiresAt), Reason: e.Reason, Level: e.Level,
			Close: e.Close && tollgatev1.LadderRung(e.Level).Close}
	case tollgatev1.ActionAllow:
		c.Allowed[e.KeyID] = guard.Entry{Expiry: micros(e.ExpiresAt), Reason: e.Reason}
	case tollgatev1.ActionPenalty:
		c.Penalties[e.KeyID] = guard.Penalty{Level: e.Level, Until: penaltyUntil(e.ExpiresAt), Reason: e.Reason,
			Close: e.Close && tollgatev1.LadderRung(e.Level).Close}
	}
}

// removeList takes a blocklist bucket entry's control out of c.
func removeList(c *guard.ControlSet, e *tollgatev1.ListEntry) {
	switch e.Action {
	case tollgatev1.ActionBlock:
		delete(c.Blocked, e.KeyID)
	case tollgatev1.ActionAllow:
		delete(c.Allowed, e.KeyID)
	case tollgatev1.ActionPenalty:
		delete(c.Penalties, e.KeyID)
	}
}

// override converts an override entry: limit is absolute, factor
// multiplicative (rules.Override.Apply).
func override(e *tollgatev1.OverrideEntry) guard.Override {
	return guard.Override{
		Override: rules.Override{Limit: e.Limit, Factor: e.Factor, Expiry: micros(e.ExpiresAt), Reason: e.Reason},
		Rule:     e.Rule,
		Level:    e.Level,
	}
}

// addOverride puts an override entry into c.
func addOverride(c *guard.ControlSet, e *tollgatev1.OverrideEntry) {
	if e.Scope == tollgatev1.ScopeTenant {
		c.TenantOverrides[e.Subject] = override(e)
	} else {
		c.KeyOverrides[e.Subject] = override(e)
	}
}

// removeOverride takes an override entry out of c.
func removeOverride(c *guard.ControlSet, e *tollgatev1.OverrideEntry) {
	if e.Scope == tollgatev1.ScopeTenant {
		delete(c.TenantOverrides, e.Subject)
	} else {
		delete(c.KeyOverrides, e.Subject)
	}
}

// corruptBlockID returns the key_id a corrupt blocklist bucket entry
// blocks: its KV key, when that is a key_id (block and penalty entries sit
// under their key_id); none for allow.<key_id> (a corrupt allowlisting
// allowlists nothing) or a KV key that names no key_id.
func corruptBlockID(kvKey string) (string, bool) {
	if strings.HasPrefix(kvKey, "allow.") || !keyid.Valid(kvKey) {
		return strings.TrimPrefix(kvKey, "allow."), false
	}
	return kvKey, true
}

// addCorruptList puts a corrupt blocklist bucket entry's control into c:
// a block of its key_id (see the package's notes on corrupt entries).
func addCorruptList(c *guard.ControlSet, kvKey string, rev uint64) {
	if id, ok := corruptBlockID(kvKey); ok {
		c.Blocked[id] = guard.Entry{Reason: fmt.Sprintf("corrupt blocklist entry (revision %d)", rev)}
	}
}

// removeCorruptList takes a corrupt blocklist bucket entry's control out
// of c.
func removeCorruptList(c *guard.ControlSet, kvKey string) {
	if id, ok := corruptBlockID(kvKey); ok {
		delete(c.Blocked, id)
	}
}

// buildControls is the whole ControlSet of the buckets' entries.
func buildControls(st state) *guard.ControlSet {
	c := &guard.ControlSet{
		Blocked:         map[string]guard.Entry{},
		Allowed:         map[string]guard.Entry{},
		Penalties:       map[string]guard.Penalty{},
		KeyOverrides:    map[string]guard.Override{},
		TenantOverrides: map[string]guard.Override{},
	}
	for _, e := range st.lists {
		addList(c, e)
	}
	for k, rev := range st.corruptLists {
		addCorruptList(c, k, rev)
	}
	for _, e := range st.overrides {
		addOverride(c, e)
	}
	return c
}
