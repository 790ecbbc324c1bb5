package spool

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"syscall"
)

// META holds one blob, the producer's epoch and sequence reservations. It
// is rewritten in place, so that a full disk does not stop it: the file
// has two slots of equal size, each able to hold the whole blob, and a
// write fills the slot that does not hold the newest blob, then syncs the
// file. Overwriting bytes a file already has takes no new disk block (on
// ext4, XFS and tmpfs; not on copy-on-write file systems such as btrfs or
// ZFS) and changes no directory entry, so it works on a full disk, and a
// crash in the middle leaves the other slot, the previous blob, intact.
// Only a new file (the first write, a blob larger than its slot, or a
// META of the older single-blob format) is written as a temporary file
// renamed into place, which needs free space.
//
// Slot layout (little-endian), at offsets 0 and slot size; the file is
// two slots long:
//
//	magic "TGMT" | version u16 = 2 | flags u16 = 0 | blob length u32 | slot size u32 | generation u64 | crc32c(bytes 0..24, blob) u32 | blob | zeros
//
// The slot with the higher generation among those that pass their
// checksum holds the blob. The older format, version 1, is one blob:
//
//	magic "TGMT" | version u16 = 1 | flags u16 = 0 | length u32 | crc32c(bytes 0..12, blob) u32 | blob
const (
	metaMagic        = "TGMT"
	metaVersionOne   = 1
	metaVersion      = 2
	metaHeaderOne    = 16
	metaSlotHeader   = 28
	metaMinSlot      = 4 << 10
	metaSlotAlign    = 4 << 10
	metaMaxSlot      = math.MaxUint32
	metaMaxBlob      = metaMaxSlot - metaSlotHeader
	metaSlotsPerFile = 2
)

// metaState is what the spool knows of its META file, under metaMu. A
// write after a failed one reads the file again (known false).
type metaState struct {
	known    bool
	slotSize int64  // 0: no file of the slotted format (none, version 1, or unreadable)
	gen      uint64 // generation of the newest blob
	slot     int64  // the slot that holds it
}

// ReadMeta returns the blob last written by WriteMeta, or nil and no error
// if none was ever written (an empty blob reads back as an empty, non-nil
// slice). A file whose slots all fail their checksums returns an error
// matching ErrCorrupt; the spool cannot repair it (the next WriteMeta
// replaces it). One slot failing its checksum is a write a crash
// interrupted: the other slot's blob, the previous one, is returned. The
// slice is the caller's.
func (s *Spool) ReadMeta() ([]byte, error) {
	s.metaMu.Lock()
	defer s.metaMu.Unlock()
	if err := s.checkOpen(); err != nil {
		return nil, fmt.Errorf("spool: read meta: %w", err)
	}
	blob, st, err := s.loadMeta()
	if err != nil {
		return nil, fmt.Errorf("spool: read meta: %w", err)
	}
	s.meta = st
	return blob, nil
}

// loadMeta reads META: its blob (nil when there is no file) and its state.
// metaMu is held.
func (s *Spool) loadMeta() ([]byte, metaState, error) {
	var buf bytes.Buffer
	err := readFileInto(s.fsys, filepath.Join(s.dir, metaName), &buf)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, metaState{known: true}, nil
	}
	if err != nil {
		return nil, metaState{}, err
	}
	blob, st, err := decodeMeta(buf.Bytes())
	if err != nil {
		return nil, metaState{known: true}, err
	}
	st.known = true
	return blob, st, nil
}

// WriteMeta replaces the metadata blob durably, whatever Options.NoSync
// says: the producer keeps its boot epoch and sequence reservations there,
// and must not use a reservation a crash could forget. When the blob fits
// the file's slots it overwrites the older slot in place and syncs the
// file, which needs no free disk space (see the format above); otherwise
// it writes a new file with room for twice the blob (temporary file,
// fsync, rename, fsync of the directory), and on a full disk returns an
// error matching ErrFull (and syscall.ENOSPC or EDQUOT).
//
// After an error the previous blob is in place, unless only a final sync
// failed: then either blob may be there, now and after a crash, so a
// producer whose reservation failed to write must neither use it nor
// reuse its numbers (skipping reserved numbers is safe: the consumer
// counts them as missing, an upper bound). The blob is meant to be small
// and is not counted in Options.MaxBytes; it is not retained.
func (s *Spool) WriteMeta(blob []byte) error {
	s.metaMu.Lock()
	defer s.metaMu.Unlock()
	if err := s.checkOpen(); err != nil {
		return fmt.Errorf("spool: write meta: %w", err)
	}
	if uint64(len(blob)) > metaMaxBlob {
		return fmt.Errorf("spool: write meta: blob of %d bytes, at most %d", len(blob), uint64(metaMaxBlob))
	}
	if !s.meta.known {
		// Unreadable: a new file replaces it.
		_, st, _ := s.loadMeta()
		s.meta = st
	}
	st := s.meta
	var err error
	if need := int64(metaSlotHeader + len(blob)); st.slotSize >= need {
		slot := 1 - st.slot
		err = s.writeAt(metaName, slot*st.slotSize, encodeMetaSlot(blob, st.slotSize, st.gen+1))
		st.gen, st.slot = st.gen+1, slot
	} else {
		size := max(metaMinSlot, 2*need)
		size = min((size+metaSlotAlign-1)/metaSlotAlign*metaSlotAlign, metaMaxSlot)
		file := make([]byte, metaSlotsPerFile*size)
		copy(file, encodeMetaSlot(blob, size, st.gen+1))
		err = s.writeAtomic(metaName, file, true, true)
		st = metaState{known: true, slotSize: size, gen: st.gen + 1}
	}
	if err != nil {
		s.meta.known = false // either blob may be there: read it again
		if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
			return fmt.Errorf("spool: write meta: %w: %w", ErrFull, err)
		}
		return fmt.Errorf("spool: write meta: %w", err)
	}
	s.meta = st
	return nil
}

