package events

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tollgate/tollgate/gateway/internal/spool"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/internal/kafkalog"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// Errors of the producer, wrapped with the operation; match them with
// errors.Is.
var (
	// ErrConfig: New was given an invalid Config; the error lists every
	// problem.
	ErrConfig = errors.New("events: invalid config")
	// ErrNoPartitions: New could read the topic's partition count neither
	// from Kafka, nor from the spool's metadata, and Config.Partitions is 0.
	ErrNoPartitions = errors.New("events: partition count unknown")
	// ErrMetaVersion: the spool's metadata was written by a build with
	// another format. New logs it and starts without closing the earlier
	// epoch rather than failing.
	ErrMetaVersion = errors.New("events: unknown spool metadata version")
	// ErrRunning: Run was called while another Run of the producer runs.
	ErrRunning = errors.New("events: producer already running")
	// ErrClosed: Run was called after the producer stopped (a Run returned
	// or Close was called).
	ErrClosed = errors.New("events: producer closed")
)

// Defaults of Config.
const (
	DefaultMemoryBytes     = 8 << 20
	DefaultFlushInterval   = 100 * time.Millisecond
	DefaultLinger          = 20 * time.Millisecond
	DefaultShutdownTimeout = 5 * time.Second
	DefaultMetadataTimeout = 2 * time.Second
)

// Config configures a Producer. Brokers, GatewayID and SpoolDir are
// required.
type Config struct {
	// Brokers are the Kafka seed brokers (TOLLGATE_KAFKA_BROKERS).
	Brokers []string
	// Topic is the decisions topic; default tollgatev1.TopicDecisions.
	Topic string
	// GatewayID is written in every event; the gateway's configured id.
	GatewayID string
	// SpoolDir is the spool's directory, which the producer locks: one
	// producer per directory. Use DefaultSpoolDir(dataDir, GatewayID) so
	// that two gateways on one machine never share one.
	SpoolDir string
	// SpoolMaxBytes is the spool's disk budget; default
	// spool.DefaultMaxBytes (1 GiB). Past it decisions are dropped and
	// counted.
	SpoolMaxBytes int64
	// MemoryBytes bounds the events buffered in memory (default 8 MiB,
	// about 60,000 events; at least 64 KiB). It is cut into 32 chunks (of
	// 16 KiB to 1 MiB); the decision path fills one chunk at a time and
	// drops a decision when none is free, so size it to absorb a burst for
	// the time of a spool write (milliseconds) and FlushInterval of
	// decisions. It bounds what a SIGKILL may lose.
	MemoryBytes int
	// FlushInterval (default 100ms) bounds how long an event stays only in
	// memory: an event that Kafka has not acknowledged this long after its
	// chunk was started is written to the spool. It bounds what a SIGKILL
	// may lose.
	FlushInterval time.Duration
	// Linger (default 20ms) is how long a chunk waits for more events
	// before it is sent when Kafka keeps up: each send costs a produce
	// request and a few wake-ups, so at 100k decisions/s 20ms costs ~0.3 µs
	// less CPU per event than 5ms, for 15ms more delivery latency.
	Linger time.Duration
	// ShutdownTimeout (default 5s) is how long a stop waits for Kafka to
	// acknowledge what is buffered before writing the rest to the spool.
	ShutdownTimeout time.Duration
	// Partitions is the topic's partition count to number events by when
	// Kafka cannot tell at start and the spool does not remember it; 0: New
	// fails in that case (ErrNoPartitions).
	Partitions int32
	// MetadataTimeout (default 2s) bounds New's wait for the topic's
	// partition count from Kafka.
	MetadataTimeout time.Duration
	// FS is the file system of the spool; nil: the operating system's
	// (spool.OSFS). Tests give a spooltest.FS to fill the disk or fail
	// writes.
	FS spool.FS
	// LedgerDir is a tmpfs directory (default DefaultLedgerDir, /dev/shm;
	// "-": none) where the decision path's sequence counters live in
	// shared memory, so that after a SIGKILL the next start closes the
	// killed epoch with the last numbers used and the aggregator counts as
	// missing exactly what was lost. Without it (not tmpfs, not Linux, or
	// after a reboot) the epoch is closed with its reservations: up to
	// max(10,000, 2 s of the partition's rate) numbers per partition more
	// than were used count as missing.
	LedgerDir string
	// Log receives the producer's and franz-go's messages; nil: discard.
	Log *slog.Logger
	// Registerer receives the tollgate_events_* metrics; nil: none.
	Registerer prometheus.Registerer
}

