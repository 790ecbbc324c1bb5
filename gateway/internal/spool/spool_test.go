package spool_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/gateway/internal/spool"
	"github.com/tollgate/tollgate/gateway/internal/spool/spooltest"
	"github.com/tollgate/tollgate/internal/testnet"
	"github.com/tollgate/tollgate/internal/testwait"
)

const dir = "/data/spool/gw-1"

// testFS is the file system of a test run on fsName and the spool's
// directory in it: spooltest's in memory at dir, or for "disk" the real
// one at sub below a fresh temporary directory.
func testFS(t *testing.T, fsName string, sub ...string) (spool.FS, string) {
	if fsName == "disk" {
		return spool.OSFS{}, filepath.Join(append([]string{t.TempDir()}, sub...)...)
	}
	return spooltest.New(), dir
}

// batch returns n records of about size bytes named after tag, so that a
// failed comparison says which batch and record went astray.
func batch(tag string, n, size int) []spool.Record {
	recs := make([]spool.Record, n)
	for i := range recs {
		p := fmt.Appendf(nil, "%s/%d|", tag, i)
		for len(p) < size {
			p = append(p, byte('a'+(len(p)+i)%26))
		}
		recs[i] = spool.Record{Partition: int32(i % 7), Payload: p}
	}
	return recs
}

// segSize is a segment's size by the format in the package comment.
func segSize(recs []spool.Record) int64 {
	n := int64(32)
	for _, r := range recs {
		n += 12 + int64(len(r.Payload))
	}
	return n
}

func sameRecords(a, b []spool.Record) bool {
	return slices.EqualFunc(a, b, func(x, y spool.Record) bool {
		return x.Partition == y.Partition && bytes.Equal(x.Payload, y.Payload)
	})
}

