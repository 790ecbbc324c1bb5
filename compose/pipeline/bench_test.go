package pipeline_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// BenchmarkAggregatorThroughput measures the aggregator's target (≥ 250 k events/s per core): it
// fills the decisions topic with events (from 20 000 keys of 200 tenants,
// as several gateways' producers would), then starts one aggregator in its
// own process and stops it once the report holds every event; the figure
// is events per second of the aggregator's own CPU time (user + system,
// from its rusage), i.e. per core. b.N is ignored: one fixed run.
//
//	go test -run '^$' -bench AggregatorThroughput -benchtime 1x ./compose/pipeline
func BenchmarkAggregatorThroughput(b *testing.B) {
	const n = 400_000
	e := newEnvTB(b, false)
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.broker.Addrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerBatchMaxBytes(1<<20), kgo.MaxBufferedRecords(100_000))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(context.Background(), 6, -1, nil, tollgatev1.TopicDecisions); err != nil {
		b.Fatal(err)
	}
	seq := map[int32]uint64{}
	now := time.Now()
	var produced int
	for i := range n {
		tenant := fmt.Sprint("tenant-", i%200)
		p := tollgatev1.PartitionOf(tenant, 6)
		seq[p]++
		v, _ := proto.Marshal(&tollgatev1.DecisionEvent{GatewayId: "gw-bench", Epoch: 1, Partition: p, Seq: seq[p],
			TimeUnixMicros: now.UnixMicro(), Kind: tollgatev1.DecisionEvent_KIND_DECISION,
			KeyId: fmt.Sprintf("kid-%018d", i%20_000), KeyPrefix: "sk_bench_…", Tenant: tenant, Endpoint: "/v1/items",
			Method: "GET", Cost: 1, RuleId: "per-key", Algorithm: "token_bucket", Allowed: i%10 != 0, Reason: "allowed",
			Status: 200, Remaining: 5, ClientIp: "10.0.0.1", Surface: "proxy"})
		cl.Produce(context.Background(), &kgo.Record{Topic: tollgatev1.TopicDecisions, Partition: p, Key: []byte(tenant), Value: v},
			func(_ *kgo.Record, err error) {
				if err != nil {
					b.Error(err)
				}
			})
		produced++
	}
	if err := cl.Flush(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	cmd, api := e.startAggregatorProcess(b)
	var total int64
	for time.Since(start) < 5*time.Minute {
		total = 0
		for i := range 200 {
			a, r, err := report(api, fmt.Sprint("tenant-", i))
			if err == nil {
				total += a + r
			}
		}
		if total >= n {
			break
		}
		<-time.After(200 * time.Millisecond)
	}
	wall := time.Since(start)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	_ = cmd.Wait()
	b.StopTimer()
	if total != n {
		b.Fatalf("report holds %d events, want %d", total, n)
	}
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	b.ReportMetric(float64(n)/cpu.Seconds(), "events/cpu-s")
	b.ReportMetric(float64(n)/wall.Seconds(), "events/s-wall")
	b.ReportMetric(float64(cpu.Nanoseconds())/n, "cpu-ns/event")
	b.Logf("%d events: aggregator CPU %v (%.0f events per CPU second), wall %v including start and the report polls",
		n, cpu.Round(time.Millisecond), float64(n)/cpu.Seconds(), wall.Round(time.Millisecond))
}

// BenchmarkDecisionToReport measures the "decision → report row" (p99 < 2 s)
// latency: decisions through a gateway's check API at a steady pace, and
// the time until the aggregator's report counts each batch.
//
//	go test -run '^$' -bench DecisionToReport -benchtime 1x ./compose/pipeline
func BenchmarkDecisionToReport(b *testing.B) {
	e := newEnvTB(b, true)
	g := e.startGateway("gw-lag")
	made := counts{}
	var lags []time.Duration
	for range 60 {
		sent := time.Now()
		send(b, 5, made, g.api)
		var want int64
		for _, c := range made {
			want += c.allowed + c.rejected
		}
		for time.Since(sent) < 30*time.Second {
			var got int64
			for tenant := range made {
				a, r, err := report(e.agg.Addrs().API, tenant)
				if err == nil {
					got += a + r
				}
			}
			if got >= want {
				break
			}
			<-time.After(5 * time.Millisecond)
		}
		lags = append(lags, time.Since(sent))
	}
	slices.Sort(lags)
	p := func(q float64) time.Duration { return lags[int(q*float64(len(lags)-1))] }
	b.ReportMetric(float64(p(0.5).Milliseconds()), "p50-ms")
	b.ReportMetric(float64(p(0.99).Milliseconds()), "p99-ms")
	b.Logf("decision → report row over %d batches: p50 %v, p99 %v, max %v", len(lags), p(0.5), p(0.99), lags[len(lags)-1])
}

// startAggregatorProcess starts an aggregator in its own process (the test
// binary re-executed), returning its API address.
func (e *env) startAggregatorProcess(tb testing.TB) (*exec.Cmd, string) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), aggChildEnv+"=1",
		"TOLLGATE_KAFKA_BROKERS="+strings.Join(e.broker.Addrs(), ","), "TOLLGATE_AGGREGATOR_ID=agg-bench",
		"TOLLGATE_DATA_DIR="+tb.TempDir(), "TOLLGATE_AGGREGATOR_LISTEN=127.0.0.1:0",
		"TOLLGATE_AGGREGATOR_METRICS_LISTEN=off", "TOLLGATE_ADMIN_TOKEN="+token, "TOLLGATE_KEY_SECRET="+secret,
		"TOLLGATE_AGGREGATOR_GROUP=bench-"+fmt.Sprint(time.Now().UnixNano()))
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if !strings.HasPrefix(line, "api ") {
		_ = cmd.Process.Kill()
		tb.Fatalf("aggregator child printed %q: %v", line, err)
	}
	return cmd, strings.TrimSpace(strings.TrimPrefix(line, "api "))
}
