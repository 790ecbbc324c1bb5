package spool

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// Errors returned by the spool, wrapped with the operation; match them with
// errors.Is.
var (
	// ErrLocked: another Spool, in this process or another, has the
	// directory open. Open's error names the directory (and the holder's pid
	// where the lock file has it).
	ErrLocked = errors.New("spool: directory is locked by another spool")
	// ErrFull: Append did not write the segment because it would take the
	// spool past Options.MaxBytes, or because the disk is full (the error
	// then also matches syscall.ENOSPC or syscall.EDQUOT). Nothing of the
	// segment is in the spool: the caller counts its records as lost, or
	// keeps them and tries again once Remove has freed space.
	ErrFull = errors.New("spool: full")
	// ErrCorrupt: bytes on disk fail their checksum or framing. Open and
	// Head/Next quarantine such a segment themselves; ReadMeta returns it.
	ErrCorrupt = errors.New("spool: corrupt data")
	// ErrClosed: the Spool was closed.
	ErrClosed = errors.New("spool: closed")
	// ErrNoSegment: Remove was given an id that is not in the spool.
	ErrNoSegment = errors.New("spool: no such segment")
)

// DefaultMaxBytes is Options.MaxBytes when left zero: 1 GiB.
const DefaultMaxBytes = 1 << 30

// File names in the spool directory. A segment is "<id as 16 hex digits>.seg".
const (
	lockName   = "LOCK"
	metaName   = "META"
	segSuffix  = ".seg"
	tmpSuffix  = ".tmp"
	badSuffix  = ".bad"
	idHexWidth = 16
)

// Options tunes a Spool. The zero value is the default.
type Options struct {
	// MaxBytes bounds the bytes of the segment files (headers and framing
	// included; META, LOCK and quarantined *.bad files are not counted).
	// Append returns ErrFull rather than go past it. Default (0):
	// DefaultMaxBytes, 1 GiB. A segment larger than MaxBytes never fits.
	MaxBytes int64
	// NoSync skips the fsyncs of Append and Remove: an append then survives
	// the process's death (SIGKILL included: the kernel has the data) but
	// not the machine's (power loss, kernel panic), where the newest
	// segments may be lost or cut short; Open cuts a torn one back to its
	// intact records. Default (false): every Append and Remove is durable
	// when it returns. WriteMeta syncs either way.
	NoSync bool
	// Logger receives recovery warnings (torn tails, quarantined segments,
	// leftover temporary files). Default (nil): discard.
	Logger *slog.Logger
}

// Record is one Kafka record as the spool keeps it: the partition the
// producer assigned and the encoded value, opaque to the spool.
type Record struct {
	Partition int32
	Payload   []byte
}

// Segment is one batch given to Append, read back whole.
type Segment struct {
	// ID orders segments: a later Append has a larger ID. IDs are not
	// contiguous (a failed Append or a quarantined segment leaves a gap) and
	// may be reused once the spool has been emptied and reopened.
	ID uint64
	// Records in the order they were appended. They belong to the caller;
	// the payloads share one buffer read from the file.
	Records []Record
	// Size is the segment file's size in bytes, what it counts towards
	// Options.MaxBytes.
	Size int64
}

// Stats describes a Spool for metrics.
type Stats struct {
	Segments int   // segments in the spool
	Records  int64 // records in those segments
	Bytes    int64 // bytes of those segment files, bounded by Options.MaxBytes
	// Since Open: segments found cut short by a crash and cut back to their
	// intact records (or removed if none was). How many records the lost
	// tails held cannot be known; the consumer counts them as gaps.
	TornSegments int64
	// Since Open: segments that failed their checksums elsewhere than at a
	// torn tail, or had an unknown format version, and were renamed
	// *.seg.bad. Their records are not replayed.
	Quarantined int64
}

// segInfo is the spool's index entry for one segment file.
type segInfo struct {
	id      uint64
	size    int64
	records int
}

// Spool is a durable FIFO of segments in one directory. See the package
// comment for the guarantees. All methods are safe for concurrent use:
// Append calls run one at a time, and so do Head, Next and Remove, but an
// Append and a reader proceed at once without waiting on each other's disk
// I/O; ReadMeta and WriteMeta have their own lock. Lock order: appendMu,
// readMu, metaMu, mu.
type Spool struct {
	fsys FS
	dir  string
	opts Options
	log  *slog.Logger

	appendMu sync.Mutex // held through an Append
	buf      []byte     // Append's encoding buffer, under appendMu

	readMu sync.Mutex // held through Head, Next and Remove
	metaMu sync.Mutex // held through ReadMeta and WriteMeta
	meta   metaState  // under metaMu

	mu     sync.Mutex // guards the fields below; never held across I/O
	lock   io.Closer  // nil once closed
	segs   []segInfo  // by increasing id
	nextID uint64
	stats  Stats
}

