package outbox

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tollgate/tollgate/aggregator/internal/abuse"
	"github.com/tollgate/tollgate/aggregator/internal/state"
	"github.com/tollgate/tollgate/compose/natsserver/natstest"
	"github.com/tollgate/tollgate/internal/fleetkv"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// fakeStates is the committed state the stale check reads.
type fakeStates map[string][]state.PenaltyState

func (f fakeStates) Penalties(id string) ([]state.PenaltyState, error) { return f[id], nil }

func openKV(t *testing.T) *fleetkv.KV {
	t.Helper()
	ns := natstest.StartTB(t)
	nc, err := fleetkv.Connect(ns.ClientURL(), fleetkv.Options{Name: "outbox-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	kv, err := fleetkv.Open(context.Background(), nc)
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

func TestApply(t *testing.T) {
	kv := openKV(t)
	now := time.Now()
	states := fakeStates{}
	r := New(Config{KV: func() *fleetkv.KV { return kv }, States: states, Now: func() time.Time { return now }}, nil)
	ctx := context.Background()
	const id = "kid_abcdefghijklmnopqrst"
	step := func(level int, step uint64, expires time.Duration) *tollgatev1.PenaltyEvent {
		ev := &tollgatev1.PenaltyEvent{KeyId: id, KeyPrefix: "sk_…", Tenant: "acme", Level: int32(level), Step: step,
			Action: abuse.LevelAction(level), StartsAtUnixMicros: now.UnixMicro(), IssuedBy: "backoff_ignored", Reason: "test"}
		if level > 0 {
			ev.ExpiresAtUnixMicros = now.Add(expires).UnixMicro()
		}
		if level == 1 {
			ev.Factor = 0.5
		}
		return ev
	}
	apply := func(ev *tollgatev1.PenaltyEvent, want string) {
		t.Helper()
		got, err := r.Apply(ctx, ev)
		if err != nil || got != want {
			t.Fatalf("Apply(level %d step %d) = %q %v, want %q", ev.Level, ev.Step, got, err, want)
		}
	}
	entries := func() (*tollgatev1.ListEntry, *tollgatev1.OverrideEntry) {
		t.Helper()
		l, _, err := kv.List(ctx, tollgatev1.BlocklistKey(id))
		if err != nil {
			t.Fatal(err)
		}
		o, _, err := kv.Override(ctx, tollgatev1.OverrideKey(tollgatev1.ScopeKey, id))
		if err != nil {
			t.Fatal(err)
		}
		return l, o
	}

	apply(step(1, 1, 5*time.Minute), ResultApplied)
	l, o := entries()
	if l != nil || o == nil || o.Factor != 0.5 || o.Level != 1 || o.Step != 1 || !o.ExpiresAt.Equal(now.Add(5*time.Minute).Truncate(time.Microsecond)) {
		t.Fatalf("level 1: list %+v override %+v", l, o)
	}
	apply(step(1, 1, 5*time.Minute), ResultUnchanged) // a replay

	apply(step(2, 2, 15*time.Minute), ResultApplied)
	l, o = entries()
	if o != nil || l == nil || l.Action != tollgatev1.ActionPenalty || l.Level != 2 || l.Close {
		t.Fatalf("level 2: list %+v override %+v", l, o)
	}
	apply(step(1, 1, 5*time.Minute), ResultStale) // a late replay of step 1
	if l, o = entries(); o != nil || l.Level != 2 {
		t.Fatalf("a stale event changed KV: %+v %+v", l, o)
	}

	apply(step(3, 3, 24*time.Hour), ResultApplied)
	if l, _ = entries(); l.Action != tollgatev1.ActionBlock || !l.Close || l.Level != 3 || l.Step != 3 {
		t.Fatalf("level 3: %+v", l)
	}
	// A step down whose enforcement already ran out writes nothing.
	down := step(2, 4, 0)
	down.ExpiresAtUnixMicros = now.Add(-time.Minute).UnixMicro()
	apply(down, ResultApplied)
	if l, o = entries(); l != nil || o != nil {
		t.Fatalf("an expired level left entries: %+v %+v", l, o)
	}
	// Its state committed at step 4, a replay of step 3 (KV holds nothing
	// to compare with) is refused by the committed state.
	states[id] = []state.PenaltyState{{Partition: 1, State: abuse.State{Tenant: "acme", Level: 2, Step: 4}}}
	apply(step(3, 3, 24*time.Hour), ResultStale)
	if l, _ = entries(); l != nil {
		t.Fatalf("a replay after the step down re-blocked the key: %+v", l)
	}
	delete(states, id)

	// An operator's block is never replaced nor deleted.
	if _, err := kv.PutList(ctx, tollgatev1.BlocklistKey(id), &tollgatev1.ListEntry{KeyID: id, Action: tollgatev1.ActionBlock, Actor: "alice"}, 0); err != nil {
		t.Fatal(err)
	}
	apply(step(2, 5, 15*time.Minute), ResultOperator)
	apply(step(0, 6, 0), ResultUnchanged)
	if l, _ = entries(); l == nil || l.Actor != "alice" || l.Level != 0 {
		t.Fatalf("the operator's entry changed: %+v", l)
	}
	_ = fleetkv.Delete(ctx, kv.Lists, tollgatev1.BlocklistKey(id), 0)

	// An allowlisted key gets no penalty.
	if _, err := kv.PutList(ctx, tollgatev1.AllowlistKey(id), &tollgatev1.ListEntry{KeyID: id, Action: tollgatev1.ActionAllow}, 0); err != nil {
		t.Fatal(err)
	}
	apply(step(2, 7, 15*time.Minute), ResultAllowlisted)
	if l, o = entries(); l != nil || o != nil {
		t.Fatalf("an allowlisted key was penalised: %+v %+v", l, o)
	}
}

func TestApplyWaitsForNATS(t *testing.T) {
	r := New(Config{KV: func() *fleetkv.KV { return nil }}, nil)
	if _, err := r.Apply(context.Background(), &tollgatev1.PenaltyEvent{KeyId: "k", Level: 1}); !errors.Is(err, errNoKV) {
		t.Fatalf("without NATS: %v, want errNoKV", err)
	}
}
