package spool_test

import (
	"encoding/binary"
	"hash/crc32"
	"path"
	"slices"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/gateway/internal/spool"
	"github.com/tollgate/tollgate/gateway/internal/spool/spooltest"
)

// threeSegments returns an FS whose spool holds a, b and c (ids 1, 2, 3),
// closed.
func threeSegments(t *testing.T) (fsys *spooltest.FS, a, b, c []spool.Record) {
	t.Helper()
	fsys = spooltest.New()
	a, b, c = batch("a", 4, 100), batch("b", 5, 100), batch("c", 6, 100)
	s := open(t, fsys, spool.Options{})
	for _, x := range [][]spool.Record{a, b, c} {
		mustAppend(t, s, x)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return fsys, a, b, c
}

func segPath(id int) string {
	return path.Join(dir, strings.Repeat("0", 15)+string(rune('0'+id))+".seg")
}

func rewrite(t *testing.T, fsys *spooltest.FS, name string, change func([]byte) []byte) {
	t.Helper()
	b, err := fsys.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := fsys.WriteFile(name, change(b)); err != nil {
		t.Fatal(err)
	}
}

func TestTornTailRecovery(t *testing.T) {
	t.Parallel()
	// Offsets in c's file (6 records of 100 bytes): header 20, each
	// record 12+100, trailer 12.
	const rec = 112
	cases := []struct {
		name string
		cut  func([]byte) []byte
		kept int // of c's records
	}{
		{"cut in the header", func(b []byte) []byte { return b[:9] }, 0},
		{"cut in the first record", func(b []byte) []byte { return b[:20+50] }, 0},
		{"cut after two records", func(b []byte) []byte { return b[:20+2*rec] }, 2},
		{"cut in the fourth record", func(b []byte) []byte { return b[:20+3*rec+7] }, 3},
		{"cut in the trailer", func(b []byte) []byte { return b[:len(b)-5] }, 6},
		{"zeros past five records", func(b []byte) []byte {
			clear(b[20+5*rec:])
			return b
		}, 5},
		{"empty file", func([]byte) []byte { return nil }, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fsys, a, b, c := threeSegments(t)
			rewrite(t, fsys, segPath(3), tc.cut)
			var log logBuffer
			s := open(t, fsys, spool.Options{Logger: log.logger()})
			want := [][]spool.Record{a, b}
			if tc.kept > 0 {
				want = append(want, c[:tc.kept])
			}
			wantSpool(t, s, want)
			st := s.Stats()
			if st.TornSegments != 1 || st.Quarantined != 0 {
				t.Fatalf("stats %+v, want one torn segment", st)
			}
			if !strings.Contains(log.String(), "torn") && !strings.Contains(log.String(), "without an intact record") {
				t.Fatalf("nothing logged about the torn segment: %s", log.String())
			}
			t.Logf("logged: %s", strings.TrimSpace(log.String()))
			// Appends go on after the repaired segment, and the repair
			// is durable: a second Open finds nothing to do.
			d := batch("d", 2, 10)
			mustAppend(t, s, d)
			want = append(want, d)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = open(t, fsys.Crash(nil), spool.Options{})
			wantSpool(t, s, want)
			if st := s.Stats(); st.TornSegments != 0 {
				t.Fatalf("the repair did not last: %+v", st)
			}
		})
	}
}

