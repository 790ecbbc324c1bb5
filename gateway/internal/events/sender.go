package events

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tollgate/tollgate/gateway/internal/spool"
	"github.com/tollgate/tollgate/internal/kafkalog"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// segment is one element of the FIFO: a sealed chunk, a segment read back
// from the spool, or the EpochClosed markers.
type segment struct {
	chunk   *chunk    // the events in memory; nil once released, or read from the spool
	spoolID uint64    // its id in the spool; 0 while it is only in memory
	firstAt time.Time // when its first event was recorded
	closes  []uint64  // the epochs whose markers it holds
	n       int       // records

	// Set once the segment is active (being produced).
	activated bool
	items     []item
	krecs     []kgo.Record // handed to franz-go; reused only once answered
	refs      []recRef
	acked     []atomic.Bool
	nAcked    atomic.Int32
	next      int // next item to hand to franz-go
}

// item is one record of a segment.
type item struct {
	part     int32
	key, val []byte
}

// recRef is a record's context: it tells the promise which record of
// which segment franz-go answered for, without a closure per record. As a
// context it is context.Background: its methods read no field, because
// franz-go may still call Done on a record's context after answering it
// (waitUnknownTopic), when Run already reuses the recRef for another
// record.
type recRef struct {
	seg *segment
	i   int
}

var _ context.Context = (*recRef)(nil)

func (*recRef) Deadline() (time.Time, bool) { return time.Time{}, false }
func (*recRef) Done() <-chan struct{}       { return nil }
func (*recRef) Err() error                  { return nil }
func (*recRef) Value(any) any               { return nil }

func (g *segment) complete() bool { return g.activated && int(g.nAcked.Load()) == len(g.items) }

// sender is the state of the pipeline owned by the goroutine in Run.
//
// The FIFO, oldest first, is active (segments being produced, in order),
// then the spool's segments not yet read (backlog of them, with ids above
// cursor), then pending (sealed chunks in memory, in order). Invariant:
// the segments in the spool are a prefix of the FIFO. Segments are spilled
// to the spool only in FIFO order (the first one not in it), so the
// spool's order is the FIFO's; pending segments are activated only when
// the backlog is empty, and spool segments only in id order.
type sender struct {
	p       *Producer
	cl      *kgo.Client
	active  []*segment
	backlog int    // spool segments not yet read
	cursor  uint64 // the largest spool id read or written while active
	pending []*segment

	closing    []epochState // epochs whose markers are not yet durable
	reserved   []uint64     // the durable reservations (what META says)
	want       []uint64     // the reservations the decision path was given, durable or not
	durable    bool         // META holds the epoch and want
	metaFailed bool         // the last META write failed
	metaRetry  time.Time    // while not durable: when to try writing META again
	// ledgerWait is the sequence ledger while META has not yet named the
	// previous epoch's numbers (its first write failed): the first write
	// that succeeds starts it.
	ledgerWait *ledger
	step       []uint64
	lastExt    []time.Time // when each partition's range was last extended
	usedAtExt  []uint64    // and the last number used then

	backoff      time.Duration
	backoffUntil time.Time
	spillRetryAt time.Time
	lastProduced uint64
	lastProgress time.Time
	lastDropLog  time.Time
	loggedDrops  [numDropReasons]uint64
	lastFixLog   time.Time
	loggedFixes  [numFixes]uint64
	lastErrLog   time.Time
	recs         []spool.Record // scratch for spool.Append
	spare        []*segment     // recycled segments
	sealedSpare  []*chunk       // swapped with Producer.sealed
	nextScratch  []uint64
	maxActive    int

	flushReq chan struct{} // capacity 1: a generation to send
	// flushing is set when a generation is handed to franz-go and cleared
	// when its Flush has returned: every record of it answered and
	// franz-go's buffer empty. See fill.
	flushing  atomic.Bool
	stopFlush context.CancelFunc
	flushDone chan struct{} // closed when the flusher returned
}

