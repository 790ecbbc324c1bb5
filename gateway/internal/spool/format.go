package spool

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"slices"
)

// Segment file layout (little-endian; the package comment has the prose):
//
//	header  20 B  magic "TGSP" | version u16 = 1 | flags u16 = 0 | segment id u64 | crc32c(bytes 0..16) u32
//	record  12 B  payload length u32 | partition i32 | crc32c(length, partition, payload) u32
//	        then  payload
//	trailer 12 B  0xFFFFFFFF u32 | record count u32 | crc32c(bytes 0..8 of the trailer) u32
const (
	segMagic      = "TGSP"
	segVersion    = 1
	headerSize    = 20
	frameSize     = 12
	trailerMarker = math.MaxUint32
	// maxPayload keeps the length field clear of the trailer marker.
	maxPayload = math.MaxUint32 - 1
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errTorn reports a segment that ends before its trailer: the tail of a
// write that a crash cut short. The records decoded before it are intact.
var errTorn = errors.New("torn tail")

// segmentSize is the encoded size of a segment holding recs.
func segmentSize(recs []Record) int64 {
	n := int64(headerSize + frameSize)
	for _, r := range recs {
		n += frameSize + int64(len(r.Payload))
	}
	return n
}

// appendSegment appends the encoding of segment id holding recs to dst. It
// writes in place in dst, so that encoding allocates nothing once dst is
// large enough.
func appendSegment(dst []byte, id uint64, recs []Record) ([]byte, error) {
	if uint64(len(recs)) > math.MaxUint32 {
		return dst, fmt.Errorf("%d records in one segment, at most %d", len(recs), uint32(math.MaxUint32))
	}
	dst = slices.Grow(dst, int(segmentSize(recs)))
	h := len(dst)
	dst = append(dst, segMagic...)
	dst = binary.LittleEndian.AppendUint16(dst, segVersion)
	dst = binary.LittleEndian.AppendUint16(dst, 0)
	dst = binary.LittleEndian.AppendUint64(dst, id)
	dst = binary.LittleEndian.AppendUint32(dst, crc32.Checksum(dst[h:], castagnoli))
	for i, r := range recs {
		if uint64(len(r.Payload)) > maxPayload {
			return dst, fmt.Errorf("record %d: payload of %d bytes, at most %d", i, len(r.Payload), uint64(maxPayload))
		}
		f := len(dst)
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(r.Payload)))
		dst = binary.LittleEndian.AppendUint32(dst, uint32(r.Partition))
		sum := crc32.Update(crc32.Checksum(dst[f:], castagnoli), castagnoli, r.Payload)
		dst = binary.LittleEndian.AppendUint32(dst, sum)
		dst = append(dst, r.Payload...)
	}
	t := len(dst)
	dst = binary.LittleEndian.AppendUint32(dst, trailerMarker)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(recs)))
	return binary.LittleEndian.AppendUint32(dst, crc32.Checksum(dst[t:], castagnoli)), nil
}

// decodeSegment decodes a segment file's bytes b, appending its records to
// recs; each payload aliases b, capped so that appending to one cannot
// overwrite the next. The error is nil for a whole segment; errTorn when b
// ends early, or ends in a damaged record followed by nothing but zeros
// (what a crash leaves of unsynced data), in which case recs holds the
// intact records before it and valid is their encoded length; otherwise an
// error matching ErrCorrupt, which the records returned must not be trusted
// past.
func decodeSegment(b []byte, recs []Record) (id uint64, out []Record, valid int, err error) {
	if len(b) < headerSize {
		return 0, recs, 0, errTorn
	}
	h := b[:headerSize]
	if string(h[:4]) != segMagic || binary.LittleEndian.Uint32(h[16:]) != crc32.Checksum(h[:16], castagnoli) {
		if allZero(b[headerSize:]) {
			// Nothing but zeros after a damaged header: it was being
			// written when the machine crashed.
			return 0, recs, 0, errTorn
		}
		return 0, recs, 0, fmt.Errorf("%w: bad header", ErrCorrupt)
	}
	if v := binary.LittleEndian.Uint16(h[4:]); v != segVersion {
		return 0, recs, 0, fmt.Errorf("%w: format version %d, this build reads %d", ErrCorrupt, v, segVersion)
	}
	if flags := binary.LittleEndian.Uint16(h[6:]); flags != 0 {
		return 0, recs, 0, fmt.Errorf("%w: unknown flags %#x", ErrCorrupt, flags)
	}
	id = binary.LittleEndian.Uint64(h[8:])
	start := len(recs)
	off := headerSize
	for {
		rest := b[off:]
		if len(rest) < frameSize {
			return id, recs, off, errTorn
		}
		n := binary.LittleEndian.Uint32(rest[:4])
		sum := binary.LittleEndian.Uint32(rest[8:])
		if n == trailerMarker {
			if sum != crc32.Checksum(rest[:8], castagnoli) {
				if allZero(rest[frameSize:]) {
					return id, recs, off, errTorn
				}
				return id, recs, off, fmt.Errorf("%w: bad trailer at offset %d", ErrCorrupt, off)
			}
			if count := binary.LittleEndian.Uint32(rest[4:]); uint64(count) != uint64(len(recs)-start) {
				return id, recs, off, fmt.Errorf("%w: trailer counts %d records, found %d", ErrCorrupt, count, len(recs)-start)
			}
			if len(rest) != frameSize {
				return id, recs, off, fmt.Errorf("%w: %d bytes after the trailer", ErrCorrupt, len(rest)-frameSize)
			}
			return id, recs, len(b), nil
		}
		if uint64(n) > uint64(len(rest)-frameSize) {
			// The record runs past the end of the file: the write was cut.
			return id, recs, off, errTorn
		}
		end := frameSize + int(n)
		payload := rest[frameSize:end:end]
		if sum != crc32.Update(crc32.Checksum(rest[:8], castagnoli), castagnoli, payload) {
			if allZero(rest[end:]) {
				return id, recs, off, errTorn
			}
			return id, recs, off, fmt.Errorf("%w: bad checksum of the record at offset %d", ErrCorrupt, off)
		}
		recs = append(recs, Record{Partition: int32(binary.LittleEndian.Uint32(rest[4:])), Payload: payload})
		off += end
	}
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
