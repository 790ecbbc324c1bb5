package guard_test

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/memstore"
	"github.com/tollgate/tollgate/guard/rules"
)

func TestControlsGeneration(t *testing.T) {
	t.Parallel()
	c := guard.NewControls()
	if g := c.Generation(); g != 0 {
		t.Fatalf("new controls at generation %d, want 0", g)
	}
	ov := guard.Override{Override: rules.Override{Factor: 2}}
	steps := []struct {
		name string
		fn   func()
	}{
		{"Block", func() { c.Block("k1", guard.Entry{}) }},
		{"Unblock", func() { c.Unblock("k1") }},
		{"Allow", func() { c.Allow("k2", guard.Entry{}) }},
		{"Disallow", func() { c.Disallow("k2") }},
		{"SetPenalty", func() { c.SetPenalty("k3", guard.Penalty{Level: 2, Until: math.MaxInt64}) }},
		{"LiftPenalty", func() { c.LiftPenalty("k3") }},
		{"SetKeyOverride", func() { c.SetKeyOverride("k4", ov) }},
		{"DeleteKeyOverride", func() { c.DeleteKeyOverride("k4") }},
		{"SetTenantOverride", func() { c.SetTenantOverride("acme", ov) }},
		{"DeleteTenantOverride", func() { c.DeleteTenantOverride("acme") }},
		{"Update", func() { c.Update(func(n *guard.ControlSet) { n.Blocked["k5"] = guard.Entry{Expiry: 10} }) }},
		{"Sweep dropping an entry", func() {
			if n := c.Sweep(20); n != 1 {
				t.Errorf("Sweep dropped %d, want 1", n)
			}
		}},
		{"Replace", func() { c.Replace(&guard.ControlSet{Blocked: map[string]guard.Entry{"k6": {}}}) }},
		{"Replace(nil)", func() { c.Replace(nil) }},
	}
	for i, s := range steps {
		before := c.Snapshot()
		s.fn()
		if g := c.Generation(); g != uint64(i+1) {
			t.Fatalf("after %s: generation %d, want %d", s.name, g, i+1)
		}
		if g := c.Snapshot().Generation(); g != c.Generation() {
			t.Fatalf("after %s: snapshot generation %d, controls %d", s.name, g, c.Generation())
		}
		if before.Generation() != uint64(i) {
			t.Fatalf("the snapshot taken before %s changed its generation to %d", s.name, before.Generation())
		}
	}
	if c.Snapshot().Len() != 0 {
		t.Fatalf("after Replace(nil): %d entries", c.Snapshot().Len())
	}
	g := c.Generation()
	if n := c.Sweep(1 << 60); n != 0 || c.Generation() != g {
		t.Fatalf("a sweep of empty controls dropped %d and moved the generation %d -> %d", n, g, c.Generation())
	}
}

func TestControlsSnapshotsNeverChange(t *testing.T) {
	t.Parallel()
	c := guard.NewControls()
	c.Block("a", guard.Entry{Reason: "first"})
	snap := c.Snapshot()
	c.Block("b", guard.Entry{})
	c.Block("a", guard.Entry{Reason: "second"})
	c.Update(func(n *guard.ControlSet) { delete(n.Blocked, "b"); n.Allowed["c"] = guard.Entry{} })
	c.Unblock("a")
	if len(snap.Blocked) != 1 || snap.Blocked["a"].Reason != "first" || len(snap.Allowed) != 0 {
		t.Fatalf("an earlier snapshot changed: %+v", snap)
	}
	cur := c.Snapshot()
	if len(cur.Blocked) != 0 || len(cur.Allowed) != 1 {
		t.Fatalf("current %+v, want only c allowed", cur)
	}
}

func TestControlsSweep(t *testing.T) {
	t.Parallel()
	const now = 1_000_000
	c := guard.NewControls()
	ov := func(exp int64) guard.Override { return guard.Override{Override: rules.Override{Limit: 5, Expiry: exp}} }
	c.Replace(&guard.ControlSet{
		Blocked:         map[string]guard.Entry{"forever": {}, "gone": {Expiry: now}, "later": {Expiry: now + 1}},
		Allowed:         map[string]guard.Entry{"gone": {Expiry: 1}},
		Penalties:       map[string]guard.Penalty{"gone": {Until: now}, "zero": {}, "later": {Until: now + 1}, "lifted-by-hand": {Until: math.MaxInt64}},
		KeyOverrides:    map[string]guard.Override{"gone": ov(now - 1), "forever": ov(0)},
		TenantOverrides: map[string]guard.Override{"gone": ov(now)},
	})
	untouched := c.Snapshot()
	if n := c.Sweep(now); n != 6 {
		t.Fatalf("Sweep dropped %d, want 6", n)
	}
	s := c.Snapshot()
	for _, tc := range []struct {
		kind string
		got  int
		want int
	}{{"blocked", len(s.Blocked), 2}, {"allowed", len(s.Allowed), 0}, {"penalties", len(s.Penalties), 2},
		{"key overrides", len(s.KeyOverrides), 1}, {"tenant overrides", len(s.TenantOverrides), 0}} {
		if tc.got != tc.want {
			t.Errorf("%s: %d left, want %d", tc.kind, tc.got, tc.want)
		}
	}
	if untouched.Len() != 11 {
		t.Errorf("the swept snapshot changed: %d entries", untouched.Len())
	}
}

// TestControlsChangeIsAtomic moves a key between a penalty and the
// blocklist in one Update while checks run: every check sees one state or
// the other, never the key free of both.
func TestControlsChangeIsAtomic(t *testing.T) {
	t.Parallel()
	g := mustGuard(t, memstore.New(), mustRules(t, "rules:\n  - id: r\n    limit: 1000000\n    window: 1h\n    algorithm: fixed_window\n"))
	c := g.Controls()
	id := g.KeyID("sk_flip")
	c.SetPenalty(id, guard.Penalty{Level: 2, Until: math.MaxInt64})
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; !stop.Load(); i++ {
			c.Update(func(n *guard.ControlSet) {
				if i%2 == 0 {
					delete(n.Penalties, id)
					n.Blocked[id] = guard.Entry{}
				} else {
					delete(n.Blocked, id)
					n.Penalties[id] = guard.Penalty{Level: 2, Until: math.MaxInt64}
				}
			})
		}
	})
	defer wg.Wait()
	defer stop.Store(true)
	ctx := context.Background()
	var d guard.Decision
	for range 20_000 {
		if err := g.CheckInto(ctx, &guard.Request{Key: "sk_flip", Path: "/"}, &d); err != nil {
			t.Fatal(err)
		}
		if d.Status != 403 && d.Status != 429 {
			t.Fatalf("status %d (%s) while the key moved between a penalty and the blocklist", d.Status, d.Reason)
		}
	}
}