// DefaultSpoolDir is the spool directory convention:
// <dataDir>/spool/<gatewayID>, the id path-escaped.
func DefaultSpoolDir(dataDir, gatewayID string) string {
	return filepath.Join(dataDir, "spool", url.PathEscape(gatewayID))
}

func (c *Config) setDefaults() {
	c.Topic = cmp.Or(c.Topic, tollgatev1.TopicDecisions)
	c.SpoolMaxBytes = cmp.Or(c.SpoolMaxBytes, spool.DefaultMaxBytes)
	c.MemoryBytes = cmp.Or(c.MemoryBytes, DefaultMemoryBytes)
	c.FlushInterval = cmp.Or(c.FlushInterval, DefaultFlushInterval)
	c.Linger = cmp.Or(c.Linger, DefaultLinger)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, DefaultShutdownTimeout)
	c.MetadataTimeout = cmp.Or(c.MetadataTimeout, DefaultMetadataTimeout)
	c.LedgerDir = cmp.Or(c.LedgerDir, DefaultLedgerDir)
	if c.FS == nil {
		c.FS = spool.OSFS{}
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
}

// validate reports every problem of a defaulted config.
func (c *Config) validate() error {
	var errs []error
	if len(c.Brokers) == 0 {
		errs = append(errs, errors.New("no Brokers"))
	}
	if c.GatewayID == "" {
		errs = append(errs, errors.New("no GatewayID"))
	}
	if len(c.GatewayID) > tollgatev1.MaxGatewayIDLen {
		errs = append(errs, fmt.Errorf("GatewayID longer than %d bytes", tollgatev1.MaxGatewayIDLen))
	}
	if c.SpoolDir == "" {
		errs = append(errs, errors.New("no SpoolDir"))
	}
	if c.SpoolMaxBytes < 0 {
		errs = append(errs, fmt.Errorf("negative SpoolMaxBytes %d", c.SpoolMaxBytes))
	}
	if c.MemoryBytes < minMemoryBytes {
		errs = append(errs, fmt.Errorf("MemoryBytes %d below %d", c.MemoryBytes, minMemoryBytes))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"FlushInterval", c.FlushInterval}, {"Linger", c.Linger}, {"ShutdownTimeout", c.ShutdownTimeout}, {"MetadataTimeout", c.MetadataTimeout}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("negative %s %v", d.name, d.v))
		}
	}
	if c.Partitions < 0 {
		errs = append(errs, fmt.Errorf("negative Partitions %d", c.Partitions))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrConfig, errors.Join(errs...))
	}
	return nil
}

// Memory layout: MemoryBytes is cut into chunks; a chunk holds frames of
// [payload length u32 | partition i32 | payload], little-endian.
const (
	minMemoryBytes = 64 << 10
	targetChunks   = 32
	minChunkBytes  = 16 << 10
	maxChunkBytes  = 1 << 20
	frameHeader    = 8
)

// Sequence reservations: a partition's range is extended by its step when
// fewer than step/2 numbers are left; the step is reserveFor of numbers at
// the partition's rate since the last extension, within [minReserve,
// maxReserve]. After a crash, up to a step of numbers reserved and never
// used count as missing (the aggregator's upper bound).
const (
	minReserve = 10_000
	maxReserve = 1 << 26
	reserveFor = 2 * time.Second
)

// In flight: one generation of at most maxInflight records handed to
// franz-go and not yet answered, from at most maxActive segments (chunks
// or spool segments).
const (
	maxInflight = 32 << 10
	maxActive   = 16
)

// dropLogEvery is how often drops are logged (once per interval with the
// counts, never per decision).
const dropLogEvery = 10 * time.Second

