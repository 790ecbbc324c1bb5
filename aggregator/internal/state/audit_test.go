package state

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestAuditEntries materializes audit records (a replay, a marker, two
// subjects) and reads them back by time and by subject, and pins the key
// layout a data directory written before holds.
func TestAuditEntries(t *testing.T) {
	db := open(t)
	at := func(s int) int64 { return time.Unix(1_700_000_000+int64(s), 0).UnixMicro() }
	entry := func(off int64, s int, id, subject string) AuditRecord {
		return AuditRecord{Partition: 0, Offset: off, Entry: true, TimeMicros: at(s), ID: id, Subject: subject,
			Value: []byte(id + "@" + subject)}
	}
	first := []AuditRecord{entry(0, 1, "i1", "kid-a"), entry(1, 2, "i2", "rules"), {Partition: 0, Offset: 2}, entry(3, 3, "i3", "kid-a")}
	if err := db.MaterializeAudit(first); err != nil {
		t.Fatal(err)
	}
	// A replay from offset 1 changes nothing; offset 4 is new.
	if err := db.MaterializeAudit([]AuditRecord{entry(1, 9, "forged", "kid-a"), entry(4, 4, "i4", "kid-b")}); err != nil {
		t.Fatal(err)
	}
	if off, err := db.Offset(TopicAudit, 0); err != nil || off != 5 {
		t.Fatalf("audit offset %d, %v; want 5", off, err)
	}
	collect := func(subject string, from, to time.Time, limit int) []string {
		var out []string
		err := db.AuditEntries(subject, from, to, func(v []byte) (bool, error) {
			out = append(out, string(v))
			return len(out) < limit, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	for _, tc := range []struct {
		name     string
		subject  string
		from, to time.Time
		limit    int
		want     []string
	}{
		{"all", "", time.Time{}, time.Time{}, 10, []string{"i1@kid-a", "i2@rules", "i3@kid-a", "i4@kid-b"}},
		{"subject", "kid-a", time.Time{}, time.Time{}, 10, []string{"i1@kid-a", "i3@kid-a"}},
		{"range", "", time.UnixMicro(at(2)), time.UnixMicro(at(4)), 10, []string{"i2@rules", "i3@kid-a"}},
		{"subject and range", "kid-a", time.UnixMicro(at(2)), time.Time{}, 10, []string{"i3@kid-a"}},
		{"limit", "", time.Time{}, time.Time{}, 2, []string{"i1@kid-a", "i2@rules"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := collect(tc.subject, tc.from, tc.to, tc.limit); !slices.Equal(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
	// The layout on disk: 'a' time id → entry, 'A' len subject time id.
	flipped := []byte{0x80, 0x06, 0x0a, 0x24, 0x18, 0x2d, 0x82, 0x40} // at(1) ^ 1<<63, big-endian
	if v, closer, err := db.db.Get(append(append([]byte{'a'}, flipped...), "i1"...)); err != nil || !bytes.Equal(v, []byte("i1@kid-a")) {
		t.Fatalf("entry by time: %q, %v", v, err)
	} else {
		_ = closer.Close()
	}
	if _, closer, err := db.db.Get(append(append([]byte("A\x05kid-a"), flipped...), "i1"...)); err != nil {
		t.Fatalf("entry by subject: %v", err)
	} else {
		_ = closer.Close()
	}
}

// TestSnapshotsKeepTheNewest takes more snapshots than are kept and opens
// the newest read-only.
func TestSnapshotsKeepTheNewest(t *testing.T) {
	db := open(t)
	if err := db.MaterializeAudit([]AuditRecord{{Offset: 0, Entry: true, TimeMicros: 1, ID: "i", Subject: "s", Value: []byte("v")}}); err != nil {
		t.Fatal(err)
	}
	snaps := NewSnapshots(db, filepath.Join(t.TempDir(), "snapshots"), 2, nil)
	start := time.Unix(1_700_000_000, 0)
	var last string
	for i := range 4 {
		dir, err := snaps.Take(start.Add(time.Duration(i) * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		last = dir
	}
	entries, err := os.ReadDir(snaps.Dir())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := []string{"20231114T221322.000000000Z", "20231114T221323.000000000Z"}; !slices.Equal(names, want) {
		t.Fatalf("snapshots kept: %q, want %q", names, want)
	}
	snap, err := OpenReadOnly(last, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Close()
	n := 0
	if err := snap.AuditEntries("", time.Time{}, time.Time{}, func([]byte) (bool, error) { n++; return true, nil }); err != nil || n != 1 {
		t.Fatalf("snapshot holds %d entries, %v", n, err)
	}
}
