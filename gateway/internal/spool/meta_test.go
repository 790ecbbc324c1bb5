package spool_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"path"
	"slices"
	"syscall"
	"testing"

	"github.com/tollgate/tollgate/gateway/internal/spool"
	"github.com/tollgate/tollgate/gateway/internal/spool/spooltest"
)

var metaPath = path.Join(dir, "META")

// wantMeta checks that the spool's META reads back as one of may.
func wantMeta(t testing.TB, s *spool.Spool, may ...string) {
	t.Helper()
	got, err := s.ReadMeta()
	if err != nil || got == nil || !slices.Contains(may, string(got)) {
		t.Fatalf("meta is %q, %v; want one of %q", got, err, may)
	}
}

func mustWriteMeta(t testing.TB, s *spool.Spool, blob string) {
	t.Helper()
	if err := s.WriteMeta([]byte(blob)); err != nil {
		t.Fatalf("write meta %.20q: %v", blob, err)
	}
}

func TestMeta(t *testing.T) {
	t.Parallel()
	fsys := spooltest.New()
	s := open(t, fsys, spool.Options{NoSync: true})
	blob, err := s.ReadMeta()
	if blob != nil || err != nil {
		t.Fatalf("meta of a new spool: %q, %v; want nil, nil", blob, err)
	}
	// Small blobs, an empty one, one larger than the first file's slots
	// (a new, larger file), and small ones again in place.
	for _, want := range [][]byte{[]byte("epoch=1"), {}, bytes.Repeat([]byte("x"), 5000), []byte("epoch=2"), []byte("epoch=2b")} {
		if err := s.WriteMeta(want); err != nil {
			t.Fatal(err)
		}
		got, err := s.ReadMeta()
		if err != nil || got == nil || !bytes.Equal(got, want) {
			t.Fatalf("read %.20q, %v after writing %.20q", got, err, want)
		}
		// A restart reads what the running spool read.
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s = open(t, fsys, spool.Options{NoSync: true})
		if got, err := s.ReadMeta(); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("after a restart read %.20q, %v, want %.20q", got, err, want)
		}
	}
	mustWriteMeta(t, s, "epoch=2")

	// A write failing before its data reached the file keeps the previous
	// blob; one whose last sync failed leaves the old or the new one, never
	// none. Neither leaves a temporary file, and the next write works.
	for _, tc := range []struct {
		name  string
		blob  string // "epoch=3", in place; a long one needs a new file
		fault spooltest.Injector
		may   []string
	}{
		{"in place: open", "epoch=3", spooltest.FailNth(spooltest.OpOpen, "META", 1, spooltest.ErrInjected), []string{"epoch=2"}},
		{"in place: write", "epoch=3", spooltest.FailNth(spooltest.OpWrite, "META", 1, spooltest.ErrInjected), []string{"epoch=2"}},
		{"in place: sync", "epoch=3", spooltest.FailNth(spooltest.OpSync, "META", 1, spooltest.ErrInjected), []string{"epoch=2", "epoch=3"}},
		{"new file: write", "long", spooltest.FailNth(spooltest.OpWrite, "META.tmp", 1, spooltest.ErrInjected), []string{"epoch=2"}},
		{"new file: sync", "long", spooltest.FailNth(spooltest.OpSync, "META.tmp", 1, spooltest.ErrInjected), []string{"epoch=2"}},
		{"new file: rename", "long", spooltest.FailNth(spooltest.OpRename, "META.tmp", 1, spooltest.ErrInjected), []string{"epoch=2"}},
		{"new file: directory sync", "long", spooltest.FailNth(spooltest.OpSync, "gw-1", 1, spooltest.ErrInjected), []string{"epoch=2", "long"}},
	} {
		blob := tc.blob
		if blob == "long" {
			blob = string(bytes.Repeat([]byte("y"), 40_000))
			for i, m := range tc.may {
				if m == "long" {
					tc.may[i] = blob
				}
			}
		}
		fsys.Inject(tc.fault)
		err := s.WriteMeta([]byte(blob))
		fsys.Inject(nil)
		if !errors.Is(err, spooltest.ErrInjected) || errors.Is(err, spool.ErrFull) {
			t.Fatalf("%s: failed write meta: %v", tc.name, err)
		}
		wantMeta(t, s, tc.may...)
		if _, other := segFiles(listDir(t, fsys)); len(other) != 0 {
			t.Fatalf("%s: a failed write meta left %v", tc.name, other)
		}
		mustWriteMeta(t, s, "epoch=2")
		wantMeta(t, s, "epoch=2")
	}

	// WriteMeta is durable even under NoSync: the blob survives a crash.
	s2 := open(t, fsys.Crash(nil), spool.Options{})
	wantMeta(t, s2, "epoch=2")

	// One damaged slot is a write a crash cut short: the other slot's blob
	// is read. Both damaged is reported, not returned.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	_ = s2.Close()
	s = open(t, fsys, spool.Options{})
	mustWriteMeta(t, s, "epoch=4")
	_ = s.Close()
	b, err := fsys.ReadFile(metaPath)
	if err != nil {
		t.Fatal(err)
	}
	newest := slotOf(t, b, "epoch=4")
	flip := func(slot int) {
		rewrite(t, fsys, metaPath, func(b []byte) []byte {
			b[slot*len(b)/2+30] ^= 1 // the slot's blob
			return b
		})
	}
	flip(newest)
	s = open(t, fsys, spool.Options{})
	wantMeta(t, s, "epoch=2")
	_ = s.Close()
	flip(1 - newest)
	s = open(t, fsys, spool.Options{})
	if got, err := s.ReadMeta(); !errors.Is(err, spool.ErrCorrupt) {
		t.Fatalf("damaged meta read as %q, %v; want ErrCorrupt", got, err)
	}
	// The next write replaces an unreadable file.
	mustWriteMeta(t, s, "epoch=5")
	wantMeta(t, s, "epoch=5")
}