// Drop reasons, the values of tollgate_events_dropped_total's reason label.
const (
	dropSpoolFull = iota // memory full and the spool refused it (budget or disk full)
	dropOversized        // one event larger than a chunk
	dropClosed           // recorded after the producer stopped
	numDropReasons
)

var dropReasonNames = [numDropReasons]string{"spool_full", "oversized", "closed"}

// chunk is a fixed-size buffer of encoded events in memory.
type chunk struct {
	buf     []byte    // frames; cap is the chunk size
	n       int       // events in buf
	firstAt time.Time // when the first event was written
	pooled  bool      // returns to the free list once released
}

// Producer turns decisions into DecisionEvent records on Kafka. See the
// package comment for the pipeline and its guarantees. Record and Report
// are safe for concurrent use and never block; Run owns the sending.
type Producer struct {
	cfg        Config
	log        *slog.Logger
	sp         *spool.Spool
	parts      int32
	epoch      uint64
	chunkBytes int
	nChunks    int
	wake       chan struct{} // capacity 1: a pending wake-up of Run
	onProduced func(*kgo.Record, error)
	m          *metrics
	ledger     *ledger // nil: none; closed by the final stop

	// mu guards the decision path's state: the open chunk, the sealed
	// ones waiting for Run, the free list and the sequence counters. It is
	// held for the length of one event's encoding. Lock order: lifeMu, mu.
	mu          sync.Mutex
	open        *chunk
	sealed      []*chunk
	free        []*chunk
	next        []uint64 // next sequence number per partition
	reserved    []uint64 // last durably reserved number per partition
	lowWater    []uint64 // next[p] reaching it asks Run to reserve more (durable or not)
	needReserve bool
	closed      bool // Run's final seal happened: Record drops
	recorded    uint64
	dropped     [numDropReasons]uint64
	corrected   [numFixes]uint64 // events corrected to fit the schema's bounds
	shadow      []string         // the event's shadow ids, reused from event to event
	overruns    uint64
	memEvents   int64 // events in chunks not yet released
	memChunks   int   // chunks (pooled) in use

	// lifeMu guards the lifecycle.
	lifeMu  sync.Mutex
	state   int // stateNew, stateRunning, stateDone
	stop    chan struct{}
	stopped chan struct{} // closed when the producer is done
	stopErr error
	stopOne sync.Once

	// Written by franz-go's promise worker, read by Run and metrics.
	inflight   atomic.Int64
	produced   atomic.Uint64
	sendErrors atomic.Uint64
	failed     atomic.Bool // a record failed since Run last re-sent
	lastErr    atomic.Pointer[errBox]

	// Read by metrics, written by Run.
	metaDurable atomic.Bool // META holds the epoch and the numbers in use
	kafkaUp     atomic.Bool
	kafkaSince  atomic.Int64 // when kafkaUp last changed, Unix nanoseconds
	replayed    atomic.Uint64
	spooled     atomic.Uint64

	s sender // owned by the goroutine in Run (or by New and Close)
}

type errBox struct{ err error }

const (
	stateNew = iota
	stateRunning
	stateDone
)

