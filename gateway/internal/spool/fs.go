package spool

import (
	"io"
	"io/fs"
	"os"
)

// FS is the part of a file system the spool uses: OSFS on disk, and in
// tests spooltest.FS, which keeps files in memory, models what survives a
// crash and injects faults (pebble's vfs.FS and errorfs, cut to what a spool
// needs). Paths are joined with path/filepath.
type FS interface {
	// OpenFile opens a file as os.OpenFile does. Opening a directory
	// read-only yields a File whose Sync makes the directory's entries
	// (creations, renames, removals) durable.
	OpenFile(name string, flag int, perm fs.FileMode) (File, error)
	// Rename replaces newname by oldname atomically, as rename(2).
	Rename(oldname, newname string) error
	// Remove removes a file.
	Remove(name string) error
	// ReadDir returns the names of a directory's entries, sorted.
	ReadDir(name string) ([]string, error)
	// MkdirAll creates a directory and its missing parents.
	MkdirAll(name string, perm fs.FileMode) error
	// Lock takes an exclusive lock named by the file name, held until the
	// returned Closer is closed or the process exits. When another holder
	// (another process, or another Lock in this one) has it, Lock fails at
	// once with an error matching ErrLocked.
	Lock(name string) (io.Closer, error)
}

// File is an open file of an FS. *os.File implements it.
type File interface {
	io.Reader
	io.Writer
	// WriterAt overwrites bytes at an offset (pwrite(2)), for the
	// in-place rewrite of META.
	io.WriterAt
	// Sync makes the file's data durable (fsync).
	Sync() error
	Close() error
}

// OSFS is the operating system's file system. Lock uses flock(2) on a lock
// file, which the kernel releases when the process dies, even by SIGKILL;
// it is per open file, so a second Lock in the same process also fails.
type OSFS struct{}

var _ FS = OSFS{}

// OpenFile calls os.OpenFile.
func (OSFS) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return f, nil
}

// Rename calls os.Rename.
func (OSFS) Rename(oldname, newname string) error { return os.Rename(oldname, newname) }

// Remove calls os.Remove.
func (OSFS) Remove(name string) error { return os.Remove(name) }

// ReadDir returns the names of os.ReadDir's entries.
func (OSFS) ReadDir(name string) ([]string, error) {
	ents, err := os.ReadDir(name)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(ents))
	for i, e := range ents {
		names[i] = e.Name()
	}
	return names, nil
}

// MkdirAll calls os.MkdirAll.
func (OSFS) MkdirAll(name string, perm fs.FileMode) error { return os.MkdirAll(name, perm) }

// Lock takes flock(2) on the file name, creating it, and writes this
// process's id into it so that ErrLocked can name the holder.
func (OSFS) Lock(name string) (io.Closer, error) { return lockFile(name) }