// Open opens the spool in dir, creating the directory if needed, and takes
// its lock: while the Spool is open, another Open of dir, by this process or
// another, fails with ErrLocked. It recovers the segments already there in
// order, verifying every record's checksum: a segment cut short by a crash
// keeps its intact records (the file is rewritten without the tail), and a
// segment damaged elsewhere is renamed *.seg.bad, logged and counted in
// Stats, and the rest of the spool goes on. Temporary files of appends a
// crash interrupted are removed, and the directory is synced, so what Open
// found is what a later crash leaves. Open reads every segment once, so it
// takes about as long as reading the spool's bytes from disk. It starts no
// goroutine.
func Open(fsys FS, dir string, opts Options) (*Spool, error) {
	if opts.MaxBytes < 0 {
		return nil, fmt.Errorf("spool: open %s: negative MaxBytes %d", dir, opts.MaxBytes)
	}
	opts.MaxBytes = cmp.Or(opts.MaxBytes, DefaultMaxBytes)
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Spool{fsys: fsys, dir: dir, opts: opts, log: log.With(slog.String("spool_dir", dir))}
	if err := fsys.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("spool: open %s: %w", dir, err)
	}
	lock, err := fsys.Lock(filepath.Join(dir, lockName))
	if err != nil {
		return nil, fmt.Errorf("spool: open %s: %w", dir, err)
	}
	// The directory's own entry in its parent, in case MkdirAll made it.
	if err := syncDir(fsys, filepath.Dir(dir)); err != nil {
		_ = lock.Close()
		return nil, fmt.Errorf("spool: open %s: %w", dir, err)
	}
	if err := s.recover(); err != nil {
		_ = lock.Close()
		return nil, fmt.Errorf("spool: open %s: %w", dir, err)
	}
	s.lock = lock
	return s, nil
}

// recover builds the index from the directory, repairing torn segments,
// quarantining corrupt ones and removing temporary files.
func (s *Spool) recover() error {
	names, err := s.fsys.ReadDir(s.dir)
	if err != nil {
		return err
	}
	var ids []uint64
	var maxID uint64
	for _, name := range names {
		switch {
		case strings.HasSuffix(name, tmpSuffix):
			base := strings.TrimSuffix(name, tmpSuffix)
			if base != metaName && !isSegmentName(base) {
				continue
			}
			// An Append, a repair or a WriteMeta that a crash
			// interrupted before its rename: never part of the spool.
			if err := s.fsys.Remove(filepath.Join(s.dir, name)); err != nil {
				return fmt.Errorf("remove unfinished %s: %w", name, err)
			}
			s.log.Info("spool: removed the temporary file of an interrupted write", slog.String("file", name))
		case strings.HasSuffix(name, badSuffix):
			// Quarantined ids stay reserved, so that a later quarantine
			// never renames over an earlier one.
			if id, ok := parseSegmentName(strings.TrimSuffix(name, badSuffix)); ok {
				maxID = max(maxID, id)
			}
		default:
			if id, ok := parseSegmentName(name); ok {
				ids = append(ids, id)
				maxID = max(maxID, id)
			}
		}
	}
	slices.Sort(ids)
	s.nextID = maxID + 1

	var buf bytes.Buffer
	var recs []Record
	for _, id := range ids {
		name := segmentName(id)
		buf.Reset()
		if err := readFileInto(s.fsys, filepath.Join(s.dir, name), &buf); err != nil {
			return fmt.Errorf("read %s: %w", name, err)
		}
		b := buf.Bytes()
		hid, got, valid, err := decodeSegment(b, recs[:0])
		recs = got
		if err == nil && hid != id {
			err = fmt.Errorf("%w: header names segment %d", ErrCorrupt, hid)
		}
		switch {
		case err == nil:
			s.segs = append(s.segs, segInfo{id: id, size: int64(len(b)), records: len(recs)})
			s.stats.Records += int64(len(recs))
			s.stats.Bytes += int64(len(b))
		case errors.Is(err, errTorn) && (hid == id || valid == 0):
			s.stats.TornSegments++
			if len(recs) == 0 {
				if err := s.fsys.Remove(filepath.Join(s.dir, name)); err != nil {
					return fmt.Errorf("remove torn %s: %w", name, err)
				}
				s.log.Warn("spool: removed a segment a crash left without an intact record",
					slog.String("file", name), slog.Int("bytes", len(b)))
				continue
			}
			enc, err := appendSegment(nil, id, recs)
			if err != nil {
				return fmt.Errorf("repair %s: %w", name, err)
			}
			if err := s.writeAtomic(name, enc, true, true); err != nil {
				return fmt.Errorf("repair %s: %w", name, err)
			}
			s.log.Warn("spool: cut a segment torn by a crash back to its intact records",
				slog.String("file", name), slog.Int("records_kept", len(recs)), slog.Int("bytes_dropped", len(b)-valid))
			s.segs = append(s.segs, segInfo{id: id, size: int64(len(enc)), records: len(recs)})
			s.stats.Records += int64(len(recs))
			s.stats.Bytes += int64(len(enc))
		default:
			if errors.Is(err, errTorn) {
				err = fmt.Errorf("%w: header names segment %d", ErrCorrupt, hid)
			}
			if err := s.quarantine(name, err); err != nil {
				return err
			}
		}
	}
	// Make the entries Open found durable, even when it changed nothing: an
	// Append or Remove whose directory sync failed in the previous process
	// must not be undone by a machine crash after this process has
	// replayed or built on it.
	return syncDir(s.fsys, s.dir)
}