// New opens the spool in cfg.SpoolDir, reads the topic's partition count
// from Kafka (waiting at most cfg.MetadataTimeout, and no longer than ctx
// allows; else the count the spool remembers, else cfg.Partitions), draws a new boot epoch and reserves its
// first sequence numbers durably in the spool's metadata. When the
// metadata names an earlier epoch, New queues one EpochClosed marker per
// partition of it, to be sent after the spool's segments and before any
// new event.
//
// New starts no goroutine of its own (the franz-go client that reads the
// partition count is closed before it returns). Call Run to send, and
// Close if Run is never called, to release the spool's lock.
func New(ctx context.Context, cfg Config) (*Producer, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	log := cfg.Log.With(slog.String("component", "events"))
	sp, err := spool.Open(cfg.FS, cfg.SpoolDir, spool.Options{MaxBytes: cfg.SpoolMaxBytes, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("events: new: %w", err)
	}
	var led *ledger
	if cfg.LedgerDir != "-" {
		if led, err = openLedger(cfg.LedgerDir, cfg.SpoolDir); err != nil {
			log.Warn("events: no sequence ledger in shared memory: after a SIGKILL the killed epoch is closed with its reservations, which overstates what was lost",
				slog.Any("error", err))
		}
	}
	p, err := newProducer(ctx, cfg, log, sp, led)
	if err != nil {
		led.close(false)
		_ = sp.Close()
		return nil, err
	}
	return p, nil
}

func newProducer(ctx context.Context, cfg Config, log *slog.Logger, sp *spool.Spool, led *ledger) (*Producer, error) {
	old := meta{}
	blob, err := sp.ReadMeta()
	switch {
	case err != nil:
		log.Error("events: the spool's metadata is unreadable; the previous epoch will not be closed, so a loss in it may go uncounted",
			slog.Any("error", err))
	case blob != nil:
		if old, err = decodeMeta(blob); err != nil {
			log.Error("events: the spool's metadata is unreadable; the previous epoch will not be closed, so a loss in it may go uncounted",
				slog.Any("error", err))
		}
	}
	closing := old.toClose()
	if led != nil && led.prevOK && exactClose(closing, led.prev) {
		log.Info("events: the previous epoch is closed with the last sequence numbers it used (sequence ledger)",
			slog.Uint64("epoch", led.prev.epoch))
	}

	parts, up := topicPartitions(ctx, cfg, log)
	switch {
	case parts > 0:
	case old.Partitions > 0:
		parts = old.Partitions
		log.Warn("events: the topic's partition count is unknown; using the one the spool remembers",
			slog.Int("partitions", int(parts)))
	case cfg.Partitions > 0:
		parts = cfg.Partitions
		log.Warn("events: the topic's partition count is unknown; using the configured one",
			slog.Int("partitions", int(parts)))
	default:
		return nil, fmt.Errorf("events: new: %w: Kafka did not answer within %v and Config.Partitions is 0",
			ErrNoPartitions, cfg.MetadataTimeout)
	}
	epoch, err := newEpoch(closing)
	if err != nil {
		return nil, err
	}

	chunkBytes := min(max(cfg.MemoryBytes/targetChunks, minChunkBytes), maxChunkBytes)
	p := &Producer{
		cfg:        cfg,
		log:        log,
		sp:         sp,
		parts:      parts,
		epoch:      epoch,
		chunkBytes: chunkBytes,
		nChunks:    cfg.MemoryBytes / chunkBytes,
		wake:       make(chan struct{}, 1),
		next:       make([]uint64, parts),
		reserved:   make([]uint64, parts),
		lowWater:   make([]uint64, parts),
		stop:       make(chan struct{}),
		stopped:    make(chan struct{}),
	}
	p.onProduced = p.promise
	p.setKafkaUp(up)
	// One allocation for all chunks: the runtime maps it lazily, so memory
	// is touched only as chunks fill.
	arena := make([]byte, p.nChunks*chunkBytes)
	p.free = make([]*chunk, 0, p.nChunks)
	for i := p.nChunks - 1; i >= 0; i-- {
		p.free = append(p.free, &chunk{buf: arena[i*chunkBytes : i*chunkBytes : (i+1)*chunkBytes], pooled: true})
	}
	p.s.init(p, closing)
	for q := range p.next {
		p.next[q] = 1
	}
	if p.m, err = newMetrics(p, cfg.Registerer); err != nil {
		return nil, fmt.Errorf("events: new: %w", err)
	}
	// The new epoch and its first reservations are made durable before
	// any number is used; the closing list stays until the markers are.
	// When META cannot be written (a full disk that a META of the first
	// format, or a copy-on-write file system, cannot be rewritten on; an
	// I/O error), the gateway still starts and decides: refusing would
	// keep the spool full, since replaying it is what frees the disk.
	// Event ids stay unique (the epoch is new and random); what is lost
	// until the write succeeds is the record of this epoch, which a
	// SIGKILL or crash would leave unclosed.
	if err := p.s.reserve(true); err != nil {
		log.Error("events: cannot record this epoch in the spool's metadata; deciding and numbering events anyway, and retrying every second. Until it succeeds a SIGKILL or machine crash leaves this epoch unclosed: a loss in it would go uncounted (tollgate_events_reservation_durable is 0)",
			slog.Any("error", err))
		// The ledger keeps the previous epoch's numbers until META names
		// them: the first successful write starts it.
		p.s.ledgerWait = led
	} else {
		// META names the numbers the previous epoch used: the ledger may
		// now count the new epoch's.
		p.startLedger(led)
	}
	if len(closing) > 0 {
		p.s.queueMarkers(closing)
	}
	p.s.backlog = sp.Stats().Segments
	log.Info("events: producer ready", slog.Uint64("epoch", epoch), slog.Int("partitions", int(parts)),
		slog.Int("spooled_segments", p.s.backlog), slog.Int("epochs_to_close", len(closing)))
	return p, nil
}

// startLedger makes led (nil: none) hold the decision path's counters,
// which are all 1 yet: p.next becomes the ledger's shared memory.
func (p *Producer) startLedger(led *ledger) {
	if led == nil {
		return
	}
	// Mapped outside p.mu (it writes a page); the counters are copied and
	// the epoch named under it, so the decision path loses no number when
	// Run starts the ledger while it records.
	next, err := led.counters(p.parts)
	if err != nil {
		p.log.Warn("events: no sequence ledger in shared memory: after a SIGKILL the killed epoch is closed with its reservations, which overstates what was lost",
			slog.Any("error", err))
		led.close(false)
		return
	}
	p.mu.Lock()
	copy(next, p.next)
	led.begin(p.epoch)
	p.ledger, p.next = led, next
	p.mu.Unlock()
}

// stopLedger gives the decision path's counters back to the heap and
// closes the ledger, deleting it when META holds the numbers used. Call it
// with p.closed set.
func (p *Producer) stopLedger(metaWritten bool) {
	if led := p.s.ledgerWait; led != nil {
		// Never started: it holds the previous epoch's numbers, which
		// META holds too once written.
		p.s.ledgerWait = nil
		led.close(metaWritten)
	}
	if p.ledger == nil {
		return
	}
	p.mu.Lock()
	p.next = append([]uint64(nil), p.next...)
	p.mu.Unlock()
	p.ledger.close(metaWritten)
	p.ledger = nil
}

// topicPartitions asks Kafka for the topic's partition count, within
// cfg.MetadataTimeout and ctx; 0 when it cannot tell. up reports whether Kafka
// answered.
func topicPartitions(ctx context.Context, cfg Config, log *slog.Logger) (n int32, up bool) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(cfg.Brokers...), kgo.WithLogger(kafkalog.New(log)))
	if err != nil {
		log.Warn("events: cannot create a Kafka client to read the topic's partitions", slog.Any("error", err))
		return 0, false
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, cfg.MetadataTimeout)
	defer cancel()
	td, err := kadm.NewClient(cl).ListTopics(ctx, cfg.Topic)
	if err != nil {
		log.Warn("events: cannot read the topic's partitions from Kafka", slog.String("topic", cfg.Topic), slog.Any("error", err))
		return 0, false
	}
	d, ok := td[cfg.Topic]
	if !ok || d.Err != nil || len(d.Partitions) == 0 {
		log.Warn("events: Kafka does not know the topic", slog.String("topic", cfg.Topic), slog.Any("error", d.Err))
		return 0, true
	}
	return int32(len(d.Partitions)), true
}

