package rulesync

import (
	"fmt"
	"math"
	"time"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// closeLevel is the penalty ladder's first level whose entries may ask
// for the connection-level answer (Connection: close): the top of the
// ladder. A lower level's close flag is ignored.
const closeLevel = 3

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

// checkListKey checks that a blocklist bucket entry sits under the KV key
// its content names: key_id for block and penalty, allow.<key_id> for
// allow. Every KV key then holds one kind of control of one key_id, so a
// change of one never touches another's.
func checkListKey(kvKey string, e *tollgatev1.ListEntry) error {
	want := tollgatev1.BlocklistKey(e.KeyID)
	if e.Action == tollgatev1.ActionAllow {
		want = tollgatev1.AllowlistKey(e.KeyID)
	}
	if kvKey != want {
		return fmt.Errorf("a %s entry for key_id %s belongs under KV key %q", e.Action, e.KeyID, want)
	}
	return nil
}

// checkOverrideKey checks that an override sits under the KV key its
// scope and subject name.
func checkOverrideKey(kvKey string, e *tollgatev1.OverrideEntry) error {
	if want := tollgatev1.OverrideKey(e.Scope, e.Subject); kvKey != want {
		return fmt.Errorf("a %s override belongs under KV key %q", e.Scope, want)
	}
	return nil
}

// addList puts a blocklist bucket entry's control into c.
func addList(c *guard.ControlSet, e *tollgatev1.ListEntry) {
	switch e.Action {
	case tollgatev1.ActionBlock:
		c.Blocked[e.KeyID] = guard.Entry{Expiry: micros(e.ExpiresAt), Reason: e.Reason, Level: e.Level,
			Close: e.Close && e.Level >= closeLevel}
	case tollgatev1.ActionAllow:
		c.Allowed[e.KeyID] = guard.Entry{Expiry: micros(e.ExpiresAt), Reason: e.Reason}
	case tollgatev1.ActionPenalty:
		c.Penalties[e.KeyID] = guard.Penalty{Level: e.Level, Until: penaltyUntil(e.ExpiresAt), Reason: e.Reason,
			Close: e.Close && e.Level >= closeLevel}
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

// buildControls is the whole ControlSet of the buckets' entries.
func buildControls(lists map[string]*tollgatev1.ListEntry, overrides map[string]*tollgatev1.OverrideEntry) *guard.ControlSet {
	c := &guard.ControlSet{
		Blocked:         map[string]guard.Entry{},
		Allowed:         map[string]guard.Entry{},
		Penalties:       map[string]guard.Penalty{},
		KeyOverrides:    map[string]guard.Override{},
		TenantOverrides: map[string]guard.Override{},
	}
	for _, e := range lists {
		addList(c, e)
	}
	for _, e := range overrides {
		addOverride(c, e)
	}
	return c
}
