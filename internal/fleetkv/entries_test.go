package fleetkv

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// Key_ids (22 base64url characters) of the tests.
const (
	kidA = "aaaaaaaaaaaaaaaaaaaaaa"
	kidB = "bbbbbbbbbbbbbbbbbbbbbb"
)

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDecode: what is corrupt, the same for the operator API's reads and
// the gateways' watch.
func TestDecode(t *testing.T) {
	t.Parallel()
	block := &tollgatev1.ListEntry{KeyID: kidA, Action: tollgatev1.ActionBlock}
	allow := &tollgatev1.ListEntry{KeyID: kidA, Action: tollgatev1.ActionAllow}
	ov := &tollgatev1.OverrideEntry{Scope: tollgatev1.ScopeKey, Subject: kidA, Limit: 5}
	for _, tc := range []struct {
		name, bucket, key string
		value             []byte
		corrupt           bool
	}{
		{"rules", tollgatev1.BucketRules, tollgatev1.RulesKey, mustJSON(t, &tollgatev1.RulesEntry{Version: 1, Source: "rules: []"}), false},
		{"rules without source", tollgatev1.BucketRules, tollgatev1.RulesKey, []byte(`{"version":1}`), true},
		{"block", tollgatev1.BucketBlocklist, kidA, mustJSON(t, block), false},
		{"block under another key_id", tollgatev1.BucketBlocklist, kidB, mustJSON(t, block), true},
		{"allow", tollgatev1.BucketBlocklist, tollgatev1.AllowlistKey(kidA), mustJSON(t, allow), false},
		{"allow under the key_id", tollgatev1.BucketBlocklist, kidA, mustJSON(t, allow), true},
		{"truncated", tollgatev1.BucketBlocklist, kidA, []byte(`{"key_id":"` + kidA + `","action":"blo`), true},
		{"override", tollgatev1.BucketOverrides, tollgatev1.OverrideKey(tollgatev1.ScopeKey, kidA), mustJSON(t, ov), false},
		{"override under a tenant's key", tollgatev1.BucketOverrides, tollgatev1.OverrideKey(tollgatev1.ScopeTenant, kidA), mustJSON(t, ov), true},
		{"override without limit or factor", tollgatev1.BucketOverrides, "key." + kidA, []byte(`{"scope":"key","subject":"` + kidA + `"}`), true},
		{"another bucket", "elsewhere", kidA, mustJSON(t, block), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := Decode(tc.bucket, tc.key, 7, tc.value)
			if c.Bucket != tc.bucket || c.Key != tc.key || c.Revision != 7 || c.Deleted {
				t.Fatalf("change %+v: wrong identity", c)
			}
			decoded := 0
			for _, ok := range []bool{c.Rules != nil, c.List != nil, c.Override != nil, c.Gateway != nil} {
				if ok {
					decoded++
				}
			}
			if tc.corrupt {
				if c.Corrupt == nil || decoded != 0 || !errors.Is(c.Err(), ErrCorrupt) || c.Corrupt.Revision != 7 ||
					c.Corrupt.Bytes != len(tc.value) || len(c.Corrupt.SHA256) != 64 {
					t.Fatalf("change %+v (corrupt %+v): want corrupt, nothing decoded", c, c.Corrupt)
				}
				return
			}
			if c.Corrupt != nil || c.Err() != nil || decoded != 1 {
				t.Fatalf("change %+v: want one decoded entry, got corrupt %v", c, c.Corrupt)
			}
		})
	}
}

