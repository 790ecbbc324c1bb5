package fleetkv

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/internal/testwait"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// recorder is a Handler that keeps what Follow handed it.
type recorder struct {
	mu      sync.Mutex
	syncs   []*Snapshot
	changes []Change
	flushes int
	// gate, when set, holds the first Change until it is closed.
	gate chan struct{}
}

func (r *recorder) Sync(_ context.Context, s *Snapshot) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.syncs = append(r.syncs, s)
}

func (r *recorder) Change(c Change) {
	if r.gate != nil {
		<-r.gate
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.changes = append(r.changes, c)
}

func (r *recorder) Flush() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.flushes++
}

// counts returns how many changes and flushes the recorder has had.
func (r *recorder) counts() (changes, flushes int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.changes), r.flushes
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

// follow runs kv's Follow into rec until the test ends, checking then that
// it returned nil once its context ended, and returns the first snapshot
// it handed over.
func follow(t *testing.T, kv *KV, rec *recorder) *Snapshot {
	t.Helper()
	fctx, stop := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- kv.c.Follow(fctx, rec, 0) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Follow: %v, want nil once its context ends", err)
		}
	})
	testwait.Eventually(t, 10*time.Second, func() error {
		if snap, _ := rec.last(); snap == nil {
			return fmt.Errorf("no snapshot yet")
		}
		return nil
	})
	snap, _ := rec.last()
	return snap
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

	rec := &recorder{}
	snap := follow(t, kv, rec)
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
	// The two buckets are watched apart: their changes come in either
	// order.
	_, changes := rec.last()
	var override, deletion *Change
	for i := range changes {
		switch c := &changes[i]; c.Bucket {
		case tollgatev1.BucketOverrides:
			override = c
		case tollgatev1.BucketBlocklist:
			deletion = c
		}
	}
	if c := override; c == nil || c.Override == nil || c.Override.Subject != kidB {
		t.Errorf("changes %+v: want kidB's override", changes)
	}
	if c := deletion; c == nil || c.Key != kidA || !c.Deleted {
		t.Errorf("changes %+v: want kidA's deletion", changes)
	}
}

// TestFollowHandsOverABurst: changes that are waiting together are handed
// over together, then Flush once (a handler publishes them with one copy
// of its state); every change still arrives, one Change each.
func TestFollowHandsOverABurst(t *testing.T) {
	t.Parallel()
	kv := openKV(t)
	ctx := t.Context()
	rec := &recorder{gate: make(chan struct{})}
	follow(t, kv, rec)
	// A watcher of the test's own shows when NATS has delivered the burst.
	own, err := kv.Lists.WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = own.Stop() }()
	// The first change holds the handler (gate) while the others arrive.
	const n = 100
	for i := range n + 1 {
		id := fmt.Sprintf("burst%017d", i)
		if _, err := kv.PutList(ctx, id, &tollgatev1.ListEntry{KeyID: id, Action: tollgatev1.ActionBlock}, 0); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for seen := 0; seen < n+1; {
		select {
		case e := <-own.Updates():
			if e != nil {
				seen++
			}
		case <-deadline.C:
			t.Fatalf("NATS delivered %d of %d changes within 10s", seen, n+1)
		}
	}
	close(rec.gate)
	testwait.Eventually(t, 10*time.Second, func() error {
		if changes, _ := rec.counts(); changes != n+1 {
			return fmt.Errorf("%d changes handed over, want %d", changes, n+1)
		}
		return nil
	})
	if _, flushes := rec.counts(); flushes > n/2 {
		t.Errorf("%d changes waiting together were flushed %d times, want them handed over as a few bursts", n+1, flushes)
	}
}
