// Package spool is the gateway's on-disk buffer of Kafka records: a durable
// FIFO of segments, each an ordered batch of records (a partition and an
// opaque payload). The event producer spills sealed batches here while Kafka
// is unreachable or slow and on a graceful stop, and replays them in order
// when Kafka returns or the gateway restarts. The spool knows nothing of the
// payloads' format.
//
// # Use
//
//	s, err := spool.Open(spool.OSFS{}, dir, spool.Options{})
//	err = s.Append(batch)              // ErrFull: count batch as lost
//	for seg, err := s.Head(); err == nil; seg, err = s.Next(seg.ID) {
//		produce(seg.Records)           // then, once Kafka acked them all:
//		s.Remove(seg.ID)
//	}
//	blob, err := s.ReadMeta()          // the producer's epoch and reservations
//	err = s.WriteMeta(blob)
//	err = s.Close()
//
// The caller chooses the directory. The gateway's default is
// <data dir>/spool/<gateway id>, so two gateways on one machine never share
// a spool; the lock makes sure of it (a second Open of a directory, by any
// process, fails with ErrLocked until the first Spool is closed or its
// process has died).
//
// # Order
//
// Segments are read in the order they were appended, and records within a
// segment in the order given, so each partition's records come back in the
// order the producer spooled them. A segment leaves the spool only by
// Remove, or by quarantine (below). A segment whose records Kafka had partly
// acknowledged when the gateway stopped is replayed whole: the consumer
// deduplicates by a high-water mark of sequence numbers per partition, and
// the repeated records form a prefix of each partition's replay, so they are
// dropped as duplicates and nothing later is. (A cheaper acknowledgement
// within a segment would cost the same fsyncs as an Append, for a rare
// case the consumer already handles.)
//
// # Guarantees
//
// Append writes a temporary file, fsyncs it, renames it into place and
// fsyncs the directory before it returns, so a segment is in the spool whole
// or not at all:
//
//   - Process death (SIGKILL, panic, OOM kill): every segment whose Append
//     returned survives, with or without Options.NoSync, since the kernel
//     holds the written data; an Append in progress is lost or survives
//     whole (its temporary file is removed by the next Open).
//   - Machine crash (power loss, kernel panic): every segment whose Append
//     returned survives; an Append in progress is lost or survives whole;
//     earlier segments are never touched. Under Options.NoSync the newest
//     segments may be lost or torn, and recently removed ones may come
//     back: Open keeps a torn segment's intact records and drops its tail,
//     counted in Stats.TornSegments and logged; garbage is never returned.
//   - Full disk or budget: Append refuses the whole segment with ErrFull
//     and leaves nothing behind; the caller counts the records as lost.
//     Once Remove has freed space, Append succeeds again. Open, Next and
//     Remove need no free space, and WriteMeta rewrites META in place, so
//     a spool on a full disk opens, replays and records its producer's
//     reservations, and replaying is what frees the disk.
//   - Corruption elsewhere than a torn tail (a bad checksum followed by more
//     data, a damaged header, an unknown format version) is quarantined: the
//     file is renamed *.seg.bad and kept for inspection, logged, counted in
//     Stats.Quarantined, and the spool goes on with the other segments.
//
// Removals are durable when Remove returns (unless Options.NoSync); a
// removal a machine crash undid replays that segment again, which the
// consumer deduplicates.
//
// # Format
//
// The directory holds LOCK (flock'ed; the holder's pid as text), META (the
// producer's blob), and one file per segment, named by its id in 16 hex
// digits: 0000000000000001.seg. Temporary files end in .tmp, quarantined
// segments in .seg.bad. A segment file, little-endian, CRC-32C (Castagnoli):
//
//	header   "TGSP" | version u16 (1) | flags u16 (0) | segment id u64 | crc32c of the 16 bytes before u32
//	record   payload length u32 | partition i32 | crc32c of length, partition and payload u32 | payload
//	...      (one per record, in order)
//	trailer  0xFFFFFFFF u32 | record count u32 | crc32c of the 8 bytes before u32
//
// A segment costs 32 bytes plus 12 per record beyond its payloads. A file
// that ends before its trailer, or whose first damaged record is followed by
// nothing but zeros, is torn; any other damage is corruption. META is two
// slots of equal size (at least 4 KiB, room for twice the blob), each
// "TGMT" | version u16 (2) | flags u16 (0) | blob length u32 | slot size
// u32 | generation u64 | crc32c of the 24 bytes before and the blob u32 |
// blob | zeros; the intact slot with the higher generation holds the blob.
// A write overwrites the other slot in place and fsyncs the file: no new
// block, no directory change (on copy-on-write file systems, btrfs or ZFS,
// an overwrite still needs free blocks), and a crash during it leaves the
// previous blob. A new file, written as a renamed temporary file, is
// needed only for the first blob, a blob larger than a slot, or a META of
// the first format ("TGMT" | version u16 (1) | flags u16 (0) | length u32
// | crc32c of the 12 bytes before and the blob u32 | blob), which is still
// read.
//
// # Concurrency
//
// Every method is safe for concurrent use. Append calls run one at a time;
// Head, Next and Remove run one at a time; an Append and a reader run at
// once without waiting for each other's disk I/O, so the producer's spill
// goroutine and replay goroutine do not block each other. ReadMeta and
// WriteMeta have their own lock. Stats does no I/O. Close waits for calls in
// progress, then releases the lock; it is idempotent. The package starts no
// goroutine.
package spool