// setKafkaUp records whether Kafka acknowledges events, and since when.
// Only Run (or New, before it) calls it.
func (p *Producer) setKafkaUp(up bool) {
	if p.kafkaSince.Load() != 0 && p.kafkaUp.Load() == up {
		return
	}
	p.kafkaSince.Store(time.Now().UnixNano())
	p.kafkaUp.Store(up)
}

// KafkaState reports whether Kafka acknowledges the producer's events (as
// tollgate_events_kafka_up does: down after a failed send, or while records
// wait unanswered, and unchanged while nothing is sent), since when, and
// the last error franz-go reported (nil while up). It reads atomics only:
// it never waits on Kafka.
func (p *Producer) KafkaState() (up bool, since time.Time, err error) {
	up = p.kafkaUp.Load()
	since = time.Unix(0, p.kafkaSince.Load())
	if !up {
		if b := p.lastErr.Load(); b != nil {
			err = b.err
		}
	}
	return up, since, err
}

// Epoch is the producer's boot epoch.
func (p *Producer) Epoch() uint64 { return p.epoch }

// Partitions is the partition count the producer numbers events by.
func (p *Producer) Partitions() int32 { return p.parts }

// Record turns a check's decision into a KIND_DECISION event: admissions
// and rejections (status 200, 429, 403). Peeks and invalid requests (400)
// are not events; a check that failed has no decision and is not recorded.
// req gives the method and the client IP (it may be nil); d gives the rest
// (d.Tenant is "" for an anonymous request, and stays "": the aggregator
// groups those under the empty tenant). surface names where the decision
// was asked for ("proxy", "check", "batch", "rls", "authz").
//
// Record copies what it needs before it returns and keeps no reference to
// req or d. It never blocks on I/O and does not allocate: it encodes the
// event into the open in-memory chunk under a short lock. When memory is
// full and the spool refuses more (its budget spent), the event is
// dropped and counted in tollgate_events_dropped_total; its sequence
// number is used all the same, so the aggregator counts the gap. Safe for
// concurrent use, before, during and after Run (after Run returned, events
// are dropped with reason "closed").
func (p *Producer) Record(req *guard.Request, d *guard.Decision, surface string) {
	if d == nil || d.Peek || !recordable(d.Status) {
		return
	}
	p.record(kindDecision, req, d, surface)
}