// describe names a list of batches by the tags of their first records.
func describe(batches [][]spool.Record) string {
	var parts []string
	for _, b := range batches {
		if len(b) == 0 {
			parts = append(parts, "[]")
			continue
		}
		tag, _, _ := strings.Cut(string(b[0].Payload), "|")
		parts = append(parts, fmt.Sprintf("%s×%d", tag, len(b)))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func wantSpool(t testing.TB, s *spool.Spool, want [][]spool.Record) {
	t.Helper()
	got := readAll(t, s)
	if len(got) != len(want) || !slices.EqualFunc(got, want, sameRecords) {
		t.Fatalf("spool holds %s, want %s", describe(got), describe(want))
	}
	var recs, bytes int64
	for _, b := range want {
		recs += int64(len(b))
		bytes += segSize(b)
	}
	st := s.Stats()
	if st.Segments != len(want) || st.Records != recs || st.Bytes != bytes {
		t.Fatalf("Stats %+v, want %d segments, %d records, %d bytes", st, len(want), recs, bytes)
	}
}

// readAll reads every segment from the head without removing any.
func readAll(t testing.TB, s *spool.Spool) [][]spool.Record {
	t.Helper()
	var out [][]spool.Record
	var last uint64
	for seg, err := s.Head(); ; seg, err = s.Next(seg.ID) {
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("reading after segment %d: %v", last, err)
		}
		if seg.ID <= last {
			t.Fatalf("segment %d after %d", seg.ID, last)
		}
		last = seg.ID
		out = append(out, seg.Records)
	}
}

func open(t testing.TB, fsys spool.FS, opts spool.Options) *spool.Spool {
	t.Helper()
	s, err := spool.Open(fsys, dir, opts)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// crashAfter runs op (what, a call on s) with s's file system fsys crashing
// after k operations: op must fail unless k is all the ops operations it
// takes. It closes s and returns what the crash can leave, by name: fsys
// as the process left it ("process death"), its durable state ("machine
// crash") and seeds machine crashes that also keep a random part of what
// was not yet durable; and op's error.
func crashAfter(t testing.TB, fsys *spooltest.FS, s *spool.Spool, k, ops, seeds int, what string, op func() error) (map[string]*spooltest.FS, error) {
	t.Helper()
	fsys.Inject(spooltest.CrashAfter(k))
	err := op()
	if (err == nil) != (k == ops) {
		t.Fatalf("%s crashed after %d of %d operations returned %v", what, k, ops, err)
	}
	_ = s.Close()
	fsys.Inject(nil)
	states := map[string]*spooltest.FS{"process death": fsys, "machine crash": fsys.Crash(nil)}
	for seed := range seeds {
		states[fmt.Sprint("machine crash, seed ", seed)] = fsys.Crash(rand.New(rand.NewPCG(uint64(seed), uint64(k))))
	}
	return states, err
}

func mustAppend(t testing.TB, s *spool.Spool, recs []spool.Record) {
	t.Helper()
	if err := s.Append(recs); err != nil {
		t.Fatalf("append %s: %v", describe([][]spool.Record{recs}), err)
	}
}

// logBuffer is a logger whose output a test can read.
type logBuffer struct{ testnet.Buffer }

func (l *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

// listDir returns the spool directory's file names.
func listDir(t testing.TB, fsys spool.FS) []string {
	t.Helper()
	names, err := fsys.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	return names
}

func segFiles(names []string) (segs, other []string) {
	for _, n := range names {
		switch {
		case n == "LOCK" || n == "META":
		case strings.HasSuffix(n, ".seg"):
			segs = append(segs, n)
		default:
			other = append(other, n)
		}
	}
	return segs, other
}

func TestRoundTripInOrder(t *testing.T) {
	t.Parallel()
	for _, fsName := range []string{"mem", "disk"} {
		for _, noSync := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/NoSync=%v", fsName, noSync), func(t *testing.T) {
				t.Parallel()
				fsys, d := testFS(t, fsName, "spool", "gw-1")
				s, err := spool.Open(fsys, d, spool.Options{NoSync: noSync})
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				var want [][]spool.Record
				rng := rand.New(rand.NewPCG(1, 1))
				for i := range 60 {
					b := batch(fmt.Sprint(i), 1+rng.IntN(40), rng.IntN(300))
					if i == 7 {
						b = append(b, spool.Record{Partition: 3}, spool.Record{Partition: -1, Payload: []byte{}})
					}
					mustAppend(t, s, b)
					want = append(want, b)
				}
				if err := s.Append(nil); err != nil {
					t.Fatalf("append of nothing: %v", err)
				}
				wantSpool(t, s, want)
				// Remove from the head, as a producer does, checking the
				// rest each time.
				for len(want) > 0 {
					seg, err := s.Head()
					if err != nil {
						t.Fatal(err)
					}
					if !sameRecords(seg.Records, want[0]) {
						t.Fatalf("head %s, want %s", describe([][]spool.Record{seg.Records}), describe(want[:1]))
					}
					if err := s.Remove(seg.ID); err != nil {
						t.Fatal(err)
					}
					want = want[1:]
					if len(want)%16 == 0 {
						wantSpool(t, s, want)
					}
				}
				if _, err := s.Head(); !errors.Is(err, io.EOF) {
					t.Fatalf("head of an empty spool: %v, want io.EOF", err)
				}
			})
		}
	}
}

func TestReopenRecoversInOrder(t *testing.T) {
	t.Parallel()
	fsys := spooltest.New()
	s := open(t, fsys, spool.Options{})
	var want [][]spool.Record
	for i := range 20 {
		b := batch(fmt.Sprint(i), 1+i, 150)
		mustAppend(t, s, b)
		want = append(want, b)
	}
	first, _ := s.Head()
	if err := s.Remove(first.ID); err != nil {
		t.Fatal(err)
	}
	want = want[1:]
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = open(t, fsys, spool.Options{})
	wantSpool(t, s, want)
	if st := s.Stats(); st.TornSegments != 0 || st.Quarantined != 0 {
		t.Fatalf("clean reopen: %+v", st)
	}
	b := batch("after-reopen", 3, 10)
	mustAppend(t, s, b)
	want = append(want, b)
	wantSpool(t, s, want)
}

func TestRemove(t *testing.T) {
	t.Parallel()
	s := open(t, spooltest.New(), spool.Options{})
	a, b, c := batch("a", 2, 10), batch("b", 2, 10), batch("c", 2, 10)
	for _, x := range [][]spool.Record{a, b, c} {
		mustAppend(t, s, x)
	}
	head, _ := s.Head()
	mid, _ := s.Next(head.ID)
	if err := s.Remove(mid.ID); err != nil {
		t.Fatal(err)
	}
	wantSpool(t, s, [][]spool.Record{a, c})
	if err := s.Remove(mid.ID); !errors.Is(err, spool.ErrNoSegment) {
		t.Fatalf("second remove: %v, want ErrNoSegment", err)
	}
	// A segment read before its removal stays the caller's.
	if !sameRecords(mid.Records, b) {
		t.Fatal("a removed segment's records changed")
	}
}

