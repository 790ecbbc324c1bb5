// Package spooltest provides an in-memory spool.FS for tests of the spool and
// of its callers: it keeps what a crash would keep apart from what it would
// lose, fills up like a disk, and fails chosen operations (in the manner of
// pebble's vfs.NewCrashableMem and vfs/errorfs).
//
// Durability model: a file's data is durable up to its last Sync; a
// directory's entries (creations, renames, removals) are durable up to the
// last Sync of the directory, opened read-only with OpenFile. Crash returns
// the file system a machine would find after losing power: by default only
// the durable state, or, given a random source, the durable state plus a
// random prefix of each directory's later operations and of each file's
// unsynced appends (sometimes as zeros: the size reached the disk, the data
// did not); of a file rewritten in place since its last Sync, each 512-byte
// sector holds its old or its new bytes. Directories are durable once created, a simplification: the
// spool never relies on creating one. A process's death (SIGKILL) loses
// nothing of what it wrote: model it by reopening the same FS after making
// every later operation fail (CrashAfter) instead.
//
// All methods are safe for concurrent use.
package spooltest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/tollgate/tollgate/gateway/internal/spool"
)

// Errors the FS injects.
var (
	// ErrInjected is the error of a FailNth fault.
	ErrInjected = errors.New("spooltest: injected fault")
	// ErrCrashed is returned by every operation after CrashAfter's budget.
	ErrCrashed = errors.New("spooltest: crashed")
)

// OpKind names an operation of the FS or of one of its files.
type OpKind int

// The operations an Injector sees.
const (
	OpOpen     OpKind = iota // FS.OpenFile
	OpRead                   // File.Read
	OpWrite                  // File.Write
	OpSync                   // File.Sync, of a file or a directory
	OpClose                  // File.Close
	OpRename                 // FS.Rename; Op.Path is the old name
	OpRemove                 // FS.Remove
	OpReadDir                // FS.ReadDir
	OpMkdirAll               // FS.MkdirAll
	OpLock                   // FS.Lock
)

var opNames = [...]string{"open", "read", "write", "sync", "close", "rename", "remove", "readdir", "mkdirall", "lock"}

func (k OpKind) String() string {
	if int(k) < len(opNames) {
		return opNames[k]
	}
	return fmt.Sprintf("op(%d)", int(k))
}

// Op is one operation, as an Injector sees it before it happens.
type Op struct {
	Kind OpKind
	Path string // cleaned, slash-separated
}

// Injector decides whether an operation fails, and with what error; nil lets
// it happen. The FS calls it with its lock held, one operation at a time.
type Injector func(Op) error

// FailNth fails the nth operation (counting from 1) of the given kind whose
// path ends with suffix ("" for any), with err; the others go through.
func FailNth(kind OpKind, suffix string, n int, err error) Injector {
	seen := 0
	return func(op Op) error {
		if op.Kind != kind || !strings.HasSuffix(op.Path, suffix) {
			return nil
		}
		seen++
		if seen == n {
			return err
		}
		return nil
	}
}

// CrashAfter lets n operations through and fails every later one with
// ErrCrashed: the process died there. A Write it fails writes the first half
// of its buffer first, as a process killed inside write(2) can. Crash then
// gives what survived a machine crash at that point; the FS itself is what
// survives the process's death.
func CrashAfter(n int) Injector {
	seen := 0
	return func(op Op) error {
		seen++
		if seen > n {
			return fmt.Errorf("%s %s: %w", op.Kind, op.Path, ErrCrashed)
		}
		return nil
	}
}

// FS is an in-memory spool.FS. The zero value is not usable: call New.
type FS struct {
	mu       sync.Mutex
	root     *node
	locks    map[string]bool
	inject   Injector
	capacity int64
	ops      int64
}

var _ spool.FS = (*FS)(nil)

// node is a file or a directory.
type node struct {
	isDir bool
	// A file's current and durable bytes.
	data, synced []byte
	// A directory's current and durable entries, and the operations since
	// its last sync, oldest first.
	children, durable map[string]*node
	pending           []dirOp
}

// dirOp is one change of a directory's entries: name now refers to n, or
// no longer exists if n is nil; from, if set, no longer exists (a rename).
type dirOp struct {
	name, from string
	n          *node
}

func newDir() *node {
	return &node{isDir: true, children: map[string]*node{}, durable: map[string]*node{}}
}

// New returns an empty FS of unlimited capacity.
func New() *FS { return &FS{root: newDir(), locks: map[string]bool{}} }

// Inject installs inj (nil removes it), replacing any earlier one.
func (f *FS) Inject(inj Injector) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inject = inj
}