// writeAt overwrites dir/name's bytes at off with data and syncs the file.
// The file exists and is at least off+len(data) long, so no block is added
// and no directory entry changes.
func (s *Spool) writeAt(name string, off int64, data []byte) error {
	f, err := s.fsys.OpenFile(filepath.Join(s.dir, name), os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", name, err)
	}
	if _, err := f.WriteAt(data, off); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s at %d: %w", name, off, err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return fmt.Errorf("sync %s: %w", name, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", name, err)
	}
	return nil
}

func (s *Spool) checkOpen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lock == nil {
		return ErrClosed
	}
	return nil
}

// encodeMetaSlot returns a whole slot of size bytes holding blob.
func encodeMetaSlot(blob []byte, size int64, gen uint64) []byte {
	b := make([]byte, size)
	copy(b, metaMagic)
	binary.LittleEndian.PutUint16(b[4:], metaVersion)
	binary.LittleEndian.PutUint32(b[8:], uint32(len(blob)))
	binary.LittleEndian.PutUint32(b[12:], uint32(size))
	binary.LittleEndian.PutUint64(b[16:], gen)
	copy(b[metaSlotHeader:], blob)
	sum := crc32.Update(crc32.Checksum(b[:24], castagnoli), castagnoli, blob)
	binary.LittleEndian.PutUint32(b[24:], sum)
	return b
}

// decodeMeta returns the blob a META file holds and the file's state
// (known unset). A version-1 file reads with slotSize 0, so that the next
// write replaces it by a slotted one.
func decodeMeta(b []byte) ([]byte, metaState, error) {
	if len(b) >= metaHeaderOne && string(b[:4]) == metaMagic && binary.LittleEndian.Uint16(b[4:]) == metaVersionOne {
		blob, err := decodeMetaOne(b)
		return blob, metaState{}, err
	}
	size := int64(len(b) / metaSlotsPerFile)
	if int64(len(b)) != metaSlotsPerFile*size || size < metaSlotHeader {
		return nil, metaState{}, fmt.Errorf("%w: META of %d bytes is neither two slots nor a version %d blob", ErrCorrupt, len(b), metaVersionOne)
	}
	var blob []byte
	var st metaState
	found := false
	var errs []error
	for slot := range int64(metaSlotsPerFile) {
		bl, gen, err := decodeMetaSlot(b[slot*size : (slot+1)*size])
		if err != nil {
			errs = append(errs, fmt.Errorf("slot %d: %w", slot, err))
			continue
		}
		if !found || gen > st.gen {
			blob, st, found = bl, metaState{slotSize: size, gen: gen, slot: slot}, true
		}
	}
	if !found {
		return nil, metaState{}, fmt.Errorf("%w: no META slot is intact: %w", ErrCorrupt, errors.Join(errs...))
	}
	return bytes.Clone(blob), st, nil
}

// decodeMetaSlot returns the blob and generation of one slot.
func decodeMetaSlot(b []byte) ([]byte, uint64, error) {
	if string(b[:4]) != metaMagic {
		return nil, 0, errors.New("bad magic")
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != metaVersion {
		return nil, 0, fmt.Errorf("format version %d, this build reads %d and %d", v, metaVersionOne, metaVersion)
	}
	n := int64(binary.LittleEndian.Uint32(b[8:]))
	if binary.LittleEndian.Uint16(b[6:]) != 0 || int64(binary.LittleEndian.Uint32(b[12:])) != int64(len(b)) ||
		n > int64(len(b))-metaSlotHeader {
		return nil, 0, fmt.Errorf("header says %d bytes in a slot of %d", n, binary.LittleEndian.Uint32(b[12:]))
	}
	blob := b[metaSlotHeader : metaSlotHeader+n]
	if binary.LittleEndian.Uint32(b[24:]) != crc32.Update(crc32.Checksum(b[:24], castagnoli), castagnoli, blob) {
		return nil, 0, errors.New("bad checksum")
	}
	return blob, binary.LittleEndian.Uint64(b[16:]), nil
}

// decodeMetaOne decodes a version-1 META file.
func decodeMetaOne(b []byte) ([]byte, error) {
	n := binary.LittleEndian.Uint32(b[8:])
	if uint64(n) != uint64(len(b)-metaHeaderOne) || binary.LittleEndian.Uint16(b[6:]) != 0 {
		return nil, fmt.Errorf("%w: META holds %d bytes, its header says %d", ErrCorrupt, len(b)-metaHeaderOne, n)
	}
	blob := b[metaHeaderOne:]
	if binary.LittleEndian.Uint32(b[12:]) != crc32.Update(crc32.Checksum(b[:12], castagnoli), castagnoli, blob) {
		return nil, fmt.Errorf("%w: bad META checksum", ErrCorrupt)
	}
	return bytes.Clone(blob), nil
}
