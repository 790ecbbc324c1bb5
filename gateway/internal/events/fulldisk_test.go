package events_test

import (
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/gateway/internal/spool"
	"github.com/tollgate/tollgate/gateway/internal/spool/spooltest"
	"github.com/tollgate/tollgate/internal/testnet"
	"github.com/tollgate/tollgate/internal/testwait"
)

// TestRestartOnFullDiskReplays fills the spool's disk (not its budget)
// with Kafka down, stops the gateway's producer and starts it again on
// the still full disk: it starts, and once Kafka is back it replays the
// spool, so the aggregator counts every decision either applied or, for
// the ones dropped when the disk was full, missing.
func TestRestartOnFullDiskReplays(t *testing.T) {
	t.Parallel()
	port := testnet.FreePort(t)
	brokers := []string{"127.0.0.1:" + strconv.Itoa(port)}
	fsys := spooltest.New()
	cfg := testConfig(t, brokers, t.TempDir()) // a path of fsys, unique for the ledger
	cfg.FS, cfg.MemoryBytes = fsys, 64<<10

	p := start(t, cfg)
	capacity := fsys.Usage() + 256<<10 // the disk, far below the spool's budget
	fsys.SetCapacity(capacity)
	calls := 0
	testwait.Eventually(t, 60*time.Second, func() error {
		recordN(p, calls, 100)
		calls += 100
		free := capacity - fsys.Usage()
		if d := p.metric(t, "tollgate_events_dropped_total", "reason", "spool_full"); d == 0 || free > 16<<10 {
			return fmt.Errorf("%d decisions recorded, %v dropped, %d bytes free", calls, d, free)
		}
		return nil
	})
	// Something else takes the last bytes, as on a disk shared with logs.
	fsys.SetCapacity(fsys.Usage())
	p.shutdown(t) // the final META write succeeds on the full disk
	dropped := p.metric(t, "tollgate_events_dropped_total", "reason", "spool_full")
	t.Logf("first run: %d decisions, %v dropped, %v spooled", calls, dropped, p.metric(t, "tollgate_events_spooled_total"))

	// Restart on the full disk, Kafka still down: it starts and decides.
	p2 := start(t, cfg)
	if d := p2.metric(t, "tollgate_events_reservation_durable"); d != 1 {
		t.Fatalf("restarted on a full disk, reservation_durable is %v", d)
	}
	recordN(p2, calls, 500)
	calls += 500

	c := startKafka(t, port, "")
	p2.waitDrained(t, 60*time.Second)
	p2.shutdown(t)
	dropped += p2.metric(t, "tollgate_events_dropped_total", "reason", "spool_full")
	// A third start closes the second epoch, so that its drops count too.
	p3 := start(t, cfg)
	p3.waitDrained(t, 60*time.Second)
	p3.shutdown(t)
	got := aggregate(t, readAll(t, c.Addrs()))
	t.Logf("applied %d, missing %d, markers %d", got.applied, got.missing, got.markers)
	if got.applied+int(got.missing) != calls || got.missing != uint64(dropped) {
		t.Fatalf("applied %d + missing %d, want %d decisions with %v dropped", got.applied, got.missing, calls, dropped)
	}
}

// failMeta fails every operation on the spool's META (or its temporary
// file) while on is set, as a full disk does to a META it cannot rewrite.
func failMeta(on *atomic.Bool) spooltest.Injector {
	return func(op spooltest.Op) error {
		if on.Load() && strings.HasPrefix(path.Base(op.Path), "META") && op.Kind != spooltest.OpRead {
			return errors.New("no space left on device (injected)")
		}
		return nil
	}
}

// TestStartsWhenMetaCannotBeWritten: a spool whose META cannot be written
// does not stop a gateway from starting and producing; the reservation is
// reported not durable, the events numbered meanwhile as overruns, and the
// write is retried until it succeeds. The epoch is closed as usual after
// a stop and restart, and nothing counts as missing.
func TestStartsWhenMetaCannotBeWritten(t *testing.T) {
	t.Parallel()
	c := startKafka(t, 0, "")
	fsys := spooltest.New()
	var fail atomic.Bool
	fail.Store(true)
	fsys.Inject(failMeta(&fail))
	cfg := testConfig(t, c.Addrs(), t.TempDir())
	cfg.FS = fsys

	p := start(t, cfg)
	if d := p.metric(t, "tollgate_events_reservation_durable"); d != 0 {
		t.Fatalf("META cannot be written, reservation_durable is %v", d)
	}
	recordN(p, 0, 3000)
	p.waitDrained(t, 30*time.Second)
	if o := p.metric(t, "tollgate_events_reservation_overruns_total"); o != 3000 {
		t.Fatalf("%v overruns counted, want the 3000 events numbered while META could not be written", o)
	}
	fail.Store(false)
	testwait.Eventually(t, 10*time.Second, func() error {
		if d := p.metric(t, "tollgate_events_reservation_durable"); d != 1 {
			return errors.New("META not written yet")
		}
		return nil
	})
	recordN(p, 3000, 1000)
	p.waitDrained(t, 30*time.Second)
	if o := p.metric(t, "tollgate_events_reservation_overruns_total"); o != 3000 {
		t.Fatalf("%v overruns counted after META was written again, want 3000", o)
	}
	p.shutdown(t)

	p2 := start(t, cfg)
	recordN(p2, 4000, 100)
	p2.waitDrained(t, 30*time.Second)
	p2.shutdown(t)
	got := aggregate(t, readAll(t, c.Addrs()))
	t.Logf("applied %d, missing %d, markers %d", got.applied, got.missing, got.markers)
	if got.applied != 4100 || got.missing != 0 || got.markers == 0 {
		t.Fatalf("applied %d of 4100, missing %d, markers %d: the first epoch was not closed exactly", got.applied, got.missing, got.markers)
	}
	closed := 0
	for s, m := range got.marks {
		if s.epoch == p.Epoch() && m.closed {
			closed++
		}
	}
	if closed == 0 {
		t.Fatal("the epoch started without a durable META was never closed")
	}
}

// TestQuarantinedSegmentsAreCounted: a spool segment damaged on disk is
// set aside at start, and the metric says so (the log is not the only
// trace).
func TestQuarantinedSegmentsAreCounted(t *testing.T) {
	t.Parallel()
	fsys := spooltest.New()
	dir := t.TempDir()
	sp, err := spool.Open(fsys, dir, spool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := sp.Append([]spool.Record{{Partition: 0, Payload: []byte(strings.Repeat("x", 100+i))}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := sp.Close(); err != nil {
		t.Fatal(err)
	}
	seg := path.Join(dir, "0000000000000002.seg")
	b, err := fsys.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	b[30] ^= 0xff // a record's payload: its checksum fails, with data after it
	if err := fsys.WriteFile(seg, b); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, []string{"127.0.0.1:" + strconv.Itoa(testnet.FreePort(t))}, dir)
	cfg.FS = fsys
	p := newProducer(t, cfg)
	if q := p.metric(t, "tollgate_events_spool_quarantined_total"); q != 1 {
		t.Fatalf("tollgate_events_spool_quarantined_total is %v with one corrupt segment", q)
	}
	if n := p.metric(t, "tollgate_events_spool_segments"); n != 2 {
		t.Fatalf("%v segments left to replay, want the 2 intact ones", n)
	}
}
