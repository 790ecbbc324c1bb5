package aggregator

import (
	"context"
	"time"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/internal/fleetkv"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// keyControlsTick is how often the mirror sweeps expired overrides and
// penalties.
const keyControlsTick = time.Second

// keyControls mirrors the fleet's overrides and penalties (the overrides
// bucket, and the penalty entries of the blocklist bucket) into the
// guard.Controls of the operator API's key guard, so that keys/{key}
// reads a key at the limit the gateways enforce for it: an override's
// limit, a penalty ladder's reduced limit. Blocklist and allowlist entries
// are left out: the lists routes show them, and a reset or quota grant
// acts on a blocked key's counters as on any other. It is a
// fleetkv.Handler, run by Follow on the control plane's goroutine.
type keyControls struct {
	c     *guard.Controls
	es    fleetkv.Entries
	dirty bool // changes since the last publication
}

func newKeyControls() *keyControls {
	return &keyControls{c: guard.NewControls(), es: fleetkv.NewEntries()}
}

// Sync implements fleetkv.Handler.
func (k *keyControls) Sync(_ context.Context, s *fleetkv.Snapshot) {
	k.es = s.Entries
	k.c.Replace(keyOnly(k.es.ControlSet()))
}

// Change implements fleetkv.Handler.
func (k *keyControls) Change(c fleetkv.Change) {
	if c.Bucket == tollgatev1.BucketRules {
		return // the key guard follows the rules bucket itself
	}
	k.es.Apply(c) // recorded in the entries; Flush publishes them
	k.dirty = true
}

// Flush implements fleetkv.Handler: a burst of changes is one
// publication of the whole set.
func (k *keyControls) Flush() {
	if k.dirty {
		k.dirty = false
		k.c.Replace(keyOnly(k.es.ControlSet()))
	}
}

// Tick implements fleetkv.Handler.
func (k *keyControls) Tick(now time.Time) { k.c.Sweep(now.UnixMicro()) }

// keyOnly empties the blocklist and allowlist of cs.
func keyOnly(cs *guard.ControlSet) *guard.ControlSet {
	clear(cs.Blocked)
	clear(cs.Allowed)
	return cs
}