func TestClose(t *testing.T) {
	t.Parallel()
	fsys := spooltest.New()
	s := open(t, fsys, spool.Options{})
	mustAppend(t, s, batch("x", 1, 1))
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if err := s.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
		})
	}
	wg.Wait()
	checks := map[string]error{
		"append":     s.Append(batch("y", 1, 1)),
		"remove":     s.Remove(1),
		"write meta": s.WriteMeta(nil),
	}
	_, checks["head"] = s.Head()
	_, checks["read meta"] = s.ReadMeta()
	for op, err := range checks {
		if !errors.Is(err, spool.ErrClosed) {
			t.Errorf("%s after close: %v, want ErrClosed", op, err)
		}
	}
	// The lock is released: the directory opens again.
	s2 := open(t, fsys, spool.Options{})
	wantSpool(t, s2, [][]spool.Record{batch("x", 1, 1)})
}

func TestOpenOptions(t *testing.T) {
	t.Parallel()
	if _, err := spool.Open(spooltest.New(), dir, spool.Options{MaxBytes: -1}); err == nil {
		t.Fatal("negative MaxBytes accepted")
	}
	// A file where the directory should be.
	fsys := spooltest.New()
	if err := fsys.MkdirAll("/data", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := fsys.WriteFile("/data/spool", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := spool.Open(fsys, dir, spool.Options{}); err == nil || !strings.Contains(err.Error(), dir) {
		t.Fatalf("open under a file: %v, want an error naming %s", err, dir)
	}
}

func TestLockedInProcess(t *testing.T) {
	t.Parallel()
	for _, fsName := range []string{"mem", "disk"} {
		t.Run(fsName, func(t *testing.T) {
			t.Parallel()
			fsys, d := testFS(t, fsName)
			s, err := spool.Open(fsys, d, spool.Options{})
			if err != nil {
				t.Fatal(err)
			}
			_, err = spool.Open(fsys, d, spool.Options{})
			if !errors.Is(err, spool.ErrLocked) || !strings.Contains(err.Error(), d) {
				t.Fatalf("second open: %v, want ErrLocked naming %s", err, d)
			}
			t.Logf("second open: %v", err)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			// A flock belongs to the open file description: a process
			// another test forks in the instant the lock file is open
			// holds it too until it execs (close-on-exec), so the lock can
			// outlive Close by that long.
			testwait.Eventually(t, 2*time.Second, func() error {
				s, err = spool.Open(fsys, d, spool.Options{})
				if err != nil {
					return fmt.Errorf("open after close: %w", err)
				}
				return nil
			})
			_ = s.Close()
		})
	}
}

func TestBudget(t *testing.T) {
	t.Parallel()
	a, b, c := batch("a", 10, 150), batch("b", 10, 150), batch("c", 10, 150)
	budget := segSize(a) + segSize(b) + segSize(c) - 1
	fsys := spooltest.New()
	s := open(t, fsys, spool.Options{MaxBytes: budget})
	mustAppend(t, s, a)
	mustAppend(t, s, b)
	err := s.Append(c)
	if !errors.Is(err, spool.ErrFull) {
		t.Fatalf("append past MaxBytes: %v, want ErrFull", err)
	}
	t.Logf("append past MaxBytes: %v", err)
	if segs, other := segFiles(listDir(t, fsys)); len(segs) != 2 || len(other) != 0 {
		t.Fatalf("after ErrFull the directory holds %v and %v", segs, other)
	}
	wantSpool(t, s, [][]spool.Record{a, b})
	if err := s.Append(batch("huge", 1, int(budget))); !errors.Is(err, spool.ErrFull) {
		t.Fatalf("a segment larger than MaxBytes: %v, want ErrFull", err)
	}

	// Space freed by Remove is usable again.
	head, _ := s.Head()
	if err := s.Remove(head.ID); err != nil {
		t.Fatal(err)
	}
	mustAppend(t, s, c)
	wantSpool(t, s, [][]spool.Record{b, c})
}

func TestDiskFull(t *testing.T) {
	t.Parallel()
	a, b := batch("a", 10, 150), batch("b", 10, 150)
	fsys := spooltest.New()
	s := open(t, fsys, spool.Options{})
	mustAppend(t, s, a)
	fsys.SetCapacity(fsys.Usage() + segSize(b) - 100)
	err := s.Append(b)
	if !errors.Is(err, spool.ErrFull) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("append to a full disk: %v, want ErrFull and ENOSPC", err)
	}
	t.Logf("append to a full disk: %v", err)
	if segs, other := segFiles(listDir(t, fsys)); len(segs) != 1 || len(other) != 0 {
		t.Fatalf("after ENOSPC the directory holds %v and %v", segs, other)
	}
	if got, want := fsys.Usage(), segSize(a); got != want {
		t.Fatalf("after ENOSPC the disk holds %d bytes, want %d: the partial file stayed", got, want)
	}
	wantSpool(t, s, [][]spool.Record{a})
	fsys.SetCapacity(0)
	mustAppend(t, s, b)
	wantSpool(t, s, [][]spool.Record{a, b})
}

// TestFailedAppend fails each step of an Append in turn: the error reaches
// the caller, no file of the segment stays, the spool (open and reopened)
// holds exactly what it held before, and the next Append works.
func TestFailedAppend(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		kind   spooltest.OpKind
		suffix string
	}{
		{"create temp", spooltest.OpOpen, ".tmp"},
		{"write", spooltest.OpWrite, ".tmp"},
		{"sync file", spooltest.OpSync, ".tmp"},
		{"close", spooltest.OpClose, ".tmp"},
		{"rename", spooltest.OpRename, ".tmp"},
		{"open directory", spooltest.OpOpen, "gw-1"},
		{"sync directory", spooltest.OpSync, "gw-1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a, b, c := batch("a", 5, 100), batch("b", 5, 100), batch("c", 5, 100)
			fsys := spooltest.New()
			s := open(t, fsys, spool.Options{})
			mustAppend(t, s, a)
			fsys.Inject(spooltest.FailNth(tc.kind, tc.suffix, 1, spooltest.ErrInjected))
			err := s.Append(b)
			fsys.Inject(nil)
			if !errors.Is(err, spooltest.ErrInjected) {
				t.Fatalf("append: %v, want the injected error", err)
			}
			if errors.Is(err, spool.ErrFull) {
				t.Fatalf("an I/O error matches ErrFull: %v", err)
			}
			if segs, other := segFiles(listDir(t, fsys)); len(segs) != 1 || len(other) != 0 {
				t.Fatalf("after a failed append the directory holds %v and %v", segs, other)
			}
			wantSpool(t, s, [][]spool.Record{a})
			mustAppend(t, s, c)
			wantSpool(t, s, [][]spool.Record{a, c})
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			wantSpool(t, open(t, fsys, spool.Options{}), [][]spool.Record{a, c})
			wantSpool(t, open(t, fsys.Crash(nil), spool.Options{}), [][]spool.Record{a, c})
		})
	}
}

