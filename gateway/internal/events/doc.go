// Package events is the gateway's decision event producer: every decision
// (and every charge after the fact) becomes one DecisionEvent record on
// Kafka's decisions topic, without blocking or slowing the
// request path, and without losing events when Kafka is slow or down.
//
// # Use
//
//	p, err := events.New(events.Config{Brokers: brokers, GatewayID: id,
//		SpoolDir: events.DefaultSpoolDir(dataDir, id), Log: log, Registerer: reg})
//	go func() { errc <- p.Run(ctx) }()   // until ctx ends; then it drains
//	p.Record(req, decision, "proxy")      // per check, from any goroutine
//	p.Report(req, decision, "report")     // per charge after the fact
//
// Stop the request path before ending Run's context: events recorded after
// Run's final seal are dropped (counted, reason "closed").
//
// # Goroutines
//
// New starts none. Run runs the sender in the calling goroutine, starts
// franz-go's client and one flusher goroutine (it sends each generation of
// records, below), and stops and waits for both before it returns. Close
// stops a running Run and waits for it (or, when Run never ran, writes the
// buffered events to the spool). franz-go's promise worker calls back into
// the producer for each record; the callback only touches atomics. Record
// and Report may be called from any number of goroutines.
//
// # Records
//
// Partition PartitionOf(tenant, partitions) = fnv32a(tenant) mod the
// topic's partition count (read from Kafka at New; when Kafka is down, the
// count the spool remembers, else Config.Partitions), key the tenant,
// value the DecisionEvent written by the decision stream's codec
// (tollgatev1.AppendDecision: the bytes proto.Marshal writes, without
// allocating).
// Anonymous requests have key_id "" and tenant "" and are grouped under the
// empty tenant. The event time is the decision's Redis time; decisions made
// without Redis (blocklist, allowlist, no rule) carry none and get the
// gateway's clock, and so do decisions whose Redis time is more than
// tollgatev1.MaxEventAhead (10 minutes) from it. A rejection's cost is 0
// (it took nothing). Every value is kept within the schema's bounds
// (tollgatev1, bounds.go), which the aggregator refuses events beyond: a
// longer string is cut on a rune boundary and ends with "…", a cost is
// clamped to 0..1e9 and a Retry-After to 366 days, each correction counted
// in tollgate_events_corrected_total{field} and logged once per 10 s; the
// event is kept. A tenant is cut before its partition is chosen, so the
// partition, the record key and the event agree.
//
// Identity: (gateway id, epoch, partition, seq). The epoch is drawn from
// crypto/rand by New; seq counts from 1 per partition. Numbers are reserved
// in ranges in the spool's META, fsynced, before they are used: Run extends
// a partition's range when half of it is left, off the decision path, by
// about 2 s of numbers at the partition's recent rate (at least 10,000).
// Should the decision path outrun the META write, Record does not wait: it
// goes on numbering and counts tollgate_events_reservation_overruns_total,
// and a SIGKILL in that window may then lose events the aggregator cannot
// count. Measured: none at a steady 100k or 300k decisions/s
// (BenchmarkPipelinePaced); a burst from idle to ~4M/s (BenchmarkRecord,
// with spool writes competing for the disk) overruns by 2–8 % of its events
// until the ranges have grown. A graceful stop lowers the reservations to
// the last numbers used.
//
// META is rewritten in place (package spool), so a full disk does not stop
// it, and a gateway restarts, replays and frees its spool on a full disk.
// Should META still fail to be written (a META of the spool's first format
// on a full disk, a copy-on-write file system, an I/O error), New does not
// fail: the gateway decides and produces all the same, since refusing to
// start would keep the disk full. Event ids stay unique, because each
// start draws a new random epoch and numbers from 1 within it; what is
// missing is the record of the epoch, so until a write succeeds (retried
// every second) a SIGKILL or crash leaves the epoch unclosed and the loss
// of its unsent tail uncounted. Meanwhile tollgate_events_reservation_-
// durable is 0 and every event numbered counts as an overrun; the sequence
// ledger keeps the previous epoch's numbers until the first write that
// succeeds, which names them, and then starts counting this epoch's. New queues, before any new event and after
// everything the spool holds, one EpochClosed marker per partition for each
// earlier epoch named in META (seq = last + 1, last_seq = last), and
// forgets those epochs once the markers are in the spool or in Kafka.
//
// The last number used: after a graceful stop, META's. After a SIGKILL,
// the sequence ledger's: the decision path's counters (next) are a file of
// shared memory (Config.LedgerDir, /dev/shm) mapped into the process, so
// the store that takes a number records it, at no cost, and the kernel
// keeps the file when the process dies; New reads it before it starts the
// new epoch, writes the numbers into META's closing list, and then starts
// the ledger afresh (a graceful stop deletes it). The aggregator then
// counts as missing exactly what was lost. Without the ledger (a machine
// crash: tmpfs is gone; no tmpfs; not Linux) the markers name the last
// numbers reserved, and the numbers reserved and never used count as
// missing too: an upper bound, by up to a range per partition.
//
// # Pipeline
//
// Memory is Config.MemoryBytes cut into 32 fixed chunks. Record encodes
// the event into the open chunk under one short lock (about 0.2 µs; no
// allocation, no I/O); a full chunk is sealed and the next free one
// opened. Run owns one FIFO, oldest first:
//
//	active    segments being produced: chunks, or segments read back from the spool
//	backlog   the spool's segments not yet read
//	pending   sealed chunks in memory
//
// It seals the open chunk after Linger when it could send it at once, and
// always once its first event is FlushInterval old. It hands records to an
// idempotent franz-go producer (manual partitioner, snappy, manual flushing)
// in generations: all records not yet acknowledged, in FIFO order, at most
// 32,768, from a quarter of the chunks at most; a flusher goroutine sends
// them, and the next generation starts when every record of this one is
// answered. A segment leaves the FIFO (and the spool, and memory) when every
// record is acknowledged. When franz-go fails records, the next generation
// re-sends every unacknowledged record in FIFO order, after a backoff. A
// segment not acknowledged FlushInterval after its first event, or any when
// a quarter of the chunks is left, is spilled to the spool (package spool):
// always the oldest one not yet there, so the spool holds a prefix of the
// FIFO in FIFO order; pending chunks are written in batches (one fsync for
// up to 8) and freed, active ones keep their memory until Kafka answers.
// Pending chunks are produced only once the backlog is empty, spool segments
// only in the order they were written.
//
// Ordering: the aggregator deduplicates by a high-water mark per (gateway,
// epoch, partition), so each partition must reach Kafka in sequence order,
// possibly repeating an in-order prefix, never skipping ahead. Sequence
// numbers are assigned under the same lock that appends to the open chunk,
// so chunk order is sequence order per partition; the FIFO keeps chunk order
// through memory, spool and replay (the spool is always a FIFO prefix, and
// nothing behind the backlog is sent before it). franz-go's idempotent
// producer delivers one partition's records in the order produced; when a
// batch fails it fails every record buffered on the partition, and the
// broker refuses a later batch whose predecessor it lacks. Records handed
// over after such a failure would start a new sequence and could overtake
// the failed ones; generations rule that out, since nothing is handed over
// until the previous generation is wholly answered
// (TestFailedRecordsAreResentInOrder refuses produce requests while events
// flow: a pipelined sender loses a third of them). So what Kafka holds per
// partition is an in-order prefix of what was sent, and a re-send starts at
// the first record not acknowledged. A replay of a segment Kafka had partly
// acknowledged, after a restart, repeats a prefix: duplicates, which the
// aggregator ignores. A restarted producer replays its spool before its
// markers and new events.
//
// # Guarantees
//
// A graceful stop (Run's context ends, or Close) loses nothing: Run waits
// up to ShutdownTimeout for Kafka to acknowledge what is buffered (not at
// all when Kafka is down), writes the rest to the spool and records the
// last numbers used, so the next epoch's markers name them exactly and the
// aggregator counts nothing missing.
//
// A SIGKILL loses what was only in memory: events recorded less than
// FlushInterval (plus the time of one spool write) before it that Kafka had
// not acknowledged — at most what the memory buffer holds (MemoryBytes,
// about 8 MiB / 140 bytes ≈ 60,000 events by default); when the disk is too
// slow for the spool to keep up, decisions beyond that are dropped, counted
// and logged (below), and such drops show as missing like the lost tail. With
// Kafka keeping up that is the events of the last few milliseconds; with
// Kafka down, at most FlushInterval of recording (TestSIGKILLLosesOnly-
// TheMemoryTail measures it: ~5–70 ms of recording at 100 ms). The restart's
// EpochClosed markers make the aggregator count that tail as missing,
// exactly (the sequence ledger), so a loss is never silent nor overstated.
// A machine crash loses the same plus nothing the spool fsynced, and the
// count may exceed it by the unused reservations.
//
// A decision is dropped only when no memory chunk is free: the spool
// refused the oldest ones (its disk budget, SpoolMaxBytes, is spent, or
// the disk is full), or a burst outran the spool's writes (size MemoryBytes
// to absorb a burst for the time of an fsync). A dropped decision still
// uses its sequence number, so the aggregator counts the gap; it is
// counted in tollgate_events_dropped_total and logged once per 10 s, never
// per decision.
//
// # Metrics
//
//	tollgate_events_recorded_total             events taken into memory
//	tollgate_events_produced_total             records Kafka acknowledged
//	tollgate_events_dropped_total{reason}      spool_full, oversized, closed
//	tollgate_events_buffered                   events in memory
//	tollgate_events_buffered_bytes             memory in use (whole chunks)
//	tollgate_events_memory_limit_bytes         the memory buffer
//	tollgate_events_spooled_total              records written to the spool
//	tollgate_events_replayed_total             records read back and sent
//	tollgate_events_spool_bytes, _segments     the spool now
//	tollgate_events_spool_limit_bytes          its disk budget
//	tollgate_events_send_errors_total          records franz-go failed (re-sent)
//	tollgate_events_kafka_up                   1 while Kafka acknowledges
//	tollgate_events_reservation_overruns_total events numbered past META
//	tollgate_events_reservation_durable        0 while META cannot be written
//	tollgate_events_spool_quarantined_total    corrupt spool segments set aside
//	tollgate_events_spool_torn_total           segments cut short by a crash
//	tollgate_events_corrected_total{field}     cost, time, length, retry_after
//
// No label carries a key, a tenant or a path.
//
// # Cost
//
// BenchmarkRecord: Record from parallel goroutines, 0 allocations (pinned
// by TestRecordDoesNotAllocate). BenchmarkPipelinePaced: the process's CPU
// per event, decision path, sender and franz-go together, at a steady
// rate; docs/benchmarks.md has the figures.
package events