// TestEntriesControlSet: what each entry means to guard.Controls.
func TestEntriesControlSet(t *testing.T) {
	t.Parallel()
	exp := time.Now().Add(time.Hour).UTC().Truncate(time.Microsecond)
	es := NewEntries()
	for _, c := range []Change{
		{Bucket: tollgatev1.BucketBlocklist, Key: "op", List: &tollgatev1.ListEntry{KeyID: "op", Action: tollgatev1.ActionBlock, Reason: "abuse", ExpiresAt: exp}},
		{Bucket: tollgatev1.BucketBlocklist, Key: "pen2", List: &tollgatev1.ListEntry{KeyID: "pen2", Action: tollgatev1.ActionPenalty, Level: 2, Close: true, ExpiresAt: exp}},
		{Bucket: tollgatev1.BucketBlocklist, Key: "pen3", List: &tollgatev1.ListEntry{KeyID: "pen3", Action: tollgatev1.ActionPenalty, Level: 3, Close: true}},
		{Bucket: tollgatev1.BucketBlocklist, Key: "top", List: &tollgatev1.ListEntry{KeyID: "top", Action: tollgatev1.ActionBlock, Level: 3, Close: true}},
		{Bucket: tollgatev1.BucketBlocklist, Key: "allow.ok", List: &tollgatev1.ListEntry{KeyID: "ok", Action: tollgatev1.ActionAllow}},
		Decode(tollgatev1.BucketBlocklist, kidA, 9, []byte("garbage")),
		Decode(tollgatev1.BucketBlocklist, tollgatev1.AllowlistKey(kidB), 10, []byte("garbage")),
		Decode(tollgatev1.BucketBlocklist, "notakeyid", 11, []byte("garbage")),
		{Bucket: tollgatev1.BucketOverrides, Key: "key.lad", Override: &tollgatev1.OverrideEntry{Scope: tollgatev1.ScopeKey, Subject: "lad", Factor: 0.5, Level: 1, Rule: "r"}},
		{Bucket: tollgatev1.BucketOverrides, Key: "tenant.x", Override: &tollgatev1.OverrideEntry{Scope: tollgatev1.ScopeTenant, Subject: "acme", Limit: 9}},
		Decode(tollgatev1.BucketOverrides, "key."+kidB, 12, []byte("garbage")),
	} {
		es.Apply(c)
	}
	want := &guard.ControlSet{
		Blocked: map[string]guard.Entry{
			"op":  {Expiry: exp.UnixMicro(), Reason: "abuse"},
			"top": {Level: 3, Close: true},
			kidA:  {Reason: "corrupt blocklist entry (revision 9)"},
		},
		Allowed: map[string]guard.Entry{"ok": {}},
		Penalties: map[string]guard.Penalty{
			"pen2": {Level: 2, Until: exp.UnixMicro()}, // below the ladder's top: no close
			"pen3": {Level: 3, Until: math.MaxInt64, Close: true},
		},
		KeyOverrides:    map[string]guard.Override{"lad": {Override: rules.Override{Factor: 0.5}, Rule: "r", Level: 1}},
		TenantOverrides: map[string]guard.Override{"acme": {Override: rules.Override{Limit: 9}}},
	}
	if got := es.ControlSet(); !reflect.DeepEqual(got, want) {
		t.Fatalf("ControlSet:\n got %+v\nwant %+v", got, want)
	}
	if len(es.CorruptLists) != 3 || len(es.CorruptOverrides) != 1 {
		t.Errorf("corrupt entries %d and %d, want 3 and 1", len(es.CorruptLists), len(es.CorruptOverrides))
	}
}

// TestEntriesApplyKeepsControlsWhole: applying changes one by one to
// guard.Controls (Apply's edits, through Edit and through Update) gives
// what a whole read of the same entries gives (ControlSet), through every
// kind of move: a good entry replaced by a corrupt one and back, a block
// turned into a penalty, an allowlisting deleted, an override moved to
// another level. Decisions read the edited controls as they read the
// whole set.
func TestEntriesApplyKeepsControlsWhole(t *testing.T) {
	t.Parallel()
	list := func(action string, level int) []byte {
		return []byte(fmt.Sprintf(`{"key_id":%q,"action":%q,"level":%d}`, kidA, action, level))
	}
	steps := []Change{
		Decode(tollgatev1.BucketBlocklist, kidA, 1, list(tollgatev1.ActionBlock, 0)),
		Decode(tollgatev1.BucketBlocklist, kidA, 2, []byte("garbage")),
		Decode(tollgatev1.BucketBlocklist, kidA, 3, list(tollgatev1.ActionPenalty, 2)),
		Decode(tollgatev1.BucketBlocklist, tollgatev1.AllowlistKey(kidB), 4, []byte(`{"key_id":"`+kidB+`","action":"allow"}`)),
		Decode(tollgatev1.BucketOverrides, "key."+kidB, 5, []byte(`{"scope":"key","subject":"`+kidB+`","factor":0.5,"level":1}`)),
		Decode(tollgatev1.BucketOverrides, "key."+kidB, 6, []byte("garbage")),
		Decode(tollgatev1.BucketBlocklist, kidA, 7, list(tollgatev1.ActionBlock, 3)),
		{Bucket: tollgatev1.BucketBlocklist, Key: tollgatev1.AllowlistKey(kidB), Revision: 8, Deleted: true},
		Decode(tollgatev1.BucketOverrides, "key."+kidB, 9, []byte(`{"scope":"key","subject":"`+kidB+`","limit":3}`)),
		{Bucket: tollgatev1.BucketBlocklist, Key: kidA, Revision: 10, Deleted: true},
		Decode(tollgatev1.BucketRules, tollgatev1.RulesKey, 11, []byte("garbage")), // not a control
	}
	es := NewEntries()
	edited, updated := guard.NewControls(), guard.NewControls()
	for i, c := range steps {
		edit := es.Apply(c)
		edited.Edit(edit)
		updated.Update(func(cs *guard.ControlSet) { edit(cs) })
		want := es.ControlSet()
		for _, got := range []struct {
			how string
			c   *guard.Controls
		}{{"Edit", edited}, {"Update", updated}} {
			if n := got.c.Snapshot().Len(); n != want.Len() {
				t.Fatalf("after step %d, through %s: Len %d, want %d", i, got.how, n, want.Len())
			}
			if cs := got.c.Snapshot().Clone(); !reflect.DeepEqual(cs, want) {
				t.Fatalf("after step %d (%s %s r%d): applied one by one through %s\n %+v\nread whole\n %+v", i, c.Bucket, c.Key, c.Revision, got.how, cs, want)
			}
		}
	}
	if n := edited.Snapshot().Len(); n != 1 {
		t.Errorf("%d controls left, want the one override", n)
	}
}