func (s *sender) init(p *Producer, closing []epochState) {
	s.p = p
	s.closing = closing
	s.reserved = make([]uint64, p.parts)
	s.want = make([]uint64, p.parts)
	s.step = make([]uint64, p.parts)
	s.lastExt = make([]time.Time, p.parts)
	s.usedAtExt = make([]uint64, p.parts)
	now := time.Now()
	for q := range s.step {
		s.step[q], s.lastExt[q] = minReserve, now
	}
	s.nextScratch = make([]uint64, p.parts)
	// The decision path appends to sealed without allocating: at most
	// nChunks chunks are ever sealed at once.
	p.sealed = make([]*chunk, 0, p.nChunks)
	s.sealedSpare = make([]*chunk, 0, p.nChunks)
	// Active chunks keep their memory until Kafka answers: a quarter of it
	// at most, so that spilling can always free the rest.
	s.maxActive = max(2, min(maxActive, p.nChunks/4))
	s.flushReq = make(chan struct{}, 1)
}

// queueMarkers queues one EpochClosed marker per partition of each epoch in
// closing that numbered events there, as the first pending segment: after
// the spool's segments (older events) and before any new event.
func (s *sender) queueMarkers(closing []epochState) {
	now := time.Now()
	var buf []byte
	n := 0
	var epochs []uint64
	for _, e := range closing {
		epochs = append(epochs, e.Epoch)
		for q, last := range e.Reserved {
			if last == 0 {
				continue
			}
			start := len(buf)
			buf = append(buf, make([]byte, frameHeader)...)
			buf = appendMarker(buf, e.GatewayID, e.Epoch, int32(q), last, now.UnixMicro())
			binary.LittleEndian.PutUint32(buf[start:], uint32(len(buf)-start-frameHeader))
			binary.LittleEndian.PutUint32(buf[start+4:], uint32(q))
			n++
		}
	}
	if n == 0 {
		s.closing = nil
		return
	}
	s.pending = append(s.pending, &segment{chunk: &chunk{buf: buf, n: n, firstAt: now}, firstAt: now, closes: epochs, n: n})
}

// writeMeta makes META say the current epoch, reserved and closing. Once
// it succeeded, the decision path's numbers up to reserved are durable;
// after a failure, every later round tries again (once per
// metaRetryEvery) until a write succeeds.
func (s *sender) writeMeta(reserved []uint64) error {
	p := s.p
	m := meta{Version: metaVersion, GatewayID: p.cfg.GatewayID, Epoch: p.epoch, Partitions: p.parts,
		Reserved: reserved, Closing: s.closing}
	blob, err := m.encode()
	if err == nil {
		err = p.sp.WriteMeta(blob)
	}
	if err != nil {
		s.durable, s.metaFailed, s.metaRetry = false, true, time.Now().Add(metaRetryEvery)
		p.metaDurable.Store(false)
		return fmt.Errorf("events: write spool metadata: %w", err)
	}
	if s.metaFailed {
		s.metaFailed = false
		p.log.Info("events: the spool's metadata is written again: this epoch and its sequence reservation are durable")
	}
	s.durable = true
	p.metaDurable.Store(true)
	s.reserved = append(s.reserved[:0], reserved...)
	p.mu.Lock()
	for q := range reserved {
		p.reserved[q] = reserved[q]
	}
	p.mu.Unlock()
	if led := s.ledgerWait; led != nil {
		// META now names the numbers the previous epoch used.
		s.ledgerWait = nil
		p.startLedger(led)
	}
	return nil
}

// metaRetryEvery is how often a META write that failed is tried again.
const metaRetryEvery = time.Second

// reserve extends the reservation of every partition with fewer than half
// its step left (all of them when force), lets the decision path use the
// new numbers, and writes them to META. The step is about reserveFor of
// numbers at the partition's recent rate, at least minReserve.
//
// The decision path never waits for the write: numbers beyond the durable
// reservation are counted as overruns (tollgate_events_reservation_-
// overruns_total). When the write fails (a full disk META cannot be
// rewritten on, an I/O error), it is tried again every metaRetryEvery, and
// meanwhile the decision path goes on within the new range, so that it
// does not ask for more at every event.
func (s *sender) reserve(force bool) error {
	p := s.p
	now := time.Now()
	retry := !s.durable && !now.Before(s.metaRetry)
	p.mu.Lock()
	if !force && !p.needReserve && !retry {
		p.mu.Unlock()
		return nil
	}
	p.needReserve = false
	copy(s.nextScratch, p.next)
	p.mu.Unlock()

	res := append([]uint64(nil), s.want...)
	extended := false
	for q := range res {
		used := s.nextScratch[q] - 1
		if res[q] >= used+s.step[q]/2 && !force {
			continue
		}
		// A range lasts about reserveFor at the rate seen since the last
		// extension, so that half of it leaves ample time for the next
		// META write.
		if el := now.Sub(s.lastExt[q]); el > 0 && used > s.usedAtExt[q] {
			rate := float64(used-s.usedAtExt[q]) / el.Seconds()
			s.step[q] = uint64(min(max(rate*reserveFor.Seconds(), minReserve), maxReserve))
		}
		s.lastExt[q], s.usedAtExt[q] = now, used
		res[q] = used + s.step[q]
		extended = true
	}
	if extended {
		s.want = res
		p.mu.Lock()
		for q := range res {
			p.lowWater[q] = res[q] - s.step[q]/2
		}
		p.mu.Unlock()
	}
	if !force && !(extended && s.durable) && !retry {
		return nil // unchanged, or META failing and not yet due again
	}
	if err := s.writeMeta(s.want); err != nil {
		return fmt.Errorf("events: reserve sequence numbers: %w", err)
	}
	return nil
}

