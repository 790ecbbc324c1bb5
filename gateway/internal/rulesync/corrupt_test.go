package rulesync_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/internal/testwait"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// Key_ids (22 base64url characters) of the corrupt-entry tests.
const (
	kidBlocked  = "blockedblockedblocked0"
	kidAllowed  = "allowedallowedallowed0"
	kidOverride = "overrideoverrideoverri"
)

// startGateway starts a syncer on dir as a gateway does: its
// last-known-good copy first, then NATS.
func startGateway(t *testing.T, url, dir string) *syncer {
	t.Helper()
	sy := newSyncer(t, url, dir)
	if _, err := sy.s.LoadLKG(); err != nil {
		t.Fatal(err)
	}
	sy.start(t)
	select {
	case <-sy.s.Synced():
	case <-time.After(10 * time.Second):
		t.Fatal("not synced within 10s")
	}
	return sy
}

// controlsView is what the corrupt-entry tests compare across gateways.
func controlsView(c *guard.ControlSet) string {
	return fmt.Sprintf("blocked %v allowed %v key overrides %v", slices.Sorted(maps.Keys(c.Blocked)),
		slices.Sorted(maps.Keys(c.Allowed)), slices.Sorted(maps.Keys(c.KeyOverrides)))
}

// TestCorruptEntriesNeverSplitTheFleet: a corrupt blocklist entry blocks
// its key_id on every gateway — one that ran through the corruption, one
// that restarts from its last-known-good copy, a new one — and a corrupt
// allowlisting or override applies nowhere; each is counted; deleting the
// entry lifts it everywhere. (Before, a restarted gateway dropped the
// block while the others kept it.)
func TestCorruptEntriesNeverSplitTheFleet(t *testing.T) {
	t.Parallel()
	ns, b := bucketsV1(t)
	url := ns.ClientURL()
	b.put(b.lists, kidBlocked, &tollgatev1.ListEntry{KeyID: kidBlocked, Action: tollgatev1.ActionBlock, Reason: "revoked"})
	b.put(b.lists, tollgatev1.AllowlistKey(kidAllowed), &tollgatev1.ListEntry{KeyID: kidAllowed, Action: tollgatev1.ActionAllow})
	b.put(b.overrides, tollgatev1.OverrideKey(tollgatev1.ScopeKey, kidOverride),
		&tollgatev1.OverrideEntry{Scope: tollgatev1.ScopeKey, Subject: kidOverride, Limit: 500})

	running, restartDir := startGateway(t, url, t.TempDir()), t.TempDir()
	restarting := startGateway(t, url, restartDir)
	before := controlsView(restarting.controls.Snapshot())
	if before != "blocked ["+kidBlocked+"] allowed ["+kidAllowed+"] key overrides ["+kidOverride+"]" {
		t.Fatalf("before the corruption: %s", before)
	}
	restarting.stop(t) // its copy holds the good entries

	b.put(b.lists, kidBlocked, []byte(`{"key_id":"blockedblockedblocked0","action":"blo`))
	b.put(b.lists, tollgatev1.AllowlistKey(kidAllowed), []byte("\x00\x01garbage"))
	b.put(b.overrides, tollgatev1.OverrideKey(tollgatev1.ScopeKey, kidOverride), []byte(`{"scope":"key"}`))
	b.put(b.lists, "notakeyid", []byte("garbage")) // names no key_id: matches nothing

	want := "blocked [" + kidBlocked + "] allowed [] key overrides []"
	wantCorrupt := map[string]int{tollgatev1.BucketRules: 0, tollgatev1.BucketBlocklist: 3, tollgatev1.BucketOverrides: 1}
	agree := func(name string, sy *syncer, want string, corrupt map[string]int) {
		t.Helper()
		testwait.Eventually(t, 10*time.Second, func() error {
			c := sy.controls.Snapshot()
			if got := controlsView(c); got != want {
				return fmt.Errorf("%s: %s, want %s", name, got, want)
			}
			if got := sy.s.Status().Corrupt; !maps.Equal(got, corrupt) {
				return fmt.Errorf("%s: corrupt entries %v, want %v", name, got, corrupt)
			}
			return nil
		})
	}
	agree("the gateway that ran through it", running, want, wantCorrupt)
	if e := running.controls.Snapshot().Blocked[kidBlocked]; !strings.Contains(e.Reason, "corrupt") || e.Expiry != 0 {
		t.Errorf("the corrupt entry's block: %+v", e)
	}
	restarted := startGateway(t, url, restartDir)
	agree("the gateway restarted from its copy", restarted, want, wantCorrupt)
	agree("a new gateway", startGateway(t, url, t.TempDir()), want, wantCorrupt)
	if logs := running.logs.String(); !strings.Contains(logs, "repair=\"DELETE /admin/v1/blocklist/kid:"+kidBlocked+"\"") {
		t.Errorf("the log does not say how to repair the entry:\n%s", logs)
	}

	// The copy on disk keeps the block: a gateway that starts while NATS
	// is unreachable enforces it too.
	restarted.stop(t)
	offline := newSyncer(t, url, restartDir)
	if _, err := offline.s.LoadLKG(); err != nil {
		t.Fatal(err)
	}
	if got := controlsView(offline.controls.Snapshot()); got != want {
		t.Errorf("from the copy alone: %s, want %s", got, want)
	}

	// Repaired: deleted, and replaced by a good entry.
	b.del(b.lists, kidBlocked)
	b.put(b.overrides, tollgatev1.OverrideKey(tollgatev1.ScopeKey, kidOverride),
		&tollgatev1.OverrideEntry{Scope: tollgatev1.ScopeKey, Subject: kidOverride, Factor: 2})
	agree("the running gateway after the repair", running, "blocked [] allowed [] key overrides ["+kidOverride+"]",
		map[string]int{tollgatev1.BucketRules: 0, tollgatev1.BucketBlocklist: 2, tollgatev1.BucketOverrides: 0})
}