// slotOf returns which slot of META's bytes holds blob.
func slotOf(t testing.TB, b []byte, blob string) int {
	t.Helper()
	half := len(b) / 2
	for slot := range 2 {
		if bytes.HasPrefix(b[slot*half+28:], []byte(blob)) {
			return slot
		}
	}
	t.Fatalf("no slot of META holds %q", blob)
	return 0
}

// TestMetaOnFullDisk: once written, META is rewritten in place, so a full
// disk does not stop it; a blob that outgrows its slots needs a new file,
// which a full disk refuses with ErrFull, keeping the previous blob.
func TestMetaOnFullDisk(t *testing.T) {
	t.Parallel()
	fsys := spooltest.New()
	s := open(t, fsys, spool.Options{})
	mustWriteMeta(t, s, "epoch=1")
	mustAppend(t, s, batch("a", 10, 100))
	fsys.SetCapacity(fsys.Usage())
	if err := s.Append(batch("b", 1, 10)); !errors.Is(err, spool.ErrFull) {
		t.Fatalf("append to a full disk: %v, want ErrFull", err)
	}
	for i := range 5 {
		blob := fmt.Sprintf("epoch=1 reserved=%d", (i+1)*10_000)
		mustWriteMeta(t, s, blob)
		wantMeta(t, s, blob)
	}
	big := string(bytes.Repeat([]byte("z"), 10_000))
	err := s.WriteMeta([]byte(big))
	if !errors.Is(err, spool.ErrFull) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("a blob larger than META's slots on a full disk: %v, want ErrFull and ENOSPC", err)
	}
	wantMeta(t, s, "epoch=1 reserved=50000")
	if _, other := segFiles(listDir(t, fsys)); len(other) != 0 {
		t.Fatalf("a failed write meta left %v", other)
	}
	// A restart on the full disk reads it and rewrites it in place.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, fsys, spool.Options{})
	wantMeta(t, s, "epoch=1 reserved=50000")
	mustWriteMeta(t, s, "epoch=2")
	wantMeta(t, s, "epoch=2")
	// Freed space lets it grow.
	fsys.SetCapacity(0)
	mustWriteMeta(t, s, big)
	wantMeta(t, s, big)
}

