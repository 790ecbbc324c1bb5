package events_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"google.golang.org/protobuf/proto"

	"github.com/tollgate/tollgate/compose/kafkabroker"
	"github.com/tollgate/tollgate/compose/kafkabroker/kafkatest"
	"github.com/tollgate/tollgate/gateway/internal/events"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/internal/logtest"
	"github.com/tollgate/tollgate/internal/promtest"
	"github.com/tollgate/tollgate/internal/service"
	"github.com/tollgate/tollgate/internal/testnet"
	"github.com/tollgate/tollgate/internal/testwait"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// The tests' topic has this many partitions.
const partitions = 6

// startKafka starts a one-broker Kafka on port (0: any) with the
// decisions topic, persisting in dataDir unless it is "", waiting while a
// chosen port (a broker that starts late or restarts) is held for a
// moment by another test's outgoing connection. The test stops it at the
// end; Down earlier is a Kafka outage.
func startKafka(t testing.TB, port int, dataDir string) *kafkabroker.Broker {
	t.Helper()
	opts := []kafkabroker.Option{
		kafkabroker.WithListen(net.JoinHostPort("127.0.0.1", strconv.Itoa(port))),
		kafkabroker.WithPartitions(partitions),
		kafkabroker.WithSeedTopics(tollgatev1.TopicDecisions),
		kafkabroker.WithWaitForPorts(),
	}
	if dataDir != "" {
		opts = append(opts, kafkabroker.WithDataDir(dataDir))
	}
	return kafkatest.StartTB(t, opts...)
}

// producer is a Producer under test with its metrics and running Run.
type producer struct {
	*events.Producer
	reg *prometheus.Registry
	run *testnet.Running
}

// testConfig is a config for brokers and spool dir with short intervals.
func testConfig(t testing.TB, brokers []string, dir string) events.Config {
	return configWithLog(brokers, dir, logtest.Verbose(t))
}

// configWithLog is testConfig's producer configuration, logging to log.
func configWithLog(brokers []string, dir string, log *slog.Logger) events.Config {
	return events.Config{
		Brokers:         brokers,
		GatewayID:       "gw-test",
		SpoolDir:        dir,
		FlushInterval:   20 * time.Millisecond,
		ShutdownTimeout: 5 * time.Second,
		MetadataTimeout: 300 * time.Millisecond,
		Partitions:      partitions,
		Log:             log,
	}
}

// start creates a producer and runs it until stopped (or the test ends).
func start(t testing.TB, cfg events.Config) *producer {
	t.Helper()
	p := newProducer(t, cfg)
	p.run = testnet.Start(t, "producer", p.Run)
	return p
}

func newProducer(t testing.TB, cfg events.Config) *producer {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	ep, err := events.New(t.Context(), cfg)
	if err != nil {
		t.Fatalf("new producer: %v", err)
	}
	p := &producer{Producer: ep, reg: reg}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("close producer: %v", err)
		}
	})
	return p
}

// shutdown cancels Run's context and fails the test unless Run
// returns nil.
func (p *producer) shutdown(t testing.TB) {
	t.Helper()
	if err := p.run.Stop(); err != nil {
		t.Fatal(err)
	}
}

// metric returns the value of a tollgate_events_* metric (the sum over
// its label values matching labels).
func (p *producer) metric(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	return promtest.Sum(t, p.reg, name, labels...)
}

// waitDrained waits until p has nothing buffered in memory or the spool.
func (p *producer) waitDrained(t testing.TB, timeout time.Duration) {
	t.Helper()
	took := testwait.Eventually(t, timeout, func() error {
		mem, segs := p.metric(t, "tollgate_events_buffered"), p.metric(t, "tollgate_events_spool_segments")
		if mem != 0 || segs != 0 {
			return fmt.Errorf("%v events in memory, %v segments in the spool", mem, segs)
		}
		return nil
	})
	t.Logf("drained in %v", took)
}

var tenants = func() []string {
	ts := []string{""} // anonymous requests
	for i := range 40 {
		ts = append(ts, "tenant-"+strconv.Itoa(i))
	}
	return ts
}()