// TestCorruptRulesNeverSplitTheFleet: over a corrupt active ruleset, every
// gateway runs the newest good version of the history — the running one
// keeps it, one restarting from an older copy and a new one take it from
// the history — and counts the corrupt entry. (Before, a restarting
// gateway kept its copy's older version and a new one had none.)
func TestCorruptRulesNeverSplitTheFleet(t *testing.T) {
	t.Parallel()
	ns, b := bucketsV1(t)
	url := ns.ClientURL()
	oldDir := t.TempDir()
	old := startGateway(t, url, oldDir)
	old.waitVersion(t, 1)
	old.stop(t) // its copy holds version 1

	b.putRules(2, rulesV1+"# version 2\n")
	running := startGateway(t, url, t.TempDir())
	running.waitVersion(t, 2)
	b.put(b.rules, tollgatev1.RulesKey, []byte(`{"version": 3, "source": `))
	testwait.Eventually(t, 10*time.Second, func() error {
		if n := running.s.Status().Corrupt[tollgatev1.BucketRules]; n != 1 {
			return fmt.Errorf("corrupt rules counted %d, want 1", n)
		}
		return nil
	})
	for name, sy := range map[string]*syncer{"running": running, "restarted from version 1": startGateway(t, url, oldDir),
		"new": startGateway(t, url, t.TempDir())} {
		sy.waitVersion(t, 2)
		if n := sy.s.Status().Corrupt[tollgatev1.BucketRules]; n != 1 {
			t.Errorf("%s: corrupt rules counted %d, want 1", name, n)
		}
	}
	b.putRules(4, rulesV1+"# version 4\n")
	running.waitVersion(t, 4)
	if n := running.s.Status().Corrupt[tollgatev1.BucketRules]; n != 0 {
		t.Errorf("corrupt rules counted %d after the repair, want 0", n)
	}
}