// quarantine renames a corrupt segment file to *.bad, keeping it for
// inspection out of the FIFO, and logs and counts it. The caller syncs the
// directory.
func (s *Spool) quarantine(name string, cause error) error {
	path := filepath.Join(s.dir, name)
	if err := s.fsys.Rename(path, path+badSuffix); err != nil {
		return fmt.Errorf("quarantine %s: %w", name, err)
	}
	s.mu.Lock()
	s.stats.Quarantined++
	s.mu.Unlock()
	s.log.Error("spool: quarantined a corrupt segment; its records will not be replayed",
		slog.String("file", name+badSuffix), slog.Any("error", cause))
	return nil
}

// Append writes recs as one new segment at the tail of the spool. It writes a
// temporary file, syncs it, renames it into place and syncs the directory
// (without the syncs under Options.NoSync), so the segment appears whole or
// not at all. If it would take the spool past Options.MaxBytes, or the disk
// is full, it returns an error matching ErrFull. After any error nothing of
// the segment is in the spool, except that a machine crash during an Append
// whose rename reached the disk but whose error path's removal did not may
// bring back the whole segment at the next Open. recs is not retained.
// Appending no records does nothing.
func (s *Spool) Append(recs []Record) error {
	if len(recs) == 0 {
		return nil
	}
	s.appendMu.Lock()
	defer s.appendMu.Unlock()

	size := segmentSize(recs)
	s.mu.Lock()
	if s.lock == nil {
		s.mu.Unlock()
		return fmt.Errorf("spool: append: %w", ErrClosed)
	}
	if s.stats.Bytes+size > s.opts.MaxBytes {
		used := s.stats.Bytes
		s.mu.Unlock()
		return fmt.Errorf("spool: append: %w: %d bytes in the spool, segment of %d, MaxBytes %d", ErrFull, used, size, s.opts.MaxBytes)
	}
	// An id is used once even if this Append fails, so a file a failed
	// undo left behind can never clash with a later segment.
	id := s.nextID
	s.nextID++
	s.mu.Unlock()

	enc, err := appendSegment(s.buf[:0], id, recs)
	if err != nil {
		return fmt.Errorf("spool: append: %w", err)
	}
	if cap(enc) <= 4<<20 {
		s.buf = enc
	}
	if err := s.writeAtomic(segmentName(id), enc, !s.opts.NoSync, false); err != nil {
		if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
			return fmt.Errorf("spool: append: %w: %w", ErrFull, err)
		}
		return fmt.Errorf("spool: append: %w", err)
	}
	s.mu.Lock()
	s.segs = append(s.segs, segInfo{id: id, size: size, records: len(recs)})
	s.stats.Records += int64(len(recs))
	s.stats.Bytes += size
	s.mu.Unlock()
	return nil
}

