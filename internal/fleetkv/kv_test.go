package fleetkv

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/compose/natsserver/natstest"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// connect connects to a NATS server of the test's own.
func connect(t *testing.T) *Conn {
	t.Helper()
	ns := natstest.StartTB(t)
	c, err := Connect(ns.ClientURL(), Options{Name: "fleetkv-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// openKV opens the buckets on a NATS server of the test's own.
func openKV(t *testing.T) *KV {
	t.Helper()
	kv, err := Open(t.Context(), connect(t))
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// TestOpenSettings: the buckets get the settings both ends rely on (the
// rules' history for rollback; one value per key elsewhere), and opening
// them again changes nothing.
func TestOpenSettings(t *testing.T) {
	t.Parallel()
	kv := openKV(t)
	if _, err := Open(t.Context(), kv.c); err != nil {
		t.Fatalf("opening the buckets again: %v", err)
	}
	for _, tc := range []struct {
		kv      jetstream.KeyValue
		bucket  string
		history int64
	}{
		{kv.Rules, tollgatev1.BucketRules, RulesHistory},
		{kv.Lists, tollgatev1.BucketBlocklist, 1},
		{kv.Overrides, tollgatev1.BucketOverrides, 1},
	} {
		st, err := tc.kv.Status(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if st.Bucket() != tc.bucket || st.History() != tc.history {
			t.Errorf("bucket %s history %d, want %s history %d", st.Bucket(), st.History(), tc.bucket, tc.history)
		}
	}
}

// TestBind: Bind finds the buckets Open made and creates none: before
// Open, a missing bucket is ErrNotFound, named.
func TestBind(t *testing.T) {
	t.Parallel()
	c := connect(t)
	if _, err := Bind(t.Context(), c); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "does not exist yet") {
		t.Fatalf("Bind before Open: %v, want ErrNotFound naming the bucket", err)
	}
	if _, err := Open(t.Context(), c); err != nil {
		t.Fatal(err)
	}
	kv, err := Bind(t.Context(), c)
	if err != nil {
		t.Fatalf("Bind after Open: %v", err)
	}
	if _, rev, err := kv.ActiveRules(t.Context()); err != nil || rev != 0 {
		t.Fatalf("ActiveRules of an empty bucket: revision %d, %v", rev, err)
	}
}

// TestConditionalWrites: every write names the revision it replaces, and
// a write against another one is ErrConflict, changing nothing.
func TestConditionalWrites(t *testing.T) {
	t.Parallel()
	kv := openKV(t)
	ctx := t.Context()
	const id = "condcondcondcondcondco"
	entry := func(reason string) *tollgatev1.ListEntry {
		return &tollgatev1.ListEntry{KeyID: id, Action: tollgatev1.ActionBlock, Reason: reason}
	}
	rev, err := kv.PutList(ctx, id, entry("first"), 0)
	if err != nil || rev == 0 {
		t.Fatalf("create: %d %v", rev, err)
	}
	for _, tc := range []struct {
		name string
		op   func() error
	}{
		{"create over an entry", func() error { _, err := kv.PutList(ctx, id, entry("second"), 0); return err }},
		{"update from a stale revision", func() error { _, err := kv.PutList(ctx, id, entry("second"), rev+1); return err }},
		{"delete from a stale revision", func() error { return Delete(ctx, kv.Lists, id, rev+1) }},
	} {
		if err := tc.op(); !errors.Is(err, ErrConflict) {
			t.Errorf("%s: %v, want ErrConflict", tc.name, err)
		}
	}
	if e, got, err := kv.List(ctx, id); err != nil || got != rev || e.Reason != "first" {
		t.Fatalf("after the refused writes: %+v revision %d %v, want the first entry at %d", e, got, err, rev)
	}
	if _, err := kv.PutList(ctx, id, entry(strings.Repeat("x", kv.MaxValue())), rev); !errors.Is(err, ErrTooLarge) {
		t.Errorf("a value above MaxValue: %v, want ErrTooLarge", err)
	}
	next, err := kv.PutList(ctx, id, entry("second"), rev)
	if err != nil || next <= rev {
		t.Fatalf("update from the current revision: %d %v", next, err)
	}
	if err := Delete(ctx, kv.Lists, id, next); err != nil {
		t.Fatalf("delete from the current revision: %v", err)
	}
	if e, got, err := kv.List(ctx, id); e != nil || got != 0 || err != nil {
		t.Fatalf("after the delete: %+v %d %v", e, got, err)
	}
}

// lossy is the real bucket behind a network that loses answers: a write
// or delete reaches NATS (applied) or not (dropped), and its caller gets
// a timeout either way; readable false fails the read-back too.
type lossy struct {
	jetstream.KeyValue
	applied  bool
	readable bool
}

var errLost = errors.New("answer lost: timeout")

func (l lossy) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	if l.applied {
		if _, err := l.KeyValue.Create(ctx, key, value, opts...); err != nil {
			return 0, err
		}
	}
	return 0, errLost
}

func (l lossy) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	if l.applied {
		if _, err := l.KeyValue.Update(ctx, key, value, rev); err != nil {
			return 0, err
		}
	}
	return 0, errLost
}

func (l lossy) Delete(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error {
	if l.applied {
		if err := l.KeyValue.Delete(ctx, key, opts...); err != nil {
			return err
		}
	}
	return errLost
}

func (l lossy) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	if !l.readable {
		return nil, errLost
	}
	return l.KeyValue.Get(ctx, key)
}

// TestLostAnswers: a write or delete whose answer was lost is read back
// before its error is believed: applied, it counts as done; not applied,
// the error stands; unreadable, the outcome is unknown — never a false
// success, never a false conflict.
func TestLostAnswers(t *testing.T) {
	t.Parallel()
	kv := openKV(t)
	ctx := t.Context()
	for i, tc := range []struct {
		name     string
		exists   bool // the key holds an entry before
		applied  bool
		readable bool
		del      bool
		want     error // nil: done
	}{
		{"create applied", false, true, true, false, nil},
		{"update applied", true, true, true, false, nil},
		{"create dropped", false, false, true, false, errLost},
		{"update dropped", true, false, true, false, errLost},
		{"update, read-back fails", true, true, false, false, ErrUnknownOutcome},
		{"delete applied", true, true, true, true, nil},
		{"delete dropped", true, false, true, true, errLost},
		{"delete, read-back fails", true, true, false, true, ErrUnknownOutcome},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "lost" + string(rune('a'+i))
			var rev uint64
			if tc.exists {
				var err error
				if rev, err = write(ctx, kv.Lists, key, []byte("before"), 0); err != nil {
					t.Fatal(err)
				}
			}
			l := lossy{KeyValue: kv.Lists, applied: tc.applied, readable: tc.readable}
			var err error
			if tc.del {
				err = Delete(ctx, l, key, rev)
			} else {
				var got uint64
				got, err = write(ctx, l, key, []byte("after"), rev)
				if err == nil && got <= rev {
					t.Errorf("revision %d after a write from %d", got, rev)
				}
			}
			if (tc.want == nil) != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Fatalf("%v, want %v", err, tc.want)
			}
			if errors.Is(err, ErrConflict) {
				t.Fatalf("a lost answer reported as a conflict: %v", err)
			}
		})
	}
}