// decision returns the i-th test decision: allowed, rejected or blocked,
// over the tenants.
func decision(i int) (*guard.Request, *guard.Decision) {
	tenant := tenants[i%len(tenants)]
	req := &guard.Request{Method: "GET", Path: "/v1/items/" + strconv.Itoa(i), IP: netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)})}
	d := &guard.Decision{Allowed: true, Status: 200, Reason: guard.ReasonAllowed, Time: time.Now().UnixMicro(),
		Tenant: tenant, Tier: "free", Endpoint: "/v1/items/{id}", Cost: 1, Deciding: 0,
		Rules: []guard.RuleResult{{ID: "per-key", Algorithm: rules.TokenBucket, Allowed: true, Remaining: 5}}}
	if tenant != "" {
		d.KeyID, d.KeyPrefix = "kid-"+strconv.Itoa(i%97), "tg_"+strconv.Itoa(i%97)
	}
	switch i % 5 {
	case 3:
		d.Allowed, d.Status, d.Reason, d.RetryAfter = false, 429, guard.ReasonRateLimited, 2
		d.Rules[0].Allowed, d.Rules[0].Remaining = false, 0
	case 4:
		d.Allowed, d.Status, d.Reason, d.Deciding, d.Rules = false, 403, guard.ReasonBlocklisted, -1, nil
	}
	return req, d
}

// recordN records n decisions, numbered from first, on p: a test's
// producer or the bare events.Producer of a child process.
func recordN(p interface {
	Record(*guard.Request, *guard.Decision, string)
}, first, n int) {
	for i := first; i < first+n; i++ {
		req, d := decision(i)
		p.Record(req, d, "proxy")
	}
}

// readAll reads every record of the decisions topic, each partition in
// offset order.
func readAll(t testing.TB, brokers []string) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	adm, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	ends, err := kadm.NewClient(adm).ListEndOffsets(ctx, tollgatev1.TopicDecisions)
	adm.Close()
	if err != nil {
		t.Fatalf("list end offsets: %v", err)
	}
	want := map[int32]int64{}
	total := int64(0)
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			want[o.Partition] = o.Offset
			total += o.Offset
		}
	})
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(tollgatev1.TopicDecisions),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var out []*kgo.Record
	got := map[int32]int64{}
	for int64(len(out)) < total {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read %d of %d records: %v", len(out), total, err)
		}
		fs.EachError(func(topic string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", topic, p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset < want[r.Partition] {
				out = append(out, r)
				got[r.Partition] = r.Offset + 1
			}
		})
	}
	// Stable by partition, offsets in order within each.
	slices.SortStableFunc(out, func(a, b *kgo.Record) int {
		if a.Partition != b.Partition {
			return int(a.Partition - b.Partition)
		}
		return int(a.Offset - b.Offset)
	})
	return out
}

// source is an event stream: one gateway epoch on one partition.
type source struct {
	gateway   string
	epoch     uint64
	partition int32
}

// mark is a source's deduplication state, as docs/aggregator.md defines it and the
// aggregator keeps it (aggregator/internal/windows, which code under
// gateway/ cannot import; TestAggregatorCountsEveryEventOnce runs the
// aggregator itself): the highest sequence number applied, the numbers
// skipped, and whether an EpochClosed marker closed the source.
type mark struct {
	hwm, missing uint64
	closed       bool
	last         uint64 // the last number used, as the EpochClosed marker names it
}

// tally is what the deduplication made of a topic.
type tally struct {
	applied    int // decisions and reports counted
	duplicates int
	skips      int // events whose seq jumped over numbers never seen
	missing    uint64
	markers    int // EpochClosed markers applied
	marks      map[source]*mark
	byEpoch    map[uint64]int // counted events per epoch
}