// SetCapacity makes writes fail with ENOSPC, after writing what fits, once
// the files' bytes would exceed n; removing files frees space. 0: unlimited.
func (f *FS) SetCapacity(n int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.capacity = n
}

// Ops returns how many operations the FS has been asked for, failed ones
// included: a test counts an Append's operations with it, then crashes at
// each of them in turn.
func (f *FS) Ops() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ops
}

// Usage returns the bytes of all files.
func (f *FS) Usage() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return usage(f.root)
}

func usage(d *node) int64 {
	var n int64
	for _, c := range d.children {
		if c.isDir {
			n += usage(c)
		} else {
			n += int64(len(c.data))
		}
	}
	return n
}

// check counts an operation and asks the injector about it; f.mu is held.
func (f *FS) check(kind OpKind, p string) error {
	f.ops++
	if f.inject == nil {
		return nil
	}
	if err := f.inject(Op{Kind: kind, Path: p}); err != nil {
		return &fs.PathError{Op: kind.String(), Path: p, Err: err}
	}
	return nil
}

func clean(name string) string { return path.Clean("/" + filepath.ToSlash(name)) }

// lookup returns the node at p, or nil.
func (f *FS) lookup(p string) *node {
	n := f.root
	if p == "/" {
		return n
	}
	for _, part := range strings.Split(p[1:], "/") {
		if !n.isDir {
			return nil
		}
		n = n.children[part]
		if n == nil {
			return nil
		}
	}
	return n
}

// parent returns the directory holding p and p's base name.
func (f *FS) parent(p string) (*node, string, error) {
	dir, base := path.Split(p)
	d := f.lookup(path.Clean(dir))
	if d == nil || !d.isDir {
		return nil, "", fs.ErrNotExist
	}
	return d, base, nil
}

func (d *node) set(name string, n *node) {
	d.children[name] = n
	d.pending = append(d.pending, dirOp{name: name, n: n})
}

func (d *node) unset(name string) {
	delete(d.children, name)
	d.pending = append(d.pending, dirOp{name: name})
}

// OpenFile implements spool.FS. It honours O_CREATE, O_EXCL, O_TRUNC,
// O_APPEND and the access mode.
func (f *FS) OpenFile(name string, flag int, perm fs.FileMode) (spool.File, error) {
	p := clean(name)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check(OpOpen, p); err != nil {
		return nil, err
	}
	n := f.lookup(p)
	switch {
	case n != nil && flag&(os.O_CREATE|os.O_EXCL) == os.O_CREATE|os.O_EXCL:
		return nil, &fs.PathError{Op: "open", Path: p, Err: fs.ErrExist}
	case n != nil && n.isDir:
		if flag&(os.O_WRONLY|os.O_RDWR) != 0 {
			return nil, &fs.PathError{Op: "open", Path: p, Err: syscall.EISDIR}
		}
	case n == nil && flag&os.O_CREATE == 0:
		return nil, &fs.PathError{Op: "open", Path: p, Err: fs.ErrNotExist}
	case n == nil:
		d, base, err := f.parent(p)
		if err != nil {
			return nil, &fs.PathError{Op: "open", Path: p, Err: err}
		}
		n = &node{}
		d.set(base, n)
	}
	if !n.isDir && flag&os.O_TRUNC != 0 {
		n.data = nil
	}
	return &file{fs: f, n: n, path: p, flag: flag}, nil
}

// Rename implements spool.FS.
func (f *FS) Rename(oldname, newname string) error {
	op, np := clean(oldname), clean(newname)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check(OpRename, op); err != nil {
		return err
	}
	od, obase, err := f.parent(op)
	if err != nil {
		return &fs.PathError{Op: "rename", Path: op, Err: err}
	}
	n := od.children[obase]
	if n == nil {
		return &fs.PathError{Op: "rename", Path: op, Err: fs.ErrNotExist}
	}
	nd, nbase, err := f.parent(np)
	if err != nil {
		return &fs.PathError{Op: "rename", Path: np, Err: err}
	}
	if od == nd && obase == nbase {
		return nil // rename(2) of a file onto itself does nothing
	}
	if od == nd {
		// One atomic operation of the directory.
		od.children[nbase] = n
		delete(od.children, obase)
		od.pending = append(od.pending, dirOp{name: nbase, from: obase, n: n})
		return nil
	}
	nd.set(nbase, n)
	od.unset(obase)
	return nil
}