// TestReadsReportCorruptEntries: a read of a corrupt entry is a
// *CorruptError with the entry's revision, so that a conditional write
// can replace it.
func TestReadsReportCorruptEntries(t *testing.T) {
	t.Parallel()
	kv := openKV(t)
	ctx := t.Context()
	const id = "corruptcorruptcorrupt0"
	rev, err := kv.Lists.Put(ctx, id, []byte(`{"key_id":"corruptcorruptcorrupt0","action":"blo`))
	if err != nil {
		t.Fatal(err)
	}
	e, got, err := kv.List(ctx, id)
	var ce *CorruptError
	if e != nil || got != rev || !errors.As(err, &ce) || ce.Revision != rev || ce.Bytes == 0 || len(ce.SHA256) != 64 {
		t.Fatalf("List of a corrupt entry: %+v %d %v, want a *CorruptError at revision %d", e, got, err, rev)
	}
	if _, err := kv.PutList(ctx, id, &tollgatev1.ListEntry{KeyID: id, Action: tollgatev1.ActionBlock}, got); err != nil {
		t.Fatalf("replacing the corrupt entry from its revision: %v", err)
	}
	if _, err := kv.Rules.Put(ctx, tollgatev1.RulesKey, []byte("not json")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := kv.ActiveRules(ctx); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("ActiveRules of a corrupt entry: %v, want ErrCorrupt", err)
	}
	vs, err := kv.RulesVersions(ctx)
	if err != nil || len(vs) != 1 || vs[0].Corrupt == nil || vs[0].Entry != nil {
		t.Fatalf("RulesVersions: %+v %v, want the one corrupt version", vs, err)
	}
	// Reading back with a deadline already past still answers (the
	// read-back of a lost write must not die with its caller's context).
	dead, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel()
	if e, err := readBack(dead, kv.Lists, id); err != nil || e.Revision() == 0 {
		t.Fatalf("readBack after the caller's deadline: %v", err)
	}
}