// TestCrashDuringAppend stops the process at every operation of an Append
// in turn, then reopens the spool as a restart after the process's death
// (the same FS) and after a machine crash (Crash, with and without random
// survival of unsynced state): the segment is there whole or not at all,
// and the segments before it are intact.
func TestCrashDuringAppend(t *testing.T) {
	t.Parallel()
	before := [][]spool.Record{batch("a", 5, 100), batch("b", 1, 0), batch("c", 30, 150)}
	d := batch("d", 20, 150)
	setup := func(t *testing.T) (*spooltest.FS, *spool.Spool) {
		fsys := spooltest.New()
		s := open(t, fsys, spool.Options{})
		for _, b := range before {
			mustAppend(t, s, b)
		}
		return fsys, s
	}
	fsys, s := setup(t)
	start := fsys.Ops()
	mustAppend(t, s, d)
	ops := int(fsys.Ops() - start)
	_ = s.Close()
	t.Logf("an Append takes %d operations", ops)

	for k := range ops + 1 {
		t.Run(fmt.Sprint("after ", k), func(t *testing.T) {
			t.Parallel()
			fsys, s := setup(t)
			states, appendErr := crashAfter(t, fsys, s, k, ops, 8, "append", func() error { return s.Append(d) })
			for name, after := range states {
				s, err := spool.Open(after, dir, spool.Options{})
				if err != nil {
					t.Fatalf("%s: open: %v", name, err)
				}
				got := readAll(t, s)
				st := s.Stats()
				_ = s.Close()
				with := append(slices.Clone(before), d)
				switch {
				case slices.EqualFunc(got, before, sameRecords):
				case slices.EqualFunc(got, with, sameRecords):
				default:
					t.Fatalf("%s: spool holds %s, want %s or %s", name, describe(got), describe(before), describe(with))
				}
				if appendErr == nil && len(got) != len(with) {
					t.Fatalf("%s: an Append that returned nil was lost", name)
				}
				if st.TornSegments != 0 || st.Quarantined != 0 {
					t.Fatalf("%s: synced appends left damage: %+v", name, st)
				}
				if _, other := segFiles(listDir(t, after)); len(other) != 0 {
					t.Fatalf("%s: Open left %v", name, other)
				}
			}
		})
	}
}

