package spool

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"math"
	"path/filepath"
)

// META file layout (little-endian):
//
//	magic "TGMT" | version u16 = 1 | flags u16 = 0 | length u32 | crc32c(bytes 0..12, blob) u32 | blob
const (
	metaMagic      = "TGMT"
	metaVersion    = 1
	metaHeaderSize = 16
)

// ReadMeta returns the blob last written by WriteMeta, or nil and no error
// if none was ever written (an empty blob reads back as an empty, non-nil
// slice). A blob that fails its checksum returns an error matching
// ErrCorrupt; the spool cannot repair it. The slice is the caller's.
func (s *Spool) ReadMeta() ([]byte, error) {
	s.metaMu.Lock()
	defer s.metaMu.Unlock()
	if err := s.checkOpen(); err != nil {
		return nil, fmt.Errorf("spool: read meta: %w", err)
	}
	var buf bytes.Buffer
	err := readFileInto(s.fsys, filepath.Join(s.dir, metaName), &buf)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("spool: read meta: %w", err)
	}
	blob, err := decodeMeta(buf.Bytes())
	if err != nil {
		return nil, fmt.Errorf("spool: read meta: %w", err)
	}
	return blob, nil
}

// WriteMeta replaces the metadata blob atomically (temporary file, fsync,
// rename, fsync of the directory) and durably whatever Options.NoSync says:
// the producer keeps its boot epoch and sequence reservations there, and
// must not use a reservation a crash could forget. After an error the
// previous blob is in place, unless only the final sync of the directory
// failed: then either blob may be there, now and after a crash, so a
// producer whose reservation failed to write must neither use it nor reuse
// its numbers (skipping reserved numbers is safe: the consumer counts them
// as missing, an upper bound). The blob is meant to be small (it is
// rewritten whole) and is not counted in Options.MaxBytes; it is not
// retained.
func (s *Spool) WriteMeta(blob []byte) error {
	s.metaMu.Lock()
	defer s.metaMu.Unlock()
	if err := s.checkOpen(); err != nil {
		return fmt.Errorf("spool: write meta: %w", err)
	}
	if uint64(len(blob)) > math.MaxUint32 {
		return fmt.Errorf("spool: write meta: blob of %d bytes, at most %d", len(blob), uint32(math.MaxUint32))
	}
	if err := s.writeAtomic(metaName, encodeMeta(blob), true, true); err != nil {
		return fmt.Errorf("spool: write meta: %w", err)
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

func encodeMeta(blob []byte) []byte {
	b := make([]byte, metaHeaderSize, metaHeaderSize+len(blob))
	copy(b, metaMagic)
	binary.LittleEndian.PutUint16(b[4:], metaVersion)
	binary.LittleEndian.PutUint32(b[8:], uint32(len(blob)))
	sum := crc32.Update(crc32.Checksum(b[:12], castagnoli), castagnoli, blob)
	binary.LittleEndian.PutUint32(b[12:], sum)
	return append(b, blob...)
}

func decodeMeta(b []byte) ([]byte, error) {
	if len(b) < metaHeaderSize || string(b[:4]) != metaMagic {
		return nil, fmt.Errorf("%w: bad META header", ErrCorrupt)
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != metaVersion {
		return nil, fmt.Errorf("%w: META format version %d, this build reads %d", ErrCorrupt, v, metaVersion)
	}
	n := binary.LittleEndian.Uint32(b[8:])
	if uint64(n) != uint64(len(b)-metaHeaderSize) || binary.LittleEndian.Uint16(b[6:]) != 0 {
		return nil, fmt.Errorf("%w: META holds %d bytes, its header says %d", ErrCorrupt, len(b)-metaHeaderSize, n)
	}
	blob := b[metaHeaderSize:]
	if binary.LittleEndian.Uint32(b[12:]) != crc32.Update(crc32.Checksum(b[:12], castagnoli), castagnoli, blob) {
		return nil, fmt.Errorf("%w: bad META checksum", ErrCorrupt)
	}
	return bytes.Clone(blob), nil
}
