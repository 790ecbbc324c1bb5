package rulesync

import (
	"fmt"
	"testing"
	"time"

	"github.com/tollgate/tollgate/gateway/internal/rulefile"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/internal/fleetkv"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// TestChangeDefersTheCopyToTheTick: a change is put in force without
// encoding the last-known-good copy on its own path, even when the save
// interval is long over; the copy goes to the saver at the watch loop's
// next tick. (Every gateway of a fleet gets a change at the same instant:
// encoding and writing 200 copies then delayed the next change.) A whole
// read of the buckets is still handed over at once.
func TestChangeDefersTheCopyToTheTick(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		do   func(s *Syncer)
		// handed: the copy is with the saver right after do.
		handed bool
	}{
		{"blocklist entry", func(s *Syncer) {
			s.change(fleetkv.Change{Bucket: tollgatev1.BucketBlocklist, Key: "kidA", Revision: 2,
				List: &tollgatev1.ListEntry{KeyID: "kidA", Action: tollgatev1.ActionBlock}})
			s.flush()
		}, false},
		{"ruleset", func(s *Syncer) {
			s.change(fleetkv.Change{Bucket: tollgatev1.BucketRules, Key: tollgatev1.RulesKey, Revision: 2,
				Rules: &tollgatev1.RulesEntry{Version: 2, Source: "rules:\n  - id: demo\n    match: {api_key: \"sk_*\"}\n    algorithm: token_bucket\n    capacity: 5\n    rate: 5/1h\n"}})
		}, false},
		{"override", func(s *Syncer) {
			s.change(fleetkv.Change{Bucket: tollgatev1.BucketOverrides, Key: "key.kidA", Revision: 2, Deleted: true})
			s.flush()
		}, false},
		{"resync", func(s *Syncer) { s.resync(t.Context(), &fleetkv.Snapshot{Entries: fleetkv.NewEntries()}) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			controls := guard.NewControls()
			s, err := New(Config{URL: "nats://127.0.0.1:1", Dir: t.TempDir(), Controls: controls,
				Apply: func(*rulefile.Ruleset) {}, SaveInterval: time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			s.synced = make(chan struct{}) // resync closes it
			gen, applied := controls.Generation(), s.applied
			tc.do(s)
			if controls.Generation() == gen && s.applied == applied {
				t.Fatal("the change is not in force")
			}
			if got := len(s.toSave) == 1; got != tc.handed {
				t.Fatalf("copy handed to the saver on the change's path: %v, want %v", got, tc.handed)
			}
			if !tc.handed {
				s.saveDue(time.Now().Add(time.Second))
				if len(s.toSave) != 1 {
					t.Fatal("the tick after the interval did not hand the copy to the saver")
				}
			}
		})
	}
}

// TestBurstPublishesOnce: the controls' changes of a burst (what the
// watchers held together) are published with one Controls.Edit — one
// generation — however many entries it holds.
func TestBurstPublishesOnce(t *testing.T) {
	t.Parallel()
	controls := guard.NewControls()
	s, err := New(Config{URL: "nats://127.0.0.1:1", Dir: t.TempDir(), Controls: controls, Apply: func(*rulefile.Ruleset) {}})
	if err != nil {
		t.Fatal(err)
	}
	gen := controls.Generation()
	const n = 100
	for i := range n {
		id := fmt.Sprintf("burst%017d", i)
		s.change(fleetkv.Change{Bucket: tollgatev1.BucketBlocklist, Key: id, Revision: uint64(i + 1),
			List: &tollgatev1.ListEntry{KeyID: id, Action: tollgatev1.ActionBlock}})
	}
	s.change(fleetkv.Change{Bucket: tollgatev1.BucketOverrides, Key: "key.burst", Revision: n + 1, Deleted: true})
	s.flush()
	if got := controls.Generation() - gen; got != 1 {
		t.Errorf("a burst of %d changes published %d times, want once", n+1, got)
	}
	if got := len(controls.Snapshot().Blocked); got != n {
		t.Errorf("%d keys blocked after the burst, want %d", got, n)
	}
	s.flush()
	if got := controls.Generation() - gen; got != 1 {
		t.Errorf("a flush without changes published: %d generations", got)
	}
}

// TestCopyWaitsForChangesToPause: while changes keep arriving (here one
// every half interval) the copy is held back until they pause for an
// interval, or until they have kept coming for maxSaveDelay intervals;
// then the newest state goes to the saver once.
func TestCopyWaitsForChangesToPause(t *testing.T) {
	t.Parallel()
	const interval = time.Second
	for _, tc := range []struct {
		name string
		// changes: how long the stream of changes lasts.
		changes time.Duration
		// handedAt: when (after the first change) the copy goes to the
		// saver, at a tick every 100ms.
		handedAt time.Duration
	}{
		{"one change", 0, interval},
		{"three seconds of changes", 3 * time.Second, 3*time.Second + interval},
		{"changes that keep coming", time.Hour, maxSaveDelay * interval},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := New(Config{URL: "nats://127.0.0.1:1", Dir: t.TempDir(), Controls: guard.NewControls(),
				Apply: func(*rulefile.Ruleset) {}, SaveInterval: interval})
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			s.changed()
			for at := 100 * time.Millisecond; at <= 2*maxSaveDelay*interval; at += 100 * time.Millisecond {
				if at <= tc.changes && at%(interval/2) == 0 {
					s.changed()
					s.lastApplied.Store(start.Add(at).UnixNano())
				}
				s.saveDue(start.Add(at))
				if len(s.toSave) == 1 {
					if at < tc.handedAt || at > tc.handedAt+200*time.Millisecond {
						t.Fatalf("copy handed to the saver %v after the first change, want %v", at, tc.handedAt)
					}
					return
				}
			}
			t.Fatal("the copy was never handed to the saver")
		})
	}
}