// run is Run's body.
func (s *sender) run(ctx context.Context) error {
	p := s.p
	opts := []kgo.Opt{
		kgo.SeedBrokers(p.cfg.Brokers...),
		kgo.DefaultProduceTopic(p.cfg.Topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerBatchCompression(kgo.SnappyCompression(), kgo.NoCompression()),
		kgo.ManualFlushing(), // generations: see fill
		kgo.MaxBufferedRecords(maxInflight + 1),
		kgo.UnknownTopicRetries(-1), // a missing topic is Kafka being down
		kgo.WithLogger(kafkalog.New(p.log)),
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return s.finish(fmt.Errorf("events: run: create Kafka client: %w", err))
	}
	s.cl = cl
	flushCtx, stopFlush := context.WithCancel(context.Background())
	s.stopFlush = stopFlush
	s.flushDone = make(chan struct{})
	go func() { // owned by run: finish stops and waits for it
		defer close(s.flushDone)
		s.flush(flushCtx)
	}()

	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	done, stop := ctx.Done(), p.stop
	stopping := false
	var deadline time.Time
	s.lastProgress = time.Now()
	for {
		now := time.Now()
		if !stopping && (ctx.Err() != nil || isClosed(p.stop)) {
			stopping, done, stop = true, nil, nil
			deadline = now.Add(p.cfg.ShutdownTimeout)
			if !p.kafkaUp.Load() {
				deadline = now // Kafka is down: spool at once
			}
			p.log.Info("events: stopping", slog.Bool("kafka_up", p.kafkaUp.Load()), slog.Duration("deadline", deadline.Sub(now)))
		}
		s.work(now, stopping)
		if stopping && !p.kafkaUp.Load() {
			deadline = now // Kafka went down while draining: spool the rest
		}
		if stopping && (s.drained() || !now.Before(deadline)) {
			break
		}
		timer.Reset(s.wait(now, stopping, deadline))
		select {
		case <-done:
		case <-stop:
		case <-p.wake:
		case <-timer.C:
		}
	}
	return s.finish(nil)
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// work does one round of the pipeline.
func (s *sender) work(now time.Time, stopping bool) {
	p := s.p
	s.collect(now, stopping)
	s.reap(now)
	if err := s.reserve(false); err != nil {
		s.logErr(now, "events: cannot reserve sequence numbers; events go on beyond the durable reservation", err)
	}
	s.spill(now, false)
	s.fill(now)

	// Kafka's state: up once it acknowledges; down after a failure, or
	// when records in flight saw no acknowledgement for a while; unchanged
	// while nothing is in flight (New's metadata lookup sets the first).
	up := p.kafkaUp.Load()
	switch prod := p.produced.Load(); {
	case p.failed.Load() || now.Before(s.backoffUntil):
		up = false
	case prod != s.lastProduced:
		s.lastProduced, s.lastProgress, up = prod, now, true
	case p.inflight.Load() == 0:
		s.lastProgress = now
	case now.Sub(s.lastProgress) >= s.stuckAfter():
		up = false
	}
	if up != p.kafkaUp.Load() {
		p.setKafkaUp(up)
		if up {
			p.log.Info("events: Kafka is accepting events")
		} else {
			p.log.Warn("events: Kafka is not acknowledging events; buffering and spooling them", slog.Any("error", s.lastErr()))
		}
	}
	s.logDrops(now)
	s.logFixes(now)
}

// stuckAfter is how long records may wait for an acknowledgement before
// Kafka counts as down.
func (s *sender) stuckAfter() time.Duration { return max(10*s.p.cfg.FlushInterval, time.Second) }

func (s *sender) lastErr() error {
	if b := s.p.lastErr.Load(); b != nil {
		return b.err
	}
	return nil
}

// collect takes the chunks the decision path sealed, and seals the open
// chunk when it is due: at once when stopping, after FlushInterval (so it
// can be spooled), or after Linger when it could be sent at once.
func (s *sender) collect(now time.Time, stopping bool) {
	p := s.p
	idle := s.idle(now)
	p.mu.Lock()
	if c := p.open; c != nil && c.n > 0 {
		age := now.Sub(c.firstAt)
		if stopping || age >= p.cfg.FlushInterval || (idle && age >= p.cfg.Linger) {
			p.sealed = append(p.sealed, c)
			p.open = nil
		}
	}
	sealed := p.sealed
	p.sealed = s.sealedSpare[:0]
	p.mu.Unlock()
	for _, c := range sealed {
		g := s.newSegment()
		g.chunk, g.firstAt, g.n = c, c.firstAt, c.n
		s.pending = append(s.pending, g)
	}
	clear(sealed)
	s.sealedSpare = sealed[:0]
}

// idle reports whether a chunk sealed now would be sent at once.
func (s *sender) idle(now time.Time) bool {
	return len(s.pending) == 0 && s.backlog == 0 && len(s.active) < s.maxActive &&
		s.p.inflight.Load() == 0 && !s.flushing.Load() && !s.p.failed.Load() && !now.Before(s.backoffUntil)
}

// newSegment returns a recycled or new segment.
func (s *sender) newSegment() *segment {
	if n := len(s.spare); n > 0 {
		g := s.spare[n-1]
		s.spare = s.spare[:n-1]
		return g
	}
	return &segment{}
}

// recycle keeps g's storage for a later segment.
func (s *sender) recycle(g *segment) {
	items, krecs, refs, acked := g.items[:0], g.krecs[:0], g.refs[:0], g.acked[:0]
	clear(g.items[:cap(g.items)])
	clear(g.krecs[:cap(g.krecs)])
	g.chunk, g.spoolID, g.firstAt, g.closes, g.n, g.next, g.activated = nil, 0, time.Time{}, nil, 0, 0, false
	g.items, g.krecs, g.refs, g.acked = items, krecs, refs, acked
	g.nAcked.Store(0)
	if len(s.spare) < s.maxActive {
		s.spare = append(s.spare, g)
	}
}

// reap handles franz-go's answers: after a failure it waits for every
// record in flight to be answered, then re-sends, in FIFO order, every
// record not acknowledged (with a backoff); completed segments leave the
// FIFO, the spool and memory.
func (s *sender) reap(now time.Time) {
	p := s.p
	if p.failed.Load() && p.inflight.Load() == 0 && s.cl != nil { // no client: the final stop failed them
		p.failed.Store(false)
		s.backoff = min(max(2*s.backoff, 100*time.Millisecond), 5*time.Second)
		s.backoffUntil = now.Add(s.backoff)
		for _, g := range s.active {
			g.next = 0
		}
		s.logErr(now, "events: Kafka failed records; re-sending them in order", s.lastErr())
	}
	kept := s.active[:0]
	for _, g := range s.active {
		if !g.complete() {
			kept = append(kept, g)
			continue
		}
		s.backoff = 0
		s.release(g)
		if g.spoolID != 0 {
			if err := p.sp.Remove(g.spoolID); err != nil {
				s.logErr(now, "events: cannot remove a delivered segment from the spool; it will be sent again", err)
			}
		}
		if g.closes != nil {
			s.markersDurable(now)
		}
		s.recycle(g)
	}
	clear(s.active[len(kept):])
	s.active = kept
}

// release returns g's chunk to the free list.
func (s *sender) release(g *segment) {
	c := g.chunk
	if c == nil {
		return
	}
	g.chunk = nil
	if !c.pooled {
		return // the markers' buffer
	}
	p := s.p
	p.mu.Lock()
	p.memEvents -= int64(c.n)
	c.buf, c.n = c.buf[:0], 0
	p.free = append(p.free, c)
	p.memChunks--
	p.mu.Unlock()
}

// markersDurable drops the closed epochs from META once their markers are
// in the spool or in Kafka.
func (s *sender) markersDurable(now time.Time) {
	if s.closing == nil {
		return
	}
	s.closing = nil
	if err := s.writeMeta(s.want); err != nil {
		s.logErr(now, "events: cannot update the spool's metadata; the closed epochs will be closed again after a restart", err)
	}
}

// firstUnspooled returns the oldest segment not in the spool, or nil.
func (s *sender) firstUnspooled() *segment {
	for _, g := range s.active {
		if g.spoolID == 0 && !g.complete() {
			return g
		}
	}
	if len(s.pending) > 0 {
		return s.pending[0]
	}
	return nil
}

// spill writes segments to the spool, oldest first, while the oldest one
// not in it is due: its first event is FlushInterval old, memory is short
// (a quarter of the chunks left), or all (the final stop). Active segments
// are written one by one and keep their chunk until Kafka answers; the
// pending segments due are written together as one spool segment (one
// fsync for them all) and free their chunks.
func (s *sender) spill(now time.Time, all bool) {
	p := s.p
	if !all && now.Before(s.spillRetryAt) {
		return
	}
	due := func(g *segment) bool {
		if all {
			return true
		}
		p.mu.Lock()
		short := len(p.free) < p.nChunks/4
		p.mu.Unlock()
		return short || now.Sub(g.firstAt) >= p.cfg.FlushInterval
	}
	for {
		g := s.firstUnspooled()
		if g == nil || !due(g) {
			return
		}
		// Spool writes take milliseconds: keep the reservations ahead of
		// the decision path between them.
		if err := s.reserve(false); err != nil {
			s.logErr(now, "events: cannot reserve sequence numbers; events go on beyond the durable reservation", err)
		}
		var err error
		if len(s.pending) > 0 && s.pending[0] == g {
			n := 1
			for n < len(s.pending) && n < maxSpillBatch && (all || now.Sub(s.pending[n].firstAt) >= p.cfg.FlushInterval) {
				n++
			}
			if len(s.pending) > n && !all {
				// Memory is short: write what is sealed.
				p.mu.Lock()
				if len(p.free) < p.nChunks/4 {
					n = min(len(s.pending), maxSpillBatch)
				}
				p.mu.Unlock()
			}
			err = s.spillPending(n)
			if errors.Is(err, spool.ErrFull) && n > 1 {
				err = s.spillPending(1) // a smaller segment may fit
			}
		} else {
			err = s.spillActive(g)
		}
		if err != nil {
			if all {
				// The final stop: these events are lost.
				s.dropSegment(g, err)
				continue
			}
			s.spillRetryAt = now.Add(p.cfg.FlushInterval)
			s.logErr(now, "events: cannot write to the spool; events stay in memory, and are dropped once it is full", err)
			return
		}
	}
}

// maxSpillBatch bounds the pending segments written as one spool segment
// (and so what one spool segment holds: a replay reads it whole).
const maxSpillBatch = 8

// spillPending appends the first n pending segments to the spool as one
// segment; they join the backlog and free their chunks.
func (s *sender) spillPending(n int) error {
	p := s.p
	s.recs = s.recs[:0]
	events := 0
	for _, g := range s.pending[:n] {
		s.recs = appendFrames(s.recs, g.chunk.buf)
		events += g.n
	}
	err := p.sp.Append(s.recs)
	clear(s.recs)
	if err != nil {
		return fmt.Errorf("events: spool %d events: %w", events, err)
	}
	p.spooled.Add(uint64(events))
	s.backlog++
	for i, g := range s.pending[:n] {
		if g.closes != nil {
			s.markersDurable(time.Now())
		}
		s.release(g)
		s.recycle(g)
		s.pending[i] = nil
	}
	s.pending = s.pending[n:]
	return nil
}

// spillActive appends an active segment to the spool; it keeps its chunk
// until Kafka answers.
func (s *sender) spillActive(g *segment) error {
	p := s.p
	s.recs = s.recs[:0]
	for _, it := range g.items {
		s.recs = append(s.recs, spool.Record{Partition: it.part, Payload: it.val})
	}
	err := p.sp.Append(s.recs)
	clear(s.recs)
	if err != nil {
		return fmt.Errorf("events: spool %d events: %w", g.n, err)
	}
	p.spooled.Add(uint64(g.n))
	if g.closes != nil {
		s.markersDurable(time.Now())
		g.closes = nil
	}
	// Learn its id (the backlog is empty, so it is the segment after
	// cursor), to remove it once Kafka acknowledged it.
	seg, err := p.sp.Next(s.cursor)
	if err != nil {
		return fmt.Errorf("events: find a spooled segment's id: %w", err)
	}
	g.spoolID, s.cursor = seg.ID, seg.ID
	return nil
}

// appendFrames appends the records of a chunk's frames to recs.
func appendFrames(recs []spool.Record, b []byte) []spool.Record {
	for len(b) >= frameHeader {
		n := int(binary.LittleEndian.Uint32(b))
		part := int32(binary.LittleEndian.Uint32(b[4:]))
		recs = append(recs, spool.Record{Partition: part, Payload: b[frameHeader : frameHeader+n : frameHeader+n]})
		b = b[frameHeader+n:]
	}
	return recs
}

// dropSegment counts g's events as lost (the spool refused them at the
// final stop) and takes g out of the FIFO.
func (s *sender) dropSegment(g *segment, err error) {
	p := s.p
	n := g.n
	if g.activated {
		n -= int(g.nAcked.Load())
	}
	p.mu.Lock()
	p.dropped[dropSpoolFull] += uint64(n)
	p.mu.Unlock()
	p.log.Error("events: the spool refused events at stop; they are lost", slog.Int("events", n), slog.Any("error", err))
	if len(s.pending) > 0 && s.pending[0] == g {
		s.pending[0] = nil
		s.pending = s.pending[1:]
	} else {
		for i, a := range s.active {
			if a == g {
				s.active = append(s.active[:i], s.active[i+1:]...)
				break
			}
		}
	}
	s.release(g)
}

// fill hands franz-go the next generation: the records not yet
// acknowledged, in FIFO order, activating segments as needed, at most
// maxInflight; then asks the flusher to send them. It does nothing while
// the previous generation has records unanswered, while a failure is being
// answered, or during the backoff after one.
//
// Why generations: franz-go sends nothing until flushed (ManualFlushing),
// so a generation is wholly in its buffers before any of it is sent. When
// a batch fails, franz-go fails every record buffered on its partition and
// the broker refuses later batches by sequence; as no record is handed over
// until the whole generation is answered, nothing produced after the
// failure can overtake the failed records, which are re-sent first.
//
// "Answered" is the previous Flush having returned, not only every promise
// having run: franz-go runs a record's promise before it takes the record
// out of its buffer, and while a Flush waits for that buffer to empty it
// sends whatever is produced at once. A generation handed over then would
// go out record by record as fill hands it, so a batch of it could fail
// while a later record of its partition was still to be handed, and that
// record would be written first (under the new producer epoch the failure
// starts) and the failed ones after it.
func (s *sender) fill(now time.Time) {
	p := s.p
	if s.cl == nil || p.failed.Load() || now.Before(s.backoffUntil) || p.inflight.Load() > 0 || s.flushing.Load() {
		return
	}
	n := 0
	for _, g := range s.active {
		if n = s.produce(g, n); n == maxInflight {
			break
		}
	}
	for n < maxInflight && len(s.active) < s.maxActive {
		g, err := s.activate()
		if err != nil {
			s.logErr(now, "events: cannot read the spool; retrying", err)
			break
		}
		if g == nil {
			break
		}
		s.active = append(s.active, g)
		n = s.produce(g, n)
	}
	if n > 0 {
		s.flushing.Store(true)
		s.flushReq <- struct{}{} // never blocks: the flusher took the last one and has returned from its Flush
	}
}

// activate takes the next segment of the FIFO: from the spool while its
// backlog is not empty, else the oldest pending one; nil when none.
func (s *sender) activate() (*segment, error) {
	p := s.p
	if s.backlog > 0 {
		seg, err := p.sp.Next(s.cursor)
		if errors.Is(err, io.EOF) {
			// Quarantined or removed behind our back (logged by the spool).
			s.backlog = 0
		} else if err != nil {
			return nil, fmt.Errorf("events: read the spool: %w", err)
		} else {
			s.backlog--
			s.cursor = seg.ID
			g := s.newSegment()
			g.spoolID, g.n, g.firstAt = seg.ID, len(seg.Records), time.Now()
			for _, r := range seg.Records {
				g.items = append(g.items, item{part: r.Partition, key: tollgatev1.DecisionTenant(r.Payload), val: r.Payload})
			}
			p.replayed.Add(uint64(len(seg.Records)))
			s.prepare(g)
			return g, nil
		}
	}
	if len(s.pending) == 0 {
		return nil, nil
	}
	g := s.pending[0]
	s.pending[0] = nil
	s.pending = s.pending[1:]
	b := g.chunk.buf
	for len(b) >= frameHeader {
		n := int(binary.LittleEndian.Uint32(b))
		part := int32(binary.LittleEndian.Uint32(b[4:]))
		val := b[frameHeader : frameHeader+n : frameHeader+n]
		g.items = append(g.items, item{part: part, key: tollgatev1.DecisionTenant(val), val: val})
		b = b[frameHeader+n:]
	}
	s.prepare(g)
	return g, nil
}

// prepare sizes g's per-record state for its items.
func (s *sender) prepare(g *segment) {
	n := len(g.items)
	if cap(g.refs) < n {
		g.krecs = make([]kgo.Record, n)
		g.refs = make([]recRef, n)
		g.acked = make([]atomic.Bool, n)
	}
	g.krecs, g.refs, g.acked = g.krecs[:n], g.refs[:n], g.acked[:n]
	for i := range g.refs {
		g.refs[i] = recRef{seg: g, i: i}
		g.acked[i].Store(false)
	}
	g.nAcked.Store(0)
	g.next = 0
	g.activated = true
}

// produce hands g's records not yet handed (and not acknowledged) to
// franz-go in order, while the generation has fewer than maxInflight; n is
// the generation's size so far, and the new size is returned.
func (s *sender) produce(g *segment, n int) int {
	p := s.p
	ts := time.Now()
	for ; g.next < len(g.items) && n < maxInflight; g.next++ {
		i := g.next
		if g.acked[i].Load() {
			continue
		}
		it := &g.items[i]
		r := &g.krecs[i]
		*r = kgo.Record{Partition: it.part, Key: it.key, Value: it.val, Timestamp: ts, Context: &g.refs[i]}
		p.inflight.Add(1)
		// Never blocks: a generation stays below MaxBufferedRecords (were
		// it refused, the promise fails the record and it is re-sent).
		s.cl.TryProduce(context.Background(), r, p.onProduced)
		n++
	}
	return n
}

// flush sends each generation when fill asks, until ctx ends: franz-go's
// Flush blocks until every buffered record is answered, which takes as
// long as Kafka is down, so it runs beside the sender, which goes on
// spilling meanwhile.
func (s *sender) flush(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.flushReq:
		}
		if err := s.cl.Flush(ctx); err != nil && ctx.Err() == nil {
			s.p.log.Warn("events: flush", slog.Any("error", err))
		}
		s.flushing.Store(false)
		s.p.signal(true)
	}
}