// TestCrashWithoutSync: under NoSync a machine crash may lose or cut the
// newest segments, but what Open returns is always, segment by segment, an
// intact prefix of what was appended, in order: never garbage.
func TestCrashWithoutSync(t *testing.T) {
	t.Parallel()
	var torn, lost int
	for seed := range 200 {
		fsys := spooltest.New()
		s, err := spool.Open(fsys, dir, spool.Options{NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		var appended [][]spool.Record
		for i := range 4 {
			b := batch(fmt.Sprintf("%d.%d", seed, i), 1+i*5, 20+i*40)
			mustAppend(t, s, b)
			appended = append(appended, b)
		}
		after := fsys.Crash(rand.New(rand.NewPCG(uint64(seed), 99)))
		_ = s.Close()
		s2, err := spool.Open(after, dir, spool.Options{NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		got := readAll(t, s2)
		st := s2.Stats()
		_ = s2.Close()
		next := 0
		for _, g := range got {
			// Find the appended segment g is a prefix of, after the last.
			for next < len(appended) && !(len(g) <= len(appended[next]) && sameRecords(g, appended[next][:len(g)])) {
				next++
				lost++
			}
			if next == len(appended) || len(g) == 0 {
				t.Fatalf("seed %d: recovered %s from %s", seed, describe(got), describe(appended))
			}
			next++
		}
		if st.Quarantined != 0 {
			t.Fatalf("seed %d: a crash's damage was quarantined: %+v", seed, st)
		}
		torn += int(st.TornSegments)
		// A second reopen finds the repairs durable and nothing more to do.
		s3, err := spool.Open(after, dir, spool.Options{NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		if again := readAll(t, s3); !slices.EqualFunc(again, got, sameRecords) || s3.Stats().TornSegments != 0 {
			t.Fatalf("seed %d: second reopen read %s after %s, stats %+v", seed, describe(again), describe(got), s3.Stats())
		}
		_ = s3.Close()
	}
	t.Logf("200 crashes: %d torn segments repaired, %d segments lost", torn, lost)
	if torn == 0 {
		t.Fatal("no crash tore a segment: the test does not reach the repair")
	}
}

// TestFailedRemove: a removal that fails leaves the segment in the spool; one
// whose only failure is the directory sync has removed it (and says so with
// its error).
func TestFailedRemove(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		kind   spooltest.OpKind
		suffix string
		gone   bool
	}{
		{"remove", spooltest.OpRemove, ".seg", false},
		{"sync directory", spooltest.OpSync, "gw-1", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a, b := batch("a", 2, 10), batch("b", 2, 10)
			fsys := spooltest.New()
			s := open(t, fsys, spool.Options{})
			mustAppend(t, s, a)
			mustAppend(t, s, b)
			head, _ := s.Head()
			fsys.Inject(spooltest.FailNth(tc.kind, tc.suffix, 1, spooltest.ErrInjected))
			err := s.Remove(head.ID)
			fsys.Inject(nil)
			if !errors.Is(err, spooltest.ErrInjected) {
				t.Fatalf("remove: %v, want the injected error", err)
			}
			want := [][]spool.Record{a, b}
			if tc.gone {
				want = want[1:]
			}
			wantSpool(t, s, want)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			wantSpool(t, open(t, fsys, spool.Options{}), want)
		})
	}
}
