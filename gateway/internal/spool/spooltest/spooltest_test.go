package spooltest_test

import (
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"syscall"
	"testing"

	"github.com/tollgate/tollgate/gateway/internal/spool"
	"github.com/tollgate/tollgate/gateway/internal/spool/spooltest"
)

func write(t *testing.T, fsys *spooltest.FS, name, data string, sync bool) {
	t.Helper()
	f, err := fsys.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte(data)); err != nil {
		t.Fatal(err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func syncDir(t *testing.T, fsys *spooltest.FS, name string) {
	t.Helper()
	d, err := fsys.OpenFile(name, os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	_ = d.Close()
}

func contents(t *testing.T, fsys *spooltest.FS, name string) string {
	t.Helper()
	b, err := fsys.ReadFile(name)
	if errors.Is(err, os.ErrNotExist) {
		return "<none>"
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestCrashKeepsOnlyDurableState checks the durability model the spool's
// crash tests rely on.
func TestCrashKeepsOnlyDurableState(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		setup func(t *testing.T, fsys *spooltest.FS)
		want  string // contents of /d/f after Crash(nil)
	}{
		{"file synced, directory not", func(t *testing.T, fsys *spooltest.FS) {
			write(t, fsys, "/d/f", "x", true)
		}, "<none>"},
		{"directory synced, file not", func(t *testing.T, fsys *spooltest.FS) {
			write(t, fsys, "/d/f", "x", false)
			syncDir(t, fsys, "/d")
		}, ""},
		{"both synced", func(t *testing.T, fsys *spooltest.FS) {
			write(t, fsys, "/d/f", "x", true)
			syncDir(t, fsys, "/d")
		}, "x"},
		{"rename not synced", func(t *testing.T, fsys *spooltest.FS) {
			write(t, fsys, "/d/f", "old", true)
			write(t, fsys, "/d/f.tmp", "new", true)
			syncDir(t, fsys, "/d")
			if err := fsys.Rename("/d/f.tmp", "/d/f"); err != nil {
				t.Fatal(err)
			}
		}, "old"},
		{"rename synced", func(t *testing.T, fsys *spooltest.FS) {
			write(t, fsys, "/d/f", "old", true)
			write(t, fsys, "/d/f.tmp", "new", true)
			if err := fsys.Rename("/d/f.tmp", "/d/f"); err != nil {
				t.Fatal(err)
			}
			syncDir(t, fsys, "/d")
		}, "new"},
		{"removal not synced", func(t *testing.T, fsys *spooltest.FS) {
			write(t, fsys, "/d/f", "x", true)
			syncDir(t, fsys, "/d")
			if err := fsys.Remove("/d/f"); err != nil {
				t.Fatal(err)
			}
		}, "x"},
		{"appended after sync", func(t *testing.T, fsys *spooltest.FS) {
			f, err := fsys.OpenFile("/d/f", os.O_WRONLY|os.O_CREATE, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = f.Write([]byte("ab"))
			_ = f.Sync()
			_, _ = f.Write([]byte("cd"))
			_ = f.Close()
			syncDir(t, fsys, "/d")
		}, "ab"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fsys := spooltest.New()
			if err := fsys.MkdirAll("/d", 0o755); err != nil {
				t.Fatal(err)
			}
			tc.setup(t, fsys)
			if got := contents(t, fsys.Crash(nil), "/d/f"); got != tc.want {
				t.Fatalf("after a crash /d/f holds %q, want %q", got, tc.want)
			}
		})
	}
}

// TestRandomCrashKeepsPrefixes: with a random source, a crash keeps a prefix
// of each file's unsynced appends and of each directory's operations.
func TestRandomCrashKeepsPrefixes(t *testing.T) {
	t.Parallel()
	fsys := spooltest.New()
	if err := fsys.MkdirAll("/d", 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, fsys, "/d/a", "0123456789", false)
	write(t, fsys, "/d/b", "x", false)
	seen := map[string]bool{}
	for seed := range 200 {
		after := fsys.Crash(rand.New(rand.NewPCG(uint64(seed), 1)))
		names, _ := after.ReadDir("/d")
		a := contents(t, after, "/d/a")
		if slices.Contains(names, "b") && !slices.Contains(names, "a") {
			t.Fatalf("seed %d: b's creation survived without a's, which came first", seed)
		}
		if a != "<none>" && a != "0123456789"[:len(a)] && a != string(make([]byte, len(a))) {
			t.Fatalf("seed %d: a holds %q: neither a prefix nor zeros", seed, a)
		}
		seen[a] = true
	}
	if len(seen) < 5 {
		t.Fatalf("200 crashes left only %d distinct states of a", len(seen))
	}
}

func TestFaults(t *testing.T) {
	t.Parallel()
	t.Run("FailNth", func(t *testing.T) {
		fsys := spooltest.New()
		_ = fsys.MkdirAll("/d", 0o755)
		fsys.Inject(spooltest.FailNth(spooltest.OpRename, ".tmp", 2, spooltest.ErrInjected))
		write(t, fsys, "/d/1.tmp", "", false)
		write(t, fsys, "/d/2.tmp", "", false)
		if err := fsys.Rename("/d/1.tmp", "/d/1"); err != nil {
			t.Fatalf("first rename: %v", err)
		}
		if err := fsys.Rename("/d/2.tmp", "/d/2"); !errors.Is(err, spooltest.ErrInjected) {
			t.Fatalf("second rename: %v, want ErrInjected", err)
		}
	})
	t.Run("CrashAfter", func(t *testing.T) {
		fsys := spooltest.New()
		_ = fsys.MkdirAll("/d", 0o755)
		f, err := fsys.OpenFile("/d/f", os.O_WRONLY|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		fsys.Inject(spooltest.CrashAfter(0))
		if _, err := f.Write([]byte("abcd")); !errors.Is(err, spooltest.ErrCrashed) {
			t.Fatalf("write: %v, want ErrCrashed", err)
		}
		if _, err := fsys.ReadDir("/d"); !errors.Is(err, spooltest.ErrCrashed) {
			t.Fatalf("readdir: %v, want ErrCrashed", err)
		}
		if got := contents(t, fsys, "/d/f"); got != "ab" {
			t.Fatalf("a write the process died in left %q, want its first half", got)
		}
	})
	t.Run("capacity", func(t *testing.T) {
		fsys := spooltest.New()
		_ = fsys.MkdirAll("/d", 0o755)
		fsys.SetCapacity(10)
		write(t, fsys, "/d/a", "123456", false)
		f, _ := fsys.OpenFile("/d/b", os.O_WRONLY|os.O_CREATE, 0o644)
		n, err := f.Write([]byte("abcdef"))
		if n != 4 || !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("write past capacity: %d, %v; want 4, ENOSPC", n, err)
		}
		_ = fsys.Remove("/d/a")
		if n, err := f.Write([]byte("ef")); n != 2 || err != nil {
			t.Fatalf("write after freeing space: %d, %v", n, err)
		}
	})
	t.Run("lock", func(t *testing.T) {
		fsys := spooltest.New()
		l, err := fsys.Lock("/d/LOCK")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fsys.Lock("/d/LOCK"); !errors.Is(err, spool.ErrLocked) {
			t.Fatalf("second lock: %v, want spool.ErrLocked", err)
		}
		_ = l.Close()
		_ = l.Close()
		l2, err := fsys.Lock("/d/LOCK")
		if err != nil {
			t.Fatalf("lock after release: %v", err)
		}
		var _ io.Closer = l2
		if _, err := fsys.Crash(nil).Lock("/d/LOCK"); err != nil {
			t.Fatalf("locks survived a crash: %v", err)
		}
	})
}