func TestCorruptSegmentQuarantined(t *testing.T) {
	t.Parallel()
	flip := func(off int) func([]byte) []byte {
		return func(b []byte) []byte {
			b[off] ^= 1
			return b
		}
	}
	newVersion := func(b []byte) []byte {
		binary.LittleEndian.PutUint16(b[4:], 2)
		binary.LittleEndian.PutUint32(b[16:], crc32.Checksum(b[:16], crc32.MakeTable(crc32.Castagnoli)))
		return b
	}
	cases := []struct {
		name   string
		change func([]byte) []byte
		reason string // in the log
	}{
		{"payload bit flip", flip(20 + 12 + 3), "checksum"},
		{"length bit flip", flip(20 + 112 + 1), "checksum"},
		{"partition bit flip", flip(20 + 4), "checksum"},
		{"header bit flip", flip(9), "header"},
		{"trailer count", func(b []byte) []byte {
			t := b[20+5*112:]
			binary.LittleEndian.PutUint32(t[4:], 4)
			binary.LittleEndian.PutUint32(t[8:], crc32.Checksum(t[:8], crc32.MakeTable(crc32.Castagnoli)))
			return b
		}, "trailer counts 4"},
		{"format version 2", newVersion, "version 2"},
		{"bytes after the trailer", func(b []byte) []byte { return append(b, 'x') }, "after the trailer"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fsys, a, _, c := threeSegments(t)
			rewrite(t, fsys, segPath(2), tc.change)
			var log logBuffer
			s := open(t, fsys, spool.Options{Logger: log.logger()})
			wantSpool(t, s, [][]spool.Record{a, c})
			if st := s.Stats(); st.Quarantined != 1 || st.TornSegments != 0 {
				t.Fatalf("stats %+v, want one quarantined segment", st)
			}
			if l := log.String(); !strings.Contains(l, "quarantined") || !strings.Contains(l, tc.reason) || !strings.Contains(l, ".seg.bad") {
				t.Fatalf("log does not name the quarantine, its file and %q: %s", tc.reason, l)
			}
			t.Logf("logged: %s", strings.TrimSpace(log.String()))
			names := listDir(t, fsys)
			if !slices.Contains(names, path.Base(segPath(2))+".bad") {
				t.Fatalf("no quarantined file in %v", names)
			}
			// The spool goes on, and the quarantined file keeps its id.
			d := batch("d", 1, 1)
			mustAppend(t, s, d)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = open(t, fsys, spool.Options{})
			wantSpool(t, s, [][]spool.Record{a, c, d})
			if st := s.Stats(); st.Quarantined != 0 {
				t.Fatalf("reopen counted the quarantined file again: %+v", st)
			}
		})
	}
}

func TestMisnamedSegmentQuarantined(t *testing.T) {
	t.Parallel()
	fsys, a, b, c := threeSegments(t)
	one, err := fsys.ReadFile(segPath(1))
	if err != nil {
		t.Fatal(err)
	}
	// Segment 1's bytes under id 9: its header names another segment.
	if err := fsys.WriteFile(segPath(9), one); err != nil {
		t.Fatal(err)
	}
	// Files the spool does not own stay untouched.
	for _, name := range []string{"notes.txt", "1.seg", "zzzzzzzzzzzzzzzz.seg"} {
		if err := fsys.WriteFile(path.Join(dir, name), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	s := open(t, fsys, spool.Options{})
	wantSpool(t, s, [][]spool.Record{a, b, c})
	if st := s.Stats(); st.Quarantined != 1 {
		t.Fatalf("stats %+v, want one quarantined segment", st)
	}
	names := listDir(t, fsys)
	for _, name := range []string{"notes.txt", "1.seg", "zzzzzzzzzzzzzzzz.seg", path.Base(segPath(9)) + ".bad"} {
		if !slices.Contains(names, name) {
			t.Fatalf("%s missing from %v", name, names)
		}
	}
}

// TestCorruptionFoundByNext: a segment damaged after Open is quarantined when
// read, and reading goes on with the next one.
func TestCorruptionFoundByNext(t *testing.T) {
	t.Parallel()
	fsys, a, _, c := threeSegments(t)
	var log logBuffer
	s := open(t, fsys, spool.Options{Logger: log.logger()})
	rewrite(t, fsys, segPath(2), func(b []byte) []byte {
		b[40] ^= 0x80
		return b
	})
	wantSpool(t, s, [][]spool.Record{a, c})
	if st := s.Stats(); st.Quarantined != 1 {
		t.Fatalf("stats %+v, want one quarantined segment", st)
	}
	if !strings.Contains(log.String(), "quarantined") {
		t.Fatalf("not logged: %s", log.String())
	}
	// A segment file removed behind the spool's back is skipped too.
	if err := fsys.Remove(segPath(3)); err != nil {
		t.Fatal(err)
	}
	wantSpool(t, s, [][]spool.Record{a})
}

// TestLeftoverTemporaryFiles: Open removes what interrupted writes left.
func TestLeftoverTemporaryFiles(t *testing.T) {
	t.Parallel()
	fsys, a, b, c := threeSegments(t)
	for _, name := range []string{"0000000000000004.seg.tmp", "META.tmp"} {
		if err := fsys.WriteFile(path.Join(dir, name), []byte("half")); err != nil {
			t.Fatal(err)
		}
	}
	s := open(t, fsys, spool.Options{})
	wantSpool(t, s, [][]spool.Record{a, b, c})
	if _, other := segFiles(listDir(t, fsys)); len(other) != 0 {
		t.Fatalf("Open left %v", other)
	}
}