// Remove implements spool.FS.
func (f *FS) Remove(name string) error {
	p := clean(name)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check(OpRemove, p); err != nil {
		return err
	}
	d, base, err := f.parent(p)
	if err != nil || d.children[base] == nil {
		return &fs.PathError{Op: "remove", Path: p, Err: fs.ErrNotExist}
	}
	if c := d.children[base]; c.isDir && len(c.children) > 0 {
		return &fs.PathError{Op: "remove", Path: p, Err: syscall.ENOTEMPTY}
	}
	d.unset(base)
	return nil
}

// ReadDir implements spool.FS.
func (f *FS) ReadDir(name string) ([]string, error) {
	p := clean(name)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check(OpReadDir, p); err != nil {
		return nil, err
	}
	d := f.lookup(p)
	if d == nil || !d.isDir {
		return nil, &fs.PathError{Op: "readdir", Path: p, Err: fs.ErrNotExist}
	}
	names := make([]string, 0, len(d.children))
	for n := range d.children {
		names = append(names, n)
	}
	slices.Sort(names)
	return names, nil
}

// MkdirAll implements spool.FS. New directories are durable at once.
func (f *FS) MkdirAll(name string, perm fs.FileMode) error {
	p := clean(name)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check(OpMkdirAll, p); err != nil {
		return err
	}
	d := f.root
	if p == "/" {
		return nil
	}
	for _, part := range strings.Split(p[1:], "/") {
		c := d.children[part]
		if c == nil {
			c = newDir()
			d.children[part] = c
			d.durable[part] = c
		} else if !c.isDir {
			return &fs.PathError{Op: "mkdir", Path: p, Err: syscall.ENOTDIR}
		}
		d = c
	}
	return nil
}

// Lock implements spool.FS: one holder per name in this FS.
func (f *FS) Lock(name string) (io.Closer, error) {
	p := clean(name)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check(OpLock, p); err != nil {
		return nil, err
	}
	if f.locks[p] {
		return nil, fmt.Errorf("lock %s: %w", p, spool.ErrLocked)
	}
	f.locks[p] = true
	return &lock{fs: f, path: p}, nil
}

type lock struct {
	fs   *FS
	path string
	once sync.Once
}

func (l *lock) Close() error {
	l.once.Do(func() {
		l.fs.mu.Lock()
		defer l.fs.mu.Unlock()
		delete(l.fs.locks, l.path)
	})
	return nil
}

// ReadFile returns a copy of a file's current bytes.
func (f *FS) ReadFile(name string) ([]byte, error) {
	p := clean(name)
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.lookup(p)
	if n == nil || n.isDir {
		return nil, &fs.PathError{Op: "read", Path: p, Err: fs.ErrNotExist}
	}
	return bytes.Clone(n.data), nil
}

// WriteFile creates or replaces a file, durably, without the injector: tests
// plant damaged files with it.
func (f *FS) WriteFile(name string, data []byte) error {
	p := clean(name)
	f.mu.Lock()
	defer f.mu.Unlock()
	d, base, err := f.parent(p)
	if err != nil {
		return &fs.PathError{Op: "write", Path: p, Err: err}
	}
	n := &node{data: bytes.Clone(data), synced: bytes.Clone(data)}
	d.children[base] = n
	d.durable[base] = n
	return nil
}

// Crash returns a new FS holding what a machine crash would leave of f: the
// durable state if rng is nil, otherwise the durable state plus a random
// part of what was not yet durable (see the package comment). The new FS has
// no locks, no injector and no capacity limit; f is unchanged.
func (f *FS) Crash(rng *rand.Rand) *FS {
	f.mu.Lock()
	defer f.mu.Unlock()
	return &FS{root: crashDir(f.root, rng), locks: map[string]bool{}}
}

func crashDir(d *node, rng *rand.Rand) *node {
	entries := make(map[string]*node, len(d.durable))
	for name, n := range d.durable {
		entries[name] = n
	}
	if rng != nil && len(d.pending) > 0 {
		for _, op := range d.pending[:rng.IntN(len(d.pending)+1)] {
			if op.from != "" {
				delete(entries, op.from)
			}
			if op.n == nil {
				delete(entries, op.name)
			} else {
				entries[op.name] = op.n
			}
		}
	}
	out := newDir()
	for name, n := range entries {
		var c *node
		if n.isDir {
			c = crashDir(n, rng)
		} else {
			data := crashData(n, rng)
			c = &node{data: data, synced: bytes.Clone(data)}
		}
		out.children[name] = c
		out.durable[name] = c
	}
	return out
}

