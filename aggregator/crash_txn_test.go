package aggregator_test

import (
	"os"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tollgate/tollgate/compose/kafkabroker"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// TestReadyAfterBrokerCrashMidTransaction: a broker that crashed while a
// transaction was open on the changelog comes back with that transaction
// aborted. An aggregator started against it must still restore its state
// and say ready: the changelog's end is its last stable offset, whether or
// not a record sits just before it.
//
// The chaos soak found it: the test broker (kfake) aborts such a
// transaction without writing its abort marker, so a read-committed
// reader never gets a record at the last stable offset − 1, and the
// aggregator waited for one for good.
func TestReadyAfterBrokerCrashMidTransaction(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b1, err := kafkabroker.Start(t.Context(), kafkabroker.WithDataDir(dir), kafkabroker.WithPartitions(partitions))
	if err != nil {
		t.Fatal(err)
	}
	addr := b1.Addr()
	first := startAggregator(t, []string{addr}, "agg-crash", t.TempDir())
	waitReadyz(t, first.srv.Addrs().Metrics, 60*time.Second, ready)
	first.stop(t)

	// A transaction left open on changelog partition 0, as a producer
	// that was writing when the broker died leaves it.
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.TransactionalID("crash-writer"),
		kgo.TransactionTimeout(10*time.Minute), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		r := &kgo.Record{Topic: tollgatev1.TopicChangelog, Partition: 0, Key: []byte("crash"), Value: []byte("never committed")}
		if err := cl.ProduceSync(t.Context(), r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	// The files as a crash leaves them: copied while the broker runs.
	crashed := t.TempDir()
	if err := os.CopyFS(crashed, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	cl.Close()
	if err := b1.Stop(); err != nil {
		t.Fatal(err)
	}

	b2, err := kafkabroker.Start(t.Context(), kafkabroker.WithDataDir(crashed), kafkabroker.WithListen(addr),
		kafkabroker.WithPartitions(partitions))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b2.Stop() })
	second := startAggregator(t, []string{addr}, "agg-crash", t.TempDir())
	waitReadyz(t, second.srv.Addrs().Metrics, 30*time.Second, ready)
}
