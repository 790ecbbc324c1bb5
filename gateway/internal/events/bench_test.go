package events_test

import (
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/internal/testwait"
)

// benchDecisions are the decisions the benchmarks record, built once.
func benchDecisions() ([]*guard.Request, []*guard.Decision) {
	const n = 1024
	reqs, ds := make([]*guard.Request, n), make([]*guard.Decision, n)
	for i := range n {
		reqs[i], ds[i] = decision(i)
	}
	return reqs, ds
}

// benchProducer starts a producer against a broker (kfake) in another
// process, so that getrusage counts the producer's CPU and not the
// broker's, and warms it up.
func benchProducer(b *testing.B, memory int, flush time.Duration) *producer {
	cfg := testConfig(b, kafkaProcess(b), b.TempDir())
	cfg.MemoryBytes, cfg.FlushInterval = memory, flush
	p := start(b, cfg)
	reqs, ds := benchDecisions()
	for i := range 20_000 { // connections, metadata, the producer id, pages
		p.Record(reqs[i%len(reqs)], ds[i%len(ds)], "proxy")
	}
	waitProduced(b, p, 20_000)
	return p
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkRecord measures the decision path, Record, from parallel
// goroutines with the pipeline running: ns/op and allocs/op are Record's.
// It records faster than any broker takes events, so the memory buffer is
// sized to hold them all and spilling is deferred (FlushInterval 1 min):
// this measures Record, not the spool. cpu-ns/event is the process's CPU
// (getrusage: Record, the sender, franz-go, GC) from the first Record until
// Kafka acknowledged the last event, per event.
func BenchmarkRecord(b *testing.B) {
	p := benchProducer(b, 1<<30, time.Minute)
	reqs, ds := benchDecisions()
	before, start := cpuTime(b), time.Now()
	var seed atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(seed.Add(7919))
		for pb.Next() {
			i++
			p.Record(reqs[i%len(reqs)], ds[i%len(ds)], "proxy")
		}
	})
	b.StopTimer()
	waitProduced(b, p, 20_000+float64(b.N))
	b.ReportMetric(float64((cpuTime(b)-before).Nanoseconds())/float64(b.N), "cpu-ns/event")
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "delivered/s")
	checkBench(b, p)
}

// BenchmarkPipelinePaced records at a steady rate the broker keeps up
// with (per millisecond: 100 or 300 decisions), with the default buffer
// and intervals, and reports the process's CPU per event from the first
// Record until Kafka acknowledged the last: the producer's cost per
// decision in a gateway (target: ≤ 1 µs). cpu-ns/event is the gross
// figure; cpu-ns/event-net subtracts the CPU the same pacing loop costs
// with the producer idle (the ticker's wake-ups, the idle sender and
// franz-go), measured first. ns/op is the pacing, not a cost.
func BenchmarkPipelinePaced(b *testing.B) {
	for _, perMs := range []int{100, 300} {
		b.Run(fmt.Sprintf("rate=%dk/s", perMs), func(b *testing.B) {
			p := benchProducer(b, 0, 0)
			reqs, ds := benchDecisions()
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			const idleTicks = 300
			idle := cpuTime(b)
			for range idleTicks {
				<-tick.C
			}
			idle = (cpuTime(b) - idle) / idleTicks
			before, ticks := cpuTime(b), 0
			b.ResetTimer()
			for i := 0; i < b.N; ticks++ {
				<-tick.C
				for end := min(i+perMs, b.N); i < end; i++ {
					p.Record(reqs[i%len(reqs)], ds[i%len(ds)], "proxy")
				}
			}
			waitProduced(b, p, 20_000+float64(b.N))
			b.StopTimer()
			cpu := cpuTime(b) - before
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/event")
			b.ReportMetric(float64((cpu-time.Duration(ticks)*idle).Nanoseconds())/float64(b.N), "cpu-ns/event-net")
			checkBench(b, p)
		})
	}
}

// checkBench fails a benchmark that did not measure what it says: events
// dropped, or (for the healthy path) spooled.
func checkBench(b *testing.B, p *producer) {
	// Events numbered beyond the durable reservation: the decision path
	// outran META's writes (it never waits for them).
	b.ReportMetric(p.metric(b, "tollgate_events_reservation_overruns_total"), "overruns")
	if d := p.metric(b, "tollgate_events_dropped_total"); d != 0 {
		b.Fatalf("%v events dropped: the benchmark measured the drop path", d)
	}
	if s := p.metric(b, "tollgate_events_spooled_total"); s != 0 {
		b.Logf("%v events went through the spool (Kafka fell behind for longer than FlushInterval)", s)
	}
}

// waitProduced waits until Kafka acknowledged n events.
func waitProduced(b *testing.B, p *producer, n float64) {
	b.Helper()
	testwait.Eventually(b, 2*time.Minute, func() error {
		if got := p.metric(b, "tollgate_events_produced_total"); got < n {
			return fmt.Errorf("%v of %v events produced (dropped %v, buffered %v, spooled %v, replayed %v, send errors %v)",
				got, n, p.metric(b, "tollgate_events_dropped_total"), p.metric(b, "tollgate_events_buffered"),
				p.metric(b, "tollgate_events_spooled_total"), p.metric(b, "tollgate_events_replayed_total"),
				p.metric(b, "tollgate_events_send_errors_total"))
		}
		return nil
	})
}