// TestRedactURL: neither a password nor a token reaches a log line, in
// any of several comma-separated URLs.
func TestRedactURL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"nats://127.0.0.1:4222", "nats://127.0.0.1:4222"},
		{"nats://user:secret@nats-1:4222", "nats://user:xxxxx@nats-1:4222"},
		{"nats://a:secret@nats-1:4222,nats://b:secret@nats-2:4222", "nats://a:xxxxx@nats-1:4222,nats://b:xxxxx@nats-2:4222"},
		{"nats://token-secret@nats-1:4222", "nats://xxxxx@nats-1:4222"},
	} {
		if got := RedactURL(tc.in); got != tc.want {
			t.Errorf("RedactURL(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestPutRulesAddsTheDocument: the active ruleset is written with its
// source parsed (RulesEntry.Document), which gateways decode instead of
// parsing YAML; without it when the source does not parse or the value
// would be too large with it, and as given when it has one.
func TestPutRulesAddsTheDocument(t *testing.T) {
	t.Parallel()
	kv := openKV(t)
	const src = "rules:\n  - id: demo # the demo rule\n    algorithm: token_bucket\n    capacity: 5\n    rate: 5/1h\n"
	want := `{"rules":[{"id":"demo","algorithm":"token_bucket","capacity":5,"rate":"5/1h"}]}`
	// Fits as a source, not twice (source and document).
	big := src + "allowlist: [sk_" + strings.Repeat("x", kv.MaxValue()*2/3) + "]\n"
	for _, tc := range []struct {
		name, source, document, want string
	}{
		{"parsed", src, "", want},
		{"already there", src, `{"rules":[]}`, `{"rules":[]}`},
		{"source does not parse", "rules: [", "", ""},
		{"too large with it", big, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &tollgatev1.RulesEntry{Version: 3, Source: tc.source, Format: "yaml", Document: json.RawMessage(tc.document)}
			_, rev, err := kv.ActiveRules(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := kv.PutRules(t.Context(), e, rev); err != nil {
				t.Fatal(err)
			}
			got, _, err := kv.ActiveRules(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if string(got.Document) != tc.want || got.Source != tc.source {
				t.Errorf("document %s, want %s", got.Document, tc.want)
			}
			if string(e.Document) != tc.document {
				t.Errorf("the caller's entry changed: document %s", e.Document)
			}
		})
	}
}