// writeAtomic makes dir/name hold data, all or nothing: it writes
// name.tmp, syncs it, renames it over name and syncs the directory (the
// syncs only when sync is set). On an error before the rename it removes the
// temporary file, so name is as before. After the rename only the directory
// sync can fail: a new file (replace false, a segment) is then removed, so
// that the caller's error means the segment is not in the spool; a
// replacement (META, a repaired segment) stays, since the old bytes are gone.
func (s *Spool) writeAtomic(name string, data []byte, sync, replace bool) (err error) {
	path := filepath.Join(s.dir, name)
	tmp := path + tmpSuffix
	f, err := s.fsys.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("create %s: %w", name+tmpSuffix, err)
	}
	renamed := false
	defer func() {
		if err == nil {
			return
		}
		undo := tmp
		if renamed {
			if replace {
				return
			}
			undo = path
		}
		if rerr := s.fsys.Remove(undo); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			s.log.Error("spool: could not remove the file of a failed write; it may be replayed after a restart",
				slog.String("file", filepath.Base(undo)), slog.Any("error", rerr))
		}
	}()
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s: %w", name+tmpSuffix, err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			_ = f.Close()
			return fmt.Errorf("sync %s: %w", name+tmpSuffix, err)
		}
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", name+tmpSuffix, err)
	}
	if err := s.fsys.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename %s: %w", name+tmpSuffix, err)
	}
	renamed = true
	if sync {
		if err := syncDir(s.fsys, s.dir); err != nil {
			return err
		}
	}
	return nil
}

// Head returns the oldest segment, or io.EOF when the spool is empty. It is
// Next(0).
func (s *Spool) Head() (*Segment, error) { return s.Next(0) }

// Next returns the oldest segment whose ID is greater than after, or io.EOF
// if there is none; Next(0) is the head. A producer replays the spool by
// calling Next with the ID it last read, and calls Remove for each segment
// once Kafka has acknowledged all its records, without waiting for one
// segment's acknowledgements before reading the next.
//
// Next reads and verifies the whole segment. A segment that fails its
// checksums now (the disk changed it since Open) is quarantined like at
// Open, and Next goes on to the following one. The returned segment is the
// caller's; it stays valid after Remove.
//
// A segment whose records were partly acknowledged before a crash is
// replayed whole after the restart: the spool keeps no acknowledgement
// within a segment. Replays keep each partition's order, so the consumer's
// per-partition high-water mark drops the repeated prefix.
func (s *Spool) Next(after uint64) (*Segment, error) {
	if after == math.MaxUint64 {
		return nil, io.EOF
	}
	s.readMu.Lock()
	defer s.readMu.Unlock()
	for {
		s.mu.Lock()
		if s.lock == nil {
			s.mu.Unlock()
			return nil, fmt.Errorf("spool: next: %w", ErrClosed)
		}
		i, _ := slices.BinarySearchFunc(s.segs, after+1, func(e segInfo, id uint64) int {
			return cmp.Compare(e.id, id)
		})
		if i == len(s.segs) {
			s.mu.Unlock()
			return nil, io.EOF
		}
		info := s.segs[i]
		s.mu.Unlock()

		seg, err := s.readSegment(info)
		switch {
		case err == nil:
			return seg, nil
		case errors.Is(err, fs.ErrNotExist):
			// Removed behind the spool's back: nothing left to replay.
			s.log.Error("spool: a segment file disappeared; its records are lost",
				slog.String("file", segmentName(info.id)), slog.Int("records", info.records))
			s.drop(info.id)
			continue
		case !errors.Is(err, ErrCorrupt):
			return nil, fmt.Errorf("spool: next: %w", err)
		}
		if qerr := s.quarantine(segmentName(info.id), err); qerr != nil {
			return nil, fmt.Errorf("spool: next: %w", qerr)
		}
		s.drop(info.id)
		if err := s.syncDirIfDurable(); err != nil {
			return nil, fmt.Errorf("spool: next: %w", err)
		}
	}
}