// aggregate reads the records, each partition in offset order, the way
// the aggregator does: per source, an event at or below the high-water mark
// (or after the marker) is a duplicate; one above it counts, and numbers it
// jumps over are missing; a marker closes the source and counts the numbers
// used after the mark as missing. It also checks each record's
// partition and key against its event.
func aggregate(t testing.TB, recs []*kgo.Record) tally {
	t.Helper()
	out := tally{byEpoch: map[uint64]int{}, marks: map[source]*mark{}}
	for _, r := range recs {
		ev := &tollgatev1.DecisionEvent{}
		if err := proto.Unmarshal(r.Value, ev); err != nil {
			t.Fatalf("partition %d offset %d: %v", r.Partition, r.Offset, err)
		}
		if ev.Partition != r.Partition {
			t.Fatalf("event of partition %d on partition %d", ev.Partition, r.Partition)
		}
		marker := ev.Kind == tollgatev1.DecisionEvent_KIND_EPOCH_CLOSED
		if !marker {
			if string(r.Key) != ev.Tenant {
				t.Fatalf("record key %q, tenant %q", r.Key, ev.Tenant)
			}
			if want := events.PartitionOf(ev.Tenant, partitions); ev.Partition != want {
				t.Fatalf("tenant %q on partition %d, PartitionOf says %d", ev.Tenant, ev.Partition, want)
			}
			if ev.Kind != tollgatev1.DecisionEvent_KIND_DECISION && ev.Kind != tollgatev1.DecisionEvent_KIND_REPORT {
				t.Fatalf("event of kind %v", ev.Kind)
			}
		}
		src := source{ev.GatewayId, ev.Epoch, ev.Partition}
		m := out.marks[src]
		if m == nil {
			m = &mark{}
			out.marks[src] = m
		}
		switch {
		case m.closed || ev.Seq <= m.hwm:
			out.duplicates++
		case marker:
			if ev.Seq != ev.LastSeq+1 {
				t.Fatalf("marker with seq %d, last_seq %d", ev.Seq, ev.LastSeq)
			}
			m.missing += ev.LastSeq - m.hwm
			m.hwm, m.closed, m.last = ev.Seq, true, ev.LastSeq
			out.markers++
		default:
			if ev.Seq > m.hwm+1 {
				m.missing += ev.Seq - m.hwm - 1
				out.skips++
			}
			m.hwm = ev.Seq
			out.applied++
			out.byEpoch[ev.Epoch]++
		}
	}
	for _, m := range out.marks {
		out.missing += m.missing
	}
	return out
}

// TestDeliversEveryEventOnceInOrder records decisions and reports from
// several goroutines and reads them back: every event arrives, each
// (epoch, partition) numbered 1, 2, 3… in arrival order, and the
// aggregator counts each once.
func TestDeliversEveryEventOnceInOrder(t *testing.T) {
	t.Parallel()
	c := startKafka(t, 0, "")
	p := start(t, testConfig(t, c.Addrs(), t.TempDir()))
	if p.Partitions() != partitions {
		t.Fatalf("numbering by %d partitions, the topic has %d", p.Partitions(), partitions)
	}
	const workers, each = 4, 5000
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			for i := w * each; i < (w+1)*each; i++ {
				req, d := decision(i)
				p.Record(req, d, "proxy")
				if i%10 == 0 {
					p.Report(req, &guard.Decision{Status: 200, Tenant: d.Tenant, KeyID: d.KeyID, Endpoint: d.Endpoint, Cost: 3, Deciding: -1}, "report")
				}
				// Not events: a peek, an invalid request.
				p.Record(req, &guard.Decision{Peek: true, Status: 200, Allowed: true, Tenant: d.Tenant}, "check")
				p.Record(req, &guard.Decision{Status: 400, Reason: guard.ReasonInvalidKey}, "check")
			}
			errs <- nil
		}()
	}
	for range workers {
		<-errs
	}
	want := workers*each + workers*each/10
	if got := p.metric(t, "tollgate_events_recorded_total"); got != float64(want) {
		t.Fatalf("recorded %v events, want %d", got, want)
	}
	p.waitDrained(t, 30*time.Second)
	p.shutdown(t)

	recs := readAll(t, c.Addrs())
	got := aggregate(t, recs)
	t.Logf("%d records: %d applied, %d duplicates, %d missing", len(recs), got.applied, got.duplicates, got.missing)
	if got.applied != want || got.missing != 0 || got.markers != 0 || got.skips != 0 {
		t.Fatalf("aggregator applied %d (want %d), missing %d, markers %d", got.applied, want, got.missing, got.markers)
	}
	if d := p.metric(t, "tollgate_events_dropped_total"); d != 0 {
		t.Fatalf("%v events dropped", d)
	}
}