// FuzzDecode: any value, under any key of any bucket, decodes or is
// corrupt — never both, never a panic — and what decodes belongs under its
// key and decodes the same once written again.
func FuzzDecode(f *testing.F) {
	f.Add(tollgatev1.BucketBlocklist, kidA, []byte(`{"key_id":"`+kidA+`","action":"block","level":3,"close":true}`))
	f.Add(tollgatev1.BucketBlocklist, "allow."+kidA, []byte(`{"key_id":"`+kidA+`","action":"allow"}`))
	f.Add(tollgatev1.BucketOverrides, "key."+kidA, []byte(`{"scope":"key","subject":"`+kidA+`","factor":0.5}`))
	f.Add(tollgatev1.BucketOverrides, "tenant.YWNtZQ", []byte(`{"scope":"tenant","subject":"acme","limit":3}`))
	f.Add(tollgatev1.BucketRules, tollgatev1.RulesKey, []byte(`{"version":2,"source":"rules: []"}`))
	f.Add(tollgatev1.BucketBlocklist, kidA, []byte("\x00\x01garbage"))
	f.Add(tollgatev1.BucketGateways, "gw-1", []byte(`{"gateway_id":"gw-1","region":"eu","rules_version":4,"rules_source":"nats"}`))
	f.Fuzz(func(t *testing.T, bucket, key string, value []byte) {
		c := Decode(bucket, key, 1, value)
		decoded := 0
		for _, ok := range []bool{c.Rules != nil, c.List != nil, c.Override != nil, c.Gateway != nil} {
			if ok {
				decoded++
			}
		}
		if (c.Corrupt == nil) != (decoded == 1) || decoded > 1 {
			t.Fatalf("Decode(%q, %q, %q) = %+v: want exactly one of decoded and corrupt", bucket, key, value, c)
		}
		var again Change
		switch {
		case c.List != nil:
			if tollgatev1.CheckListKey(key, c.List) != nil {
				t.Fatalf("a list entry decoded under the wrong key %q: %+v", key, c.List)
			}
			again = Decode(bucket, key, 1, mustJSON(t, c.List))
		case c.Override != nil:
			if tollgatev1.CheckOverrideKey(key, c.Override) != nil {
				t.Fatalf("an override decoded under the wrong key %q: %+v", key, c.Override)
			}
			again = Decode(bucket, key, 1, mustJSON(t, c.Override))
		case c.Rules != nil:
			again = Decode(bucket, key, 1, mustJSON(t, c.Rules))
		case c.Gateway != nil:
			if tollgatev1.CheckGatewayKey(key, c.Gateway) != nil || tollgatev1.CheckGatewayID(key) != nil {
				t.Fatalf("a gateway entry decoded under the wrong or an illegal key %q: %+v", key, c.Gateway)
			}
			again = Decode(bucket, key, 1, mustJSON(t, c.Gateway))
		default:
			return
		}
		if again.Corrupt != nil {
			t.Fatalf("an entry that decoded is corrupt once written again: %v", again.Corrupt)
		}
		es := NewEntries()
		es.Apply(c)
		_ = es.ControlSet()
	})
}
