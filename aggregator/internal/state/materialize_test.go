package state

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tollgate/tollgate/compose/kafkabroker"
)

// TestRestoreEndsAtATransactionAbortedWithoutItsMarker: a broker that
// crashed with a transaction open on the changelog comes back with that
// transaction aborted but no abort marker written (the test broker does
// this), so no read-committed reader is ever given a record at the offsets
// before the last stable offset. Restore, waiting for that offset after an
// assignment, must still return, and only after the committed records
// before the gap are in the DB. Before the fix it waited for good, and the
// aggregator, holding polled work it could never commit, said "stalled".
func TestRestoreEndsAtATransactionAbortedWithoutItsMarker(t *testing.T) {
	t.Parallel()
	const topic = "tollgate.changelog.test"
	cases := []struct {
		name      string
		partition int32
		committed int // records committed before the transaction left open
	}{
		{"committed records, then the open transaction", 0, 2},
		{"only the open transaction", 1, 0},
	}
	dir := t.TempDir()
	b1, err := kafkabroker.Start(t.Context(), kafkabroker.WithDataDir(dir), kafkabroker.WithPartitions(2),
		kafkabroker.WithSeedTopics(topic))
	if err != nil {
		t.Fatal(err)
	}
	addr := b1.Addr()
	for _, c := range cases {
		produceTxn(t, addr, topic, "committed-"+c.name, c.partition, c.committed, true)
	}
	var openTxns []*kgo.Client
	for _, c := range cases {
		openTxns = append(openTxns, produceTxn(t, addr, topic, "open-"+c.name, c.partition, 3, false))
	}
	// The files as a crash leaves them: copied while the transactions are open.
	crashed := t.TempDir()
	if err := os.CopyFS(crashed, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	for _, cl := range openTxns {
		cl.Close()
	}
	if err := b1.Stop(); err != nil {
		t.Fatal(err)
	}
	b2, err := kafkabroker.Start(t.Context(), kafkabroker.WithDataDir(crashed), kafkabroker.WithListen(addr),
		kafkabroker.WithPartitions(2))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b2.Stop() })

	admCl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer admCl.Close()
	stable, err := kadm.NewClient(admCl).ListCommittedOffsets(t.Context(), topic)
	if err != nil {
		t.Fatal(err)
	}

	db := open(t)
	m := NewMaterializer(db, nil, nil)
	parts := map[int32]bool{}
	for _, c := range cases {
		parts[c.partition] = true
	}
	resume, err := m.Resume(parts)
	if err != nil {
		t.Fatal(err)
	}
	offsets := map[int32]kgo.Offset{}
	for q, off := range resume {
		offsets[q] = kgo.NewOffset().At(off)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: offsets}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	// No start offsets: only Restore waits, as after an assignment.
	wg.Go(func() {
		if err := m.Run(ctx, cl, admCl, topic, nil, func() {}); err != nil {
			t.Errorf("Run: %v", err)
		}
	})

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o, ok := stable.Lookup(topic, c.partition)
			if !ok || o.Err != nil {
				t.Fatalf("no last stable offset for partition %d: %v", c.partition, o.Err)
			}
			// Committed records and their marker, then the aborted ones.
			written := int64(c.committed) + 3
			if c.committed > 0 {
				written++
			}
			if o.Offset != written {
				t.Fatalf("last stable offset %d, want %d (the broker did not abort the open transaction as expected)", o.Offset, written)
			}
			rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
			defer rcancel()
			if _, err := m.Restore(rctx, c.partition, o.Offset); err != nil {
				t.Fatalf("Restore(%d, %d): %v (the DB holds up to %d)", c.partition, o.Offset, err, m.Next(c.partition))
			}
			// What was committed was materialized, not skipped: the DB's own
			// offset moves only with records it applied.
			held, err := db.Offset(TopicChangelog, c.partition)
			if err != nil {
				t.Fatal(err)
			}
			if want := int64(c.committed) + min(int64(c.committed), 1); held != want {
				t.Errorf("the DB applied the changelog up to %d, want %d (the committed records and their marker)", held, want)
			}
		})
	}
}

// produceTxn writes n records to partition q of topic in a transaction
// of its own, committed when commit, else left open (the client is
// returned, to be closed once the broker's files are copied).
func produceTxn(t *testing.T, addr, topic, id string, q int32, n int, commit bool) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.TransactionalID(id),
		kgo.TransactionTimeout(10*time.Minute), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		cl.Close()
		return nil
	}
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for range n {
		r := &kgo.Record{Topic: topic, Partition: q, Key: []byte(id), Value: []byte("x")}
		if err := cl.ProduceSync(t.Context(), r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	if !commit {
		return cl
	}
	if err := cl.EndTransaction(t.Context(), kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	cl.Close()
	return nil
}