// drained reports whether everything recorded is in Kafka.
func (s *sender) drained() bool {
	if len(s.active) > 0 || len(s.pending) > 0 || s.backlog > 0 {
		return false
	}
	p := s.p
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.sealed) == 0 && (p.open == nil || p.open.n == 0)
}

// wait is how long to sleep before the next round, unless woken.
func (s *sender) wait(now time.Time, stopping bool, deadline time.Time) time.Duration {
	p := s.p
	d := time.Second // metrics, drop logs, Kafka state
	if stopping {
		d = min(d, deadline.Sub(now))
	}
	if now.Before(s.backoffUntil) {
		d = min(d, s.backoffUntil.Sub(now))
	}
	if g := s.firstUnspooled(); g != nil {
		d = min(d, max(g.firstAt.Add(p.cfg.FlushInterval).Sub(now), s.spillRetryAt.Sub(now)))
	}
	idle := s.idle(now)
	p.mu.Lock()
	if c := p.open; c != nil && c.n > 0 {
		due := c.firstAt.Add(p.cfg.FlushInterval)
		if idle || stopping {
			due = c.firstAt.Add(p.cfg.Linger)
		}
		d = min(d, due.Sub(now))
	}
	p.mu.Unlock()
	return max(d, 100*time.Microsecond)
}

