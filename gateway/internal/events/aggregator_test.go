package events_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tollgate/tollgate/aggregator"
	"github.com/tollgate/tollgate/internal/logtest"
	"github.com/tollgate/tollgate/internal/promtest"
	"github.com/tollgate/tollgate/internal/testnet"
	"github.com/tollgate/tollgate/internal/testwait"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// TestAggregatorCountsEveryEventOnce feeds the aggregator itself (its
// windows deduplication) a stream with a SIGKILLed epoch, a spool replay,
// EpochClosed markers and a graceful restart, and requires its counts of
// applied, duplicate and missing events to equal what aggregate computes
// from the same topic: the tests' dedupe model is the aggregator's. A
// graceful stop adds nothing missing, and the aggregator's missing count is
// what the killed gateway really lost: at least the decisions it recorded
// that never arrived, at most those and the ones it recorded after its
// last report (one batch).
func TestAggregatorCountsEveryEventOnce(t *testing.T) {
	t.Parallel()
	brokers := startKafka(t, 0, "").Addrs()
	agg := startAggregator(t, brokers)
	dir := t.TempDir()

	// A gateway recording at 50,000 decisions a second is SIGKILLed.
	ch := startChild(t, "record", envBrokers+"="+brokers[0], envSpool+"="+dir)
	killed, err := strconv.ParseUint(ch.line(t, "epoch "), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	recorded := 0
	for recorded < 15_000 {
		recorded, _ = parseRecorded(t, ch.line(t, "recorded "))
	}
	if err := ch.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	for ch.out.Scan() { // what it printed before it died
		if s, ok := strings.CutPrefix(ch.out.Text(), "recorded "); ok {
			recorded, _ = parseRecorded(t, s)
		}
	}
	_ = ch.cmd.Wait()

	// Restarted on its spool: replay, markers, new events, graceful stop;
	// then once more.
	for round := range 2 {
		p := start(t, testConfig(t, brokers, dir))
		recordN(p, 100_000*(round+1), 2000)
		p.waitDrained(t, 60*time.Second)
		p.shutdown(t)
	}

	// A replay repeats an in-order prefix of each partition.
	recs := readAll(t, brokers)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.DefaultProduceTopic(tollgatev1.TopicDecisions))
	if err != nil {
		t.Fatal(err)
	}
	var again []*kgo.Record
	for _, r := range recs {
		if r.Offset < 1000 {
			again = append(again, &kgo.Record{Partition: r.Partition, Key: r.Key, Value: r.Value})
		}
	}
	err = cl.ProduceSync(context.Background(), again...).FirstErr()
	cl.Close()
	if err != nil {
		t.Fatal(err)
	}

	want := aggregate(t, readAll(t, brokers))
	t.Logf("topic: %d applied, %d duplicates, %d missing, %d markers", want.applied, want.duplicates, want.missing, want.markers)
	if want.duplicates < len(again) {
		t.Fatalf("%d duplicates, fewer than the %d records replayed", want.duplicates, len(again))
	}
	took := testwait.Eventually(t, 90*time.Second, func() error {
		applied := promtest.Sum(t, agg.Registry(), "tollgate_aggregator_events_total", "result", "applied")
		dups := promtest.Sum(t, agg.Registry(), "tollgate_aggregator_events_total", "result", "duplicate")
		missing := promtest.Sum(t, agg.Registry(), "tollgate_aggregator_events_missing_total")
		if applied != float64(want.applied) || dups != float64(want.duplicates) || missing != float64(want.missing) {
			return fmt.Errorf("aggregator: %v applied, %v duplicates, %v missing; the topic says %d, %d, %d",
				applied, dups, missing, want.applied, want.duplicates, want.missing)
		}
		return nil
	})
	t.Logf("aggregator agreed after %v", took)
	// What the gateway's clients saw decided, against what the aggregator
	// says is missing: the killed epoch's loss, and nothing for the
	// graceful stops.
	lost := uint64(recorded - want.byEpoch[killed])
	missing := uint64(promtest.Sum(t, agg.Registry(), "tollgate_aggregator_events_missing_total"))
	t.Logf("the killed gateway recorded %d decisions, %d arrived: %d lost; the aggregator counts %d missing", recorded,
		want.byEpoch[killed], lost, missing)
	if missing < lost || missing > lost+recordBatch {
		t.Errorf("the aggregator counts %d missing; the gateway lost between %d and %d", missing, lost, lost+recordBatch)
	}
	// The killed epoch's markers count its lost tail; the gracefully
	// stopped one closes with nothing missing.
	closed := map[uint64]int{}
	for s, m := range want.marks {
		if m.closed {
			closed[s.epoch]++
		}
		if m.missing != 0 && s.epoch != killed {
			t.Errorf("gracefully stopped epoch %x partition %d: %d missing", s.epoch, s.partition, m.missing)
		}
	}
	if len(closed) != 2 || closed[killed] != partitions {
		t.Errorf("closed partitions per epoch: %v (killed epoch %x)", closed, killed)
	}
}

// startAggregator runs an aggregator instance until the test ends.
func startAggregator(t *testing.T, brokers []string) *aggregator.Server {
	t.Helper()
	cfg := aggregator.Config{
		Listen:         "127.0.0.1:0",
		MetricsListen:  "127.0.0.1:0",
		ID:             "agg-" + t.Name(),
		DataDir:        t.TempDir(),
		AdminToken:     "test-admin-token",
		KeySecret:      "0123456789abcdef-secret",
		SessionTimeout: 2 * time.Second,
	}
	cfg.Kafka.Brokers = brokers
	cfg.Kafka.Partitions = partitions
	cfg.Usage.Lateness = time.Second
	srv, err := aggregator.New(cfg, logtest.Verbose(t).With("aggregator", cfg.ID))
	if err != nil {
		t.Fatal(err)
	}
	testnet.RunUntilCleanup(t, "aggregator", srv.Run)
	return srv
}