// metaVersionOne is a META file of the first format: one blob, replaced
// by a renamed temporary file at every write.
func metaVersionOne(blob string) []byte {
	b := make([]byte, 16, 16+len(blob))
	copy(b, "TGMT")
	binary.LittleEndian.PutUint16(b[4:], 1)
	binary.LittleEndian.PutUint32(b[8:], uint32(len(blob)))
	tab := crc32.MakeTable(crc32.Castagnoli)
	binary.LittleEndian.PutUint32(b[12:], crc32.Update(crc32.Checksum(b[:12], tab), tab, []byte(blob)))
	return append(b, blob...)
}

// TestMetaVersionOne: a META of the first format (a spool an earlier build
// wrote) is read, and replaced by the slotted format at the first write
// the disk has room for.
func TestMetaVersionOne(t *testing.T) {
	t.Parallel()
	fsys := spooltest.New()
	s := open(t, fsys, spool.Options{})
	mustAppend(t, s, batch("a", 3, 100))
	_ = s.Close()
	if err := fsys.WriteFile(metaPath, metaVersionOne("epoch=old")); err != nil {
		t.Fatal(err)
	}
	s = open(t, fsys, spool.Options{})
	wantMeta(t, s, "epoch=old")
	fsys.SetCapacity(fsys.Usage())
	if err := s.WriteMeta([]byte("epoch=new")); !errors.Is(err, spool.ErrFull) {
		t.Fatalf("replacing a first-format META on a full disk: %v, want ErrFull", err)
	}
	wantMeta(t, s, "epoch=old")
	fsys.SetCapacity(0)
	mustWriteMeta(t, s, "epoch=new")
	wantMeta(t, s, "epoch=new")
	fsys.SetCapacity(fsys.Usage())
	mustWriteMeta(t, s, "epoch=newer")
	wantMeta(t, s, "epoch=newer")
}

// TestCrashDuringWriteMeta stops the process at every operation of a
// WriteMeta in turn, in place and into a new file, then reads META as a
// restart after the process's death and after machine crashes would: the
// old blob or the new one, never an error, and the new one whenever the
// write returned nil.
func TestCrashDuringWriteMeta(t *testing.T) {
	t.Parallel()
	long := string(bytes.Repeat([]byte("n"), 9000))
	for _, tc := range []struct{ name, before, blob string }{
		{"in place", "old", "new"},
		{"in place, other slot", "old2", "new"},
		{"new file", "old", long},
	} {
		setup := func(t *testing.T) (*spooltest.FS, *spool.Spool) {
			fsys := spooltest.New()
			s := open(t, fsys, spool.Options{})
			mustWriteMeta(t, s, "old")
			if tc.before != "old" {
				mustWriteMeta(t, s, tc.before)
			}
			return fsys, s
		}
		fsys, s := setup(t)
		start := fsys.Ops()
		mustWriteMeta(t, s, tc.blob)
		ops := int(fsys.Ops() - start)
		_ = s.Close()
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			t.Logf("a WriteMeta takes %d operations", ops)
			for k := range ops + 1 {
				fsys, s := setup(t)
				states, werr := crashAfter(t, fsys, s, k, ops, 16, "write meta", func() error { return s.WriteMeta([]byte(tc.blob)) })
				for name, after := range states {
					s, err := spool.Open(after, dir, spool.Options{})
					if err != nil {
						t.Fatalf("after %d: %s: open: %v", k, name, err)
					}
					got, err := s.ReadMeta()
					_ = s.Close()
					switch {
					case err != nil:
						t.Fatalf("after %d: %s: read meta: %v", k, name, err)
					case string(got) == tc.blob:
					case werr != nil && string(got) == tc.before:
					default:
						t.Fatalf("after %d: %s: meta is %.20q (write returned %v), want %.20q or, if it failed, %.20q",
							k, name, got, werr, tc.blob, tc.before)
					}
				}
			}
		})
	}
}