func crashData(n *node, rng *rand.Rand) []byte {
	if rng == nil {
		return bytes.Clone(n.synced)
	}
	if bytes.HasPrefix(n.data, n.synced) {
		extra := n.data[len(n.synced):]
		k := rng.IntN(len(extra) + 1)
		out := append(bytes.Clone(n.synced), extra[:k]...)
		if k > 0 && rng.IntN(4) == 0 {
			clear(out[len(n.synced):])
		}
		return out
	}
	// Rewritten since its last sync (in place, or truncated and written
	// again): the old size or the new, and each sector the old bytes or
	// the new ones (zeros where the one chosen has none).
	size := len(n.synced)
	if rng.IntN(2) == 0 {
		size = len(n.data)
	}
	out := make([]byte, size)
	for off := 0; off < size; off += sector {
		src := n.synced
		if rng.IntN(2) == 0 {
			src = n.data
		}
		if off < len(src) {
			copy(out[off:min(off+sector, size)], src[off:])
		}
	}
	return out
}

// sector is the unit a crash keeps or loses of a rewritten file.
const sector = 512

// file is an open file or directory.
type file struct {
	fs     *FS
	n      *node
	path   string
	flag   int
	pos    int
	closed bool
}

func (h *file) Read(p []byte) (int, error) {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if err := h.usable(OpRead); err != nil {
		return 0, err
	}
	if h.n.isDir || h.flag&os.O_WRONLY != 0 {
		return 0, &fs.PathError{Op: "read", Path: h.path, Err: syscall.EBADF}
	}
	if h.pos >= len(h.n.data) {
		return 0, io.EOF
	}
	n := copy(p, h.n.data[h.pos:])
	h.pos += n
	return n, nil
}

func (h *file) Write(p []byte) (int, error) {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if err := h.usable(OpWrite); err != nil {
		if errors.Is(err, ErrCrashed) && !h.closed && !h.n.isDir {
			// The process died inside write(2), which had copied
			// the first half of the buffer.
			_, _ = h.write(p[:len(p)/2])
		}
		return 0, err
	}
	return h.write(p)
}

// WriteAt writes p at offset off, as pwrite(2): the file's position does
// not move. Overwriting bytes the file has takes no capacity.
func (h *file) WriteAt(p []byte, off int64) (int, error) {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if err := h.usable(OpWrite); err != nil {
		if errors.Is(err, ErrCrashed) && !h.closed && !h.n.isDir && off >= 0 {
			_, _ = h.writeAt(p[:len(p)/2], int(off))
		}
		return 0, err
	}
	if off < 0 || h.flag&os.O_APPEND != 0 {
		return 0, &fs.PathError{Op: "writeat", Path: h.path, Err: syscall.EINVAL}
	}
	return h.writeAt(p, int(off))
}

// write writes p at h's position; h.fs.mu is held.
func (h *file) write(p []byte) (int, error) {
	if h.flag&os.O_APPEND != 0 {
		h.pos = len(h.n.data)
	}
	n, err := h.writeAt(p, h.pos)
	h.pos += n
	return n, err
}

// writeAt writes p at off, growing the file within the FS's capacity;
// h.fs.mu is held.
func (h *file) writeAt(p []byte, off int) (int, error) {
	if h.n.isDir || h.flag&(os.O_WRONLY|os.O_RDWR) == 0 {
		return 0, &fs.PathError{Op: "write", Path: h.path, Err: syscall.EBADF}
	}
	want, err := len(p), error(nil)
	if c := h.fs.capacity; c > 0 {
		grow := int64(max(0, off+len(p)-len(h.n.data)))
		if free := c - usage(h.fs.root); grow > free {
			p = p[:max(0, int64(len(p))-(grow-max(free, 0)))]
			err = &fs.PathError{Op: "write", Path: h.path, Err: syscall.ENOSPC}
		}
	}
	if end := off + len(p); end > len(h.n.data) {
		h.n.data = append(h.n.data, make([]byte, end-len(h.n.data))...)
	}
	copy(h.n.data[off:], p)
	if err == nil && len(p) < want {
		err = io.ErrShortWrite
	}
	return len(p), err
}

func (h *file) Sync() error {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if err := h.usable(OpSync); err != nil {
		return err
	}
	if h.n.isDir {
		clear(h.n.durable)
		for name, c := range h.n.children {
			h.n.durable[name] = c
		}
		h.n.pending = nil
		return nil
	}
	h.n.synced = bytes.Clone(h.n.data)
	return nil
}

func (h *file) Close() error {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if err := h.usable(OpClose); err != nil {
		return err
	}
	h.closed = true
	return nil
}

// usable counts an operation on h and fails it if h is closed or the
// injector says so; h.fs.mu is held.
func (h *file) usable(kind OpKind) error {
	if h.closed {
		return &fs.PathError{Op: kind.String(), Path: h.path, Err: fs.ErrClosed}
	}
	return h.fs.check(kind, h.path)
}