// Report turns a charge after the fact (guard.Report: /v1/report, the
// proxy's response cost) into a KIND_REPORT event, which adds d.Cost to the
// key's usage and counts as neither an admission nor a rejection. It is
// recorded under the same statuses as Record (a 400, e.g. a cost above the
// maximum, charged nothing) and has Record's other properties.
func (p *Producer) Report(req *guard.Request, d *guard.Decision, surface string) {
	if d == nil || d.Peek || !recordable(d.Status) {
		return
	}
	p.record(kindReport, req, d, surface)
}

func recordable(status int) bool { return status == 200 || status == 429 || status == 403 }

func (p *Producer) record(k kind, req *guard.Request, d *guard.Decision, surface string) {
	// Decisions made without Redis (blocklist, allowlist, no rule) carry
	// no Redis time: they get the gateway's clock, and so does one whose
	// Redis clock is too far from it for the aggregator to take.
	t, now := d.Time, time.Now().UnixMicro()
	var fx fixes
	if ahead := tollgatev1.MaxEventAhead.Microseconds(); t < now-ahead || t > now+ahead {
		if t != 0 {
			fx = 1 << fixTime
		}
		t = now
	}
	var ip [maxIPText]byte
	ev := eventOf(k, t, req, d, surface, ip[:0])
	// The tenant as the event holds it (cut to its bound) chooses the
	// partition, so that the partition, the record key and the event agree.
	part := PartitionOf(tollgatev1.FieldTenant.Cut(d.Tenant), p.parts)
	ev.GatewayID, ev.Epoch, ev.Partition = p.cfg.GatewayID, p.epoch, part
	signal := false

	p.mu.Lock()
	if p.closed {
		p.dropped[dropClosed]++
		p.mu.Unlock()
		return
	}
	seq := p.next[part]
	p.next[part] = seq + 1
	if seq >= p.lowWater[part] {
		p.needReserve, signal = true, true
	}
	if seq > p.reserved[part] {
		p.overruns++
	}
	p.shadow = shadowIDs(p.shadow[:0], d)
	ev.Seq, ev.ShadowWouldReject = seq, p.shadow
	need := frameHeader + tollgatev1.MaxDecisionSize(&ev)
	c := p.open
	if c == nil || len(c.buf)+need > cap(c.buf) {
		if need > p.chunkBytes {
			p.dropped[dropOversized]++
			p.mu.Unlock()
			p.signal(signal)
			return
		}
		if c != nil {
			p.sealed = append(p.sealed, c)
			p.open, signal = nil, true
		}
		if len(p.free) == 0 {
			p.dropped[dropSpoolFull]++
			p.mu.Unlock()
			p.signal(signal)
			return
		}
		c = p.free[len(p.free)-1]
		p.free = p.free[:len(p.free)-1]
		p.memChunks++
		p.open = c
	}
	if c.n == 0 {
		c.firstAt = time.Now()
		signal = true
	}
	start := len(c.buf)
	b := append(c.buf, make([]byte, frameHeader)...)
	b, corrected := tollgatev1.AppendDecision(b, &ev)
	if corrected != 0 {
		fx |= fixesOf(corrected)
	}
	if fx != 0 {
		for i := range numFixes {
			if fx&(1<<i) != 0 {
				p.corrected[i]++
			}
		}
	}
	binary.LittleEndian.PutUint32(b[start:], uint32(len(b)-start-frameHeader))
	binary.LittleEndian.PutUint32(b[start+4:], uint32(part))
	c.buf = b
	c.n++
	p.recorded++
	p.memEvents++
	p.mu.Unlock()
	p.signal(signal)
}