// TestKafkaOutageSpillsAndReplaysInOrder stops the broker while events are
// recorded: they go to the spool, and when a broker comes back on the same
// port with the same data, everything arrives, in order, once.
func TestKafkaOutageSpillsAndReplaysInOrder(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	c := startKafka(t, 0, data)
	brokers := c.Addrs()
	port := testnet.Port(t, brokers[0])
	cfg := testConfig(t, brokers, t.TempDir())
	// 16 chunks of 16 KiB, 4 of them in flight: most of the outage's
	// events wait in the spool, not in franz-go.
	cfg.MemoryBytes = 256 << 10
	p := start(t, cfg)

	// Bursts a quarter of the buffer's size: it absorbs each while the
	// sender sends or spools the previous one.
	for burst := range 10 {
		recordN(p, burst*200, 200)
		testwait.Eventually(t, 20*time.Second, func() error {
			if got := p.metric(t, "tollgate_events_produced_total"); got < float64(burst+1)*200 {
				return fmt.Errorf("%v of %d produced", got, (burst+1)*200)
			}
			return nil
		})
	}

	if err := c.Down(); err != nil {
		t.Fatal(err)
	}
	// Every event of the outage reaches the spool, even those franz-go
	// holds in flight (they are spooled FlushInterval after they were
	// recorded), and Kafka counts as down.
	base := p.metric(t, "tollgate_events_spooled_total")
	for burst := range 20 {
		recordN(p, 2000+burst*300, 300)
		testwait.Eventually(t, 20*time.Second, func() error {
			if spooled := p.metric(t, "tollgate_events_spooled_total") - base; spooled < float64(burst+1)*300 {
				return fmt.Errorf("%v of %d events spooled", spooled, (burst+1)*300)
			}
			return nil
		})
	}
	testwait.Eventually(t, 10*time.Second, func() error {
		if up := p.metric(t, "tollgate_events_kafka_up"); up != 0 {
			return fmt.Errorf("kafka_up %v with the broker closed", up)
		}
		return nil
	})
	if d := p.metric(t, "tollgate_events_dropped_total"); d != 0 {
		t.Fatalf("%v events dropped", d)
	}

	c2 := startKafka(t, port, data)
	p.waitDrained(t, 60*time.Second)
	p.shutdown(t)
	if r := p.metric(t, "tollgate_events_replayed_total"); r == 0 {
		t.Fatal("nothing was replayed from the spool")
	}

	got := aggregate(t, readAll(t, c2.Addrs()))
	t.Logf("applied %d, duplicates %d, missing %d", got.applied, got.duplicates, got.missing)
	if got.applied != 8000 || got.missing != 0 || got.skips != 0 {
		t.Fatalf("aggregator applied %d of 8000 events, %d missing", got.applied, got.missing)
	}
}

// TestStopWithKafkaDownSpoolsAndRestartReplays stops producers while Kafka
// is down: everything goes to the spool; restarted producers take new
// epochs, and once Kafka is back the spool is replayed, each closed epoch
// gets its EpochClosed markers after its events and before the next
// epoch's, and the aggregator counts every event once with nothing
// missing (a graceful stop records the last numbers used exactly).
func TestStopWithKafkaDownSpoolsAndRestartReplays(t *testing.T) {
	t.Parallel()
	port := testnet.FreePort(t)
	brokers := []string{"127.0.0.1:" + strconv.Itoa(port)}
	dir := t.TempDir()

	var epochs []uint64
	for i := range 2 { // two epochs while Kafka is down
		p := start(t, testConfig(t, brokers, dir))
		epochs = append(epochs, p.Epoch())
		recordN(p, i*3000, 3000)
		p.shutdown(t)
		if got := p.metric(t, "tollgate_events_spooled_total"); got < 3000 {
			t.Fatalf("stop with Kafka down spooled %v of 3000 events", got)
		}
		if d := p.metric(t, "tollgate_events_dropped_total"); d != 0 {
			t.Fatalf("%v events dropped", d)
		}
	}

	c := startKafka(t, port, "")
	p := start(t, testConfig(t, brokers, dir))
	epochs = append(epochs, p.Epoch())
	if epochs[0] == epochs[1] || epochs[1] == epochs[2] || epochs[0] == epochs[2] {
		t.Fatalf("a restart reused an epoch: %x", epochs)
	}
	recordN(p, 6000, 1000)
	p.waitDrained(t, 60*time.Second)
	p.shutdown(t)

	recs := readAll(t, c.Addrs())
	// On each partition: epoch 0's events, its marker, epoch 1's events,
	// its marker, then epoch 2's events.
	for q := int32(0); q < partitions; q++ {
		stage := 0
		for _, r := range recs {
			if r.Partition != q {
				continue
			}
			ev := &tollgatev1.DecisionEvent{}
			if err := proto.Unmarshal(r.Value, ev); err != nil {
				t.Fatal(err)
			}
			at := slices.Index(epochs, ev.Epoch)
			marker := ev.Kind == tollgatev1.DecisionEvent_KIND_EPOCH_CLOSED
			st := 2 * at
			if marker {
				st++
			}
			if at < 0 || st < stage {
				t.Fatalf("partition %d offset %d: epoch %d (marker %v) after stage %d", q, r.Offset, at, marker, stage)
			}
			stage = st
		}
	}
	got := aggregate(t, recs)
	t.Logf("applied %d, duplicates %d, missing %d, markers %d", got.applied, got.duplicates, got.missing, got.markers)
	if got.applied != 7000 || got.missing != 0 {
		t.Fatalf("aggregator applied %d of 7000, missing %d", got.applied, got.missing)
	}
	for i, e := range epochs {
		if want := []int{3000, 3000, 1000}[i]; got.byEpoch[e] != want {
			t.Errorf("epoch %d: %d events counted, want %d", i, got.byEpoch[e], want)
		}
	}
	closed := map[uint64]int{}
	for s, m := range got.marks {
		if m.closed {
			closed[s.epoch]++
		}
	}
	if closed[epochs[0]] == 0 || closed[epochs[1]] == 0 || closed[epochs[2]] != 0 {
		t.Fatalf("closed (epoch, partition) pairs per epoch: %v, epochs %x", closed, epochs)
	}
}