// finish is the final stop: it seals the last chunk (Record drops from now
// on), writes every segment not in the spool to it in FIFO order, stops
// franz-go, removes the segments Kafka acknowledged meanwhile, records the
// last sequence numbers used as the reservation (so the next epoch's
// markers name them exactly) and closes the spool. cause is returned,
// joined with the errors met.
func (s *sender) finish(cause error) error {
	p := s.p
	now := time.Now()
	p.mu.Lock()
	p.closed = true
	if c := p.open; c != nil && c.n > 0 {
		p.sealed = append(p.sealed, c)
	}
	p.open = nil
	used := make([]uint64, len(p.next))
	for q := range used {
		used[q] = p.next[q] - 1
	}
	p.mu.Unlock()
	s.collect(now, true)
	s.reap(now)
	s.spill(now, true)

	errs := []error{cause}
	if s.cl != nil {
		s.stopFlush()
		<-s.flushDone
		// Fails what is still in flight; those segments are in the spool.
		s.cl.Close()
		s.cl = nil
		s.awaitPromises()
		s.reap(now)
	}
	metaErr := s.writeMeta(used)
	if metaErr != nil {
		errs = append(errs, fmt.Errorf("events: stop: %w", metaErr))
	}
	p.stopLedger(metaErr == nil)
	s.reserved = used
	if err := p.sp.Close(); err != nil {
		errs = append(errs, fmt.Errorf("events: stop: %w", err))
	}
	p.setKafkaUp(false)
	s.logDrops(now.Add(dropLogEvery))
	p.log.Info("events: stopped", slog.Uint64("produced", p.produced.Load()), slog.Uint64("spooled", p.spooled.Load()))
	return errors.Join(errs...)
}