// signal wakes Run if s, without blocking.
func (p *Producer) signal(s bool) {
	if !s {
		return
	}
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Run sends the buffered events to Kafka until ctx is done or Close is
// called, then drains: it waits up to Config.ShutdownTimeout for Kafka to
// acknowledge what is buffered (not at all when Kafka is down), writes the
// rest to the spool, records the last sequence numbers used, and closes
// the spool. A graceful stop loses nothing but what the spool's budget
// refuses (counted as dropped and logged). Run returns nil after a stop;
// an error when franz-go's client cannot be created (after spooling what
// is buffered) or when the final metadata write or the spool's close
// fails. Events recorded after Run's final seal are dropped.
//
// Run runs the pipeline in the calling goroutine; it starts franz-go's
// client and a flusher goroutine and stops and waits for both before it
// returns. It may be called once; a second call returns ErrRunning or
// ErrClosed.
func (p *Producer) Run(ctx context.Context) error {
	p.lifeMu.Lock()
	switch p.state {
	case stateRunning:
		p.lifeMu.Unlock()
		return fmt.Errorf("events: run: %w", ErrRunning)
	case stateDone:
		p.lifeMu.Unlock()
		return fmt.Errorf("events: run: %w", ErrClosed)
	}
	p.state = stateRunning
	p.lifeMu.Unlock()

	err := p.s.run(ctx)

	p.lifeMu.Lock()
	p.state = stateDone
	p.stopErr = err
	p.lifeMu.Unlock()
	close(p.stopped)
	return err
}

// Close stops the producer: if Run is running, it signals it to stop (the
// same drain as a cancelled ctx) and waits for it to return; if Run was
// never called, it writes what is buffered to the spool and closes it.
// Close is idempotent and safe for concurrent use; it returns what the stop
// returned.
func (p *Producer) Close() error {
	p.stopOne.Do(func() { close(p.stop) })
	p.lifeMu.Lock()
	if p.state == stateNew {
		p.state = stateDone
		p.lifeMu.Unlock()
		err := p.s.finish(nil)
		p.lifeMu.Lock()
		p.stopErr = err
		p.lifeMu.Unlock()
		close(p.stopped)
		return err
	}
	p.lifeMu.Unlock()
	<-p.stopped
	p.lifeMu.Lock()
	defer p.lifeMu.Unlock()
	return p.stopErr
}

// promise is franz-go's callback for every record, called serially by its
// promise worker: it marks the record acknowledged or notes the failure,
// and wakes Run when a segment completed, the in-flight window emptied or
// a record failed.
func (p *Producer) promise(r *kgo.Record, err error) {
	ref := r.Context.(*recRef)
	seg := ref.seg
	if err != nil {
		// Noted before the record leaves the in-flight count, so that Run,
		// seeing the generation answered, sees the failure too.
		p.sendErrors.Add(1)
		p.lastErr.Store(&errBox{err})
		p.failed.Store(true)
		p.inflight.Add(-1)
		p.signal(true)
		return
	}
	n := int32(len(seg.items))
	seg.acked[ref.i].Store(true)
	p.produced.Add(1)
	// The last acknowledgement lets Run recycle seg: touch it no more.
	done := seg.nAcked.Add(1) == n
	left := p.inflight.Add(-1)
	p.signal(done || left == 0)
}