// TestSpoolFullDropsAreCountedAndRecordNeverBlocks fills memory and a tiny
// spool with Kafka down: Record keeps returning at once, the excess is
// dropped and counted, and after a restart with Kafka up the aggregator
// counts each drop as missing: applied + missing = recorded.
func TestSpoolFullDropsAreCountedAndRecordNeverBlocks(t *testing.T) {
	t.Parallel()
	port := testnet.FreePort(t)
	brokers := []string{"127.0.0.1:" + strconv.Itoa(port)}
	dir := t.TempDir()
	cfg := testConfig(t, brokers, dir)
	cfg.MemoryBytes, cfg.SpoolMaxBytes = 64<<10, 256<<10
	p := start(t, cfg)

	const workers, each = 4, 20_000
	done := make(chan time.Duration, workers)
	for w := range workers {
		go func() {
			var slowest time.Duration
			for i := w * each; i < (w+1)*each; i++ {
				req, d := decision(i)
				t0 := time.Now()
				p.Record(req, d, "proxy")
				slowest = max(slowest, time.Since(t0))
			}
			done <- slowest
		}()
	}
	deadline := time.After(30 * time.Second)
	var slowest time.Duration
	for range workers {
		select {
		case s := <-done:
			slowest = max(slowest, s)
		case <-deadline:
			t.Fatal("Record blocked: 80,000 calls did not return within 30s with Kafka down and the spool full")
		}
	}
	t.Logf("slowest Record call: %v", slowest)
	dropped := p.metric(t, "tollgate_events_dropped_total", "reason", "spool_full")
	if dropped == 0 {
		t.Fatal("no drop counted with Kafka down and the spool full")
	}
	p.shutdown(t)
	dropped = p.metric(t, "tollgate_events_dropped_total", "reason", "spool_full")
	recorded := p.metric(t, "tollgate_events_recorded_total")
	t.Logf("recorded %v, dropped %v, spooled %v", recorded, dropped, p.metric(t, "tollgate_events_spooled_total"))
	if recorded+dropped < workers*each {
		t.Fatalf("recorded %v + dropped %v < %d calls", recorded, dropped, workers*each)
	}

	c := startKafka(t, port, "")
	cfg.SpoolMaxBytes = 0
	p2 := start(t, cfg)
	p2.waitDrained(t, 60*time.Second)
	p2.shutdown(t)
	got := aggregate(t, readAll(t, c.Addrs()))
	t.Logf("applied %d, missing %d, markers %d", got.applied, got.missing, got.markers)
	if got.applied+int(got.missing) != workers*each || got.missing != uint64(dropped) {
		t.Fatalf("applied %d + missing %d, want %d calls with %v dropped", got.applied, got.missing, workers*each, dropped)
	}
}

