package fleetkv

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testwait"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// recorder is a Handler that keeps what Follow handed it.
type recorder struct {
	mu      sync.Mutex
	syncs   []*Snapshot
	changes []Change
}

func (r *recorder) Sync(_ context.Context, s *Snapshot) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.syncs = append(r.syncs, s)
}

func (r *recorder) Change(c Change) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.changes = append(r.changes, c)
}

func (r *recorder) Tick(time.Time) {}

// last returns the last snapshot and the changes since the first one.
func (r *recorder) last() (*Snapshot, []Change) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.syncs) == 0 {
		return nil, nil
	}
	return r.syncs[len(r.syncs)-1], append([]Change(nil), r.changes...)
}

// TestFollow: a session hands over the buckets' whole content first, a
// corrupt entry named as such, then each change, decoded the same way;
// Follow returns nil when its context ends.
func TestFollow(t *testing.T) {
	t.Parallel()
	kv := openKV(t)
	ctx := t.Context()
	const corruptID = "followfollowfollowfoll"
	if _, err := kv.PutList(ctx, kidA, &tollgatev1.ListEntry{KeyID: kidA, Action: tollgatev1.ActionBlock, Reason: "before"}, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Lists.Put(ctx, corruptID, []byte("{not json")); err != nil {
		t.Fatal(err)
	}

	fctx, stop := context.WithCancel(ctx)
	rec := &recorder{}
	done := make(chan error, 1)
	go func() { done <- kv.c.Follow(fctx, rec, 0) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Follow: %v, want nil once its context ends", err)
		}
	}()

	testwait.Eventually(t, 10*time.Second, func() error {
		if snap, _ := rec.last(); snap == nil {
			return fmt.Errorf("no snapshot yet")
		}
		return nil
	})
	snap, _ := rec.last()
	if snap.Rules != nil || snap.Entries.Lists[kidA] == nil || snap.Entries.Lists[kidA].Reason != "before" ||
		snap.Entries.CorruptLists[corruptID] == nil || len(snap.Entries.Lists) != 1 {
		t.Fatalf("snapshot: rules %v, lists %v, corrupt %v; want kidA's block and the corrupt entry", snap.Rules, snap.Entries.Lists, snap.Entries.CorruptLists)
	}

	if _, err := kv.PutOverride(ctx, tollgatev1.OverrideKey(tollgatev1.ScopeKey, kidB),
		&tollgatev1.OverrideEntry{Scope: tollgatev1.ScopeKey, Subject: kidB, Factor: 0.5}, 0); err != nil {
		t.Fatal(err)
	}
	if err := Delete(ctx, kv.Lists, kidA, 0); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 10*time.Second, func() error {
		if _, changes := rec.last(); len(changes) < 2 {
			return fmt.Errorf("%d changes, want 2", len(changes))
		}
		return nil
	})
	_, changes := rec.last()
	if c := changes[0]; c.Bucket != tollgatev1.BucketOverrides || c.Override == nil || c.Override.Subject != kidB {
		t.Errorf("first change: %+v, want kidB's override", c)
	}
	if c := changes[1]; c.Bucket != tollgatev1.BucketBlocklist || c.Key != kidA || !c.Deleted {
		t.Errorf("second change: %+v, want kidA's deletion", c)
	}
}