// awaitPromises waits for franz-go to answer every record handed to it
// (the closed client fails them), so that no promise runs after Run.
func (s *sender) awaitPromises() {
	p := s.p
	limit := time.NewTimer(p.cfg.ShutdownTimeout)
	defer limit.Stop()
	for p.inflight.Load() > 0 {
		select {
		case <-p.wake:
		case <-limit.C:
			p.log.Error("events: franz-go did not answer every record after its client closed",
				slog.Int64("in_flight", p.inflight.Load()))
			return
		}
	}
}

// logErr logs a pipeline error at most once a second.
func (s *sender) logErr(now time.Time, msg string, err error) {
	if now.Sub(s.lastErrLog) < time.Second {
		return
	}
	s.lastErrLog = now
	s.p.log.Warn(msg, slog.Any("error", err))
}

// logFixes logs the corrections made to events since the last log, at
// most once per dropLogEvery.
func (s *sender) logFixes(now time.Time) {
	s.logCounts(now, &s.lastFixLog, s.loggedFixes[:], slog.LevelWarn,
		"events: decisions with values beyond the schema's bounds were corrected (see tollgate_events_corrected_total)",
		fixNames[:], func(p *Producer) []uint64 { f := p.corrected; return f[:] })
}

// logDrops logs the drops since the last log, at most once per
// dropLogEvery.
func (s *sender) logDrops(now time.Time) {
	s.logCounts(now, &s.lastDropLog, s.loggedDrops[:], slog.LevelError,
		"events: decisions dropped (see tollgate_events_dropped_total)",
		dropReasonNames[:], func(p *Producer) []uint64 { d := p.dropped; return d[:] })
}

// logCounts logs, at most once per dropLogEvery since *last, how much the
// producer's counters (a copy read under its lock) grew since logged, and
// then remembers them as logged at now.
func (s *sender) logCounts(now time.Time, last *time.Time, logged []uint64, level slog.Level, msg string, names []string,
	read func(p *Producer) []uint64) {
	if now.Sub(*last) < dropLogEvery {
		return
	}
	p := s.p
	p.mu.Lock()
	cur := read(p)
	p.mu.Unlock()
	if logGrowth(p.log, level, msg, names, cur, logged) {
		*last = now
		copy(logged, cur)
	}
}

// logGrowth logs msg at level with, per name, how much the counter of cur
// has grown since logged; when none has, it logs nothing and reports
// false.
func logGrowth(log *slog.Logger, level slog.Level, msg string, names []string, cur, logged []uint64) bool {
	if slices.Equal(cur, logged) {
		return false
	}
	attrs := make([]any, 0, len(cur))
	for i := range cur {
		attrs = append(attrs, slog.Uint64(names[i], cur[i]-logged[i]))
	}
	log.Log(context.Background(), level, msg, attrs...)
	return true
}