// TestCloseIsIdempotent closes a running producer from many goroutines, and
// one that never ran (its events go to the spool).
func TestCloseIsIdempotent(t *testing.T) {
	t.Parallel()
	c := startKafka(t, 0, "")
	p := start(t, testConfig(t, c.Addrs(), t.TempDir()))
	recordN(p, 0, 100)
	testwait.Eventually(t, 10*time.Second, func() error { // Run is running
		if got := p.metric(t, "tollgate_events_produced_total"); got < 100 {
			return fmt.Errorf("%v of 100 produced", got)
		}
		return nil
	})
	errs := make(chan error, 8)
	for range 8 {
		go func() { errs <- p.Close() }()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Fatalf("close: %v", err)
		}
	}
	if err := p.run.Wait(); err != nil {
		t.Fatalf("run after close: %v", err)
	}
	if err := p.Run(context.Background()); !errors.Is(err, events.ErrClosed) {
		t.Fatalf("run after close: %v, want ErrClosed", err)
	}
	recordN(p, 100, 1)
	if d := p.metric(t, "tollgate_events_dropped_total", "reason", "closed"); d != 1 {
		t.Fatalf("a record after close counted %v drops, want 1", d)
	}

	dir := t.TempDir()
	idle := newProducer(t, testConfig(t, c.Addrs(), dir))
	recordN(idle, 0, 50)
	if err := idle.Close(); err != nil {
		t.Fatalf("close a producer that never ran: %v", err)
	}
	if got := idle.metric(t, "tollgate_events_spooled_total"); got != 50 {
		t.Fatalf("closing a producer that never ran spooled %v of 50 events", got)
	}
	again := start(t, testConfig(t, c.Addrs(), dir))
	again.waitDrained(t, 30*time.Second)
	again.shutdown(t)
	got := aggregate(t, readAll(t, c.Addrs()))
	if got.applied != 150 || got.missing != 0 {
		t.Fatalf("applied %d of 150, missing %d", got.applied, got.missing)
	}
}

// TestFailedRecordsAreResentInOrder makes the broker refuse produce requests
// with a non-retriable error (franz-go fails those records and every later
// one of their partitions): the producer re-sends from the first record not
// acknowledged, so every event still arrives once, in order.
func TestFailedRecordsAreResentInOrder(t *testing.T) {
	t.Parallel()
	c := startKafka(t, 0, "")
	cluster := c.Cluster()
	var requests, refused atomic.Int64
	cluster.ControlKey(int16(kmsg.Produce), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		// The second request and every third after it, so that a slow
		// machine that packs everything into a few requests still sees
		// refusals.
		if requests.Add(1)%3 != 2 || refused.Load() >= 20 {
			return nil, nil, false
		}
		refused.Add(1)
		req := kr.(*kmsg.ProduceRequest)
		return kafkatest.RefuseProduce(req, kerr.InvalidRecord.Code), nil, true
	})
	p := start(t, testConfig(t, c.Addrs(), t.TempDir()))
	// Continuously, so that records are handed to franz-go while others
	// are failing.
	// Keep sending past the 200 bursts until some requests were refused
	// (bounded), however few requests the producer packs them into.
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	bursts := 0
	for ; bursts < 200 || (refused.Load() < 3 && bursts < 20_000); bursts++ {
		<-tick.C
		recordN(p, bursts*50, 50)
	}
	p.waitDrained(t, 60*time.Second)
	p.shutdown(t)
	errs := p.metric(t, "tollgate_events_send_errors_total")
	if errs == 0 || refused.Load() == 0 {
		t.Fatalf("no record failed (%v send errors, %d requests refused): the test tested nothing", errs, refused.Load())
	}
	got := aggregate(t, readAll(t, c.Addrs()))
	t.Logf("%d requests refused, %v records failed and re-sent; applied %d, duplicates %d, missing %d",
		refused.Load(), errs, got.applied, got.duplicates, got.missing)
	if want := bursts * 50; got.applied != want || got.missing != 0 || got.skips != 0 {
		t.Fatalf("applied %d of %d, missing %d, %d skips", got.applied, want, got.missing, got.skips)
	}
}

// TestNewStopsWaitingForKafkaWhenContextEnds: with a broker that accepts
// connections and never answers, New waits for the partition count at most
// until its context ends, far sooner than MetadataTimeout or franz-go's own
// retries, and falls back
// to Config.Partitions.
func TestNewStopsWaitingForKafkaWhenContextEnds(t *testing.T) {
	t.Parallel()
	mute := testnet.Listen(t) // connections complete in the backlog, unanswered
	cfg := testConfig(t, []string{mute.Addr().String()}, t.TempDir())
	cfg.MetadataTimeout = 5 * time.Minute
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	done := service.Go(func() error {
		p, err := events.New(ctx, cfg)
		if err != nil {
			return err
		}
		return p.Close()
	})
	// franz-go gives up on a mute broker after about 40 s by itself.
	testwait.Eventually(t, 15*time.Second, func() error {
		select {
		case <-done.Done():
			return nil
		default:
			return errors.New("New still waits for Kafka after its context ended")
		}
	})
	if err := done.Wait(); err != nil {
		t.Fatalf("New with Kafka down: %v, want the configured partition count", err)
	}
}