// readSegment reads and verifies the segment described by info. Damage is
// reported as ErrCorrupt; a torn tail cannot happen to a segment Open
// accepted, so it is damage too.
func (s *Spool) readSegment(info segInfo) (*Segment, error) {
	name := segmentName(info.id)
	f, err := s.fsys.OpenFile(filepath.Join(s.dir, name), os.O_RDONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", name, err)
	}
	defer f.Close()
	// One byte more than expected, to see a file that grew.
	b := make([]byte, info.size+1)
	n, err := io.ReadFull(f, b)
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF):
		b = b[:n]
	case err == nil:
		return nil, fmt.Errorf("%w: %s is larger than the %d bytes written", ErrCorrupt, name, info.size)
	default:
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	id, recs, _, err := decodeSegment(b, make([]Record, 0, info.records))
	switch {
	case errors.Is(err, errTorn):
		return nil, fmt.Errorf("%w: %s ends early at %d bytes of %d", ErrCorrupt, name, len(b), info.size)
	case err != nil:
		return nil, fmt.Errorf("%s: %w", name, err)
	case id != info.id || len(recs) != info.records:
		return nil, fmt.Errorf("%w: %s holds segment %d with %d records, not segment %d with %d",
			ErrCorrupt, name, id, len(recs), info.id, info.records)
	}
	return &Segment{ID: info.id, Records: recs, Size: int64(len(b))}, nil
}

// Remove deletes the segment with the given ID, normally once Kafka has
// acknowledged all its records. Any segment may be removed, not only the
// head: the others keep their order. Unless Options.NoSync, the removal is
// durable when Remove returns; if only that sync fails, the segment is gone
// from the spool but may reappear after a machine crash, to be replayed
// again. An ID not in the spool returns ErrNoSegment.
func (s *Spool) Remove(id uint64) error {
	s.readMu.Lock()
	defer s.readMu.Unlock()
	s.mu.Lock()
	if s.lock == nil {
		s.mu.Unlock()
		return fmt.Errorf("spool: remove: %w", ErrClosed)
	}
	_, found := slices.BinarySearchFunc(s.segs, id, func(e segInfo, id uint64) int { return cmp.Compare(e.id, id) })
	s.mu.Unlock()
	if !found {
		return fmt.Errorf("spool: remove %d: %w", id, ErrNoSegment)
	}
	if err := s.fsys.Remove(filepath.Join(s.dir, segmentName(id))); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("spool: remove: %w", err)
	}
	s.drop(id)
	if err := s.syncDirIfDurable(); err != nil {
		return fmt.Errorf("spool: remove: %w", err)
	}
	return nil
}

// drop removes a segment from the index.
func (s *Spool) drop(id uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, found := slices.BinarySearchFunc(s.segs, id, func(e segInfo, id uint64) int { return cmp.Compare(e.id, id) })
	if !found {
		return
	}
	s.stats.Records -= int64(s.segs[i].records)
	s.stats.Bytes -= s.segs[i].size
	s.segs = slices.Delete(s.segs, i, i+1)
}

func (s *Spool) syncDirIfDurable() error {
	if s.opts.NoSync {
		return nil
	}
	return syncDir(s.fsys, s.dir)
}

// Stats returns the spool's counts. It is cheap: no I/O.
func (s *Spool) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Segments = len(s.segs)
	return st
}

// Close releases the directory's lock, after waiting for the calls in
// progress. Later calls return ErrClosed; Close itself may be called again,
// from any goroutine, and then returns nil.
func (s *Spool) Close() error {
	s.appendMu.Lock()
	defer s.appendMu.Unlock()
	s.readMu.Lock()
	defer s.readMu.Unlock()
	s.metaMu.Lock()
	defer s.metaMu.Unlock()
	s.mu.Lock()
	lock := s.lock
	s.lock = nil
	s.mu.Unlock()
	if lock == nil {
		return nil
	}
	if err := lock.Close(); err != nil {
		return fmt.Errorf("spool: close: %w", err)
	}
	return nil
}

func syncDir(fsys FS, dir string) error {
	d, err := fsys.OpenFile(dir, os.O_RDONLY, 0)
	if err != nil {
		return fmt.Errorf("open directory %s: %w", dir, err)
	}
	if err := d.Sync(); err != nil {
		_ = d.Close()
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return d.Close()
}

func readFileInto(fsys FS, path string, buf *bytes.Buffer) error {
	f, err := fsys.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = buf.ReadFrom(f)
	return err
}

func segmentName(id uint64) string {
	s := strconv.FormatUint(id, 16)
	return strings.Repeat("0", idHexWidth-len(s)) + s + segSuffix
}

func isSegmentName(name string) bool {
	_, ok := parseSegmentName(name)
	return ok
}

// parseSegmentName parses "<16 hex digits>.seg".
func parseSegmentName(name string) (uint64, bool) {
	hex, ok := strings.CutSuffix(name, segSuffix)
	if !ok || len(hex) != idHexWidth {
		return 0, false
	}
	id, err := strconv.ParseUint(hex, 16, 64)
	if err != nil || id == 0 {
		return 0, false
	}
	return id, true
}
