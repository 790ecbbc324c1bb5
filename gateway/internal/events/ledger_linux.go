//go:build linux

package events

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"unsafe"
)

// tmpfsMagic is statfs's f_type of tmpfs (linux/magic.h).
const tmpfsMagic = 0x01021994

// ledger is an open, locked ledger file.
type ledger struct {
	f    *os.File
	path string
	mem  []byte // mapped once started
	// words is mem as 64-bit words.
	words []uint64
	// prev is what an earlier run left in the file; prevOK false: nothing
	// usable.
	prev   ledgerState
	prevOK bool
}

// openLedger opens (creating) the ledger of spoolDir in dir and locks it,
// and reads what an earlier run left in it. It neither changes the file
// nor maps it: start does, once the spool's META holds the earlier run's
// numbers. dir must be on tmpfs: a page of tmpfs,
// once written, never needs disk space, so a store into it cannot fault
// on a full disk, and the file is gone after a reboot, when it could be
// stale.
func openLedger(dir, spoolDir string) (*ledger, error) {
	var fs syscall.Statfs_t
	if err := syscall.Statfs(dir, &fs); err != nil {
		return nil, fmt.Errorf("events: sequence ledger: %w", err)
	}
	if fs.Type != tmpfsMagic {
		return nil, fmt.Errorf("events: sequence ledger: %s is not tmpfs", dir)
	}
	path := ledgerPath(dir, spoolDir)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("events: sequence ledger: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("events: sequence ledger %s: lock: %w", path, err)
	}
	l := &ledger{f: f, path: path}
	b := make([]byte, 64<<10)
	n, err := f.ReadAt(b, 0)
	if err != nil && n == 0 && !errors.Is(err, io.EOF) {
		l.close(false)
		return nil, fmt.Errorf("events: sequence ledger %s: read: %w", path, err)
	}
	l.prev, l.prevOK = decodeLedger(b[:n])
	return l, nil
}

// counters maps the ledger for parts partitions and returns its counters
// (the next number of each; the slice is the file's memory), all 0 and
// naming no epoch yet: fill them, then begin.
func (l *ledger) counters(parts int32) ([]uint64, error) {
	size := 8 * (ledgerHeader + int(parts))
	page := os.Getpagesize()
	size = (size + page - 1) / page * page
	// Written, not only sized: tmpfs takes the pages now (or says it is
	// full now) rather than at a store of the decision path.
	if _, err := l.f.WriteAt(make([]byte, size), 0); err != nil {
		return nil, fmt.Errorf("events: sequence ledger %s: %w", l.path, err)
	}
	mem, err := syscall.Mmap(int(l.f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("events: sequence ledger %s: map: %w", l.path, err)
	}
	l.mem = mem
	l.words = unsafe.Slice((*uint64)(unsafe.Pointer(&mem[0])), size/8)
	l.words[0], l.words[2] = ledgerMagic, uint64(parts)
	return l.words[ledgerHeader : ledgerHeader+int(parts) : ledgerHeader+int(parts)], nil
}

// begin names epoch in the ledger, once its counters are filled: last, so
// that a file cut short names no epoch.
func (l *ledger) begin(epoch uint64) { l.words[1] = epoch }

// close unmaps and unlocks the ledger, deleting the file when remove (a
// graceful stop recorded the numbers used in META). Nothing may use the
// slice start returned afterwards.
func (l *ledger) close(remove bool) {
	if l == nil {
		return
	}
	if l.mem != nil {
		_ = syscall.Munmap(l.mem)
		l.mem, l.words = nil, nil
	}
	if remove {
		_ = os.Remove(l.path)
	}
	_ = l.f.Close()
}
