package kafkabroker_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tollgate/tollgate/compose/kafkabroker"
	"github.com/tollgate/tollgate/compose/kafkabroker/kafkatest"
	"github.com/tollgate/tollgate/internal/logtest"
	"github.com/tollgate/tollgate/internal/testnet"
	"github.com/tollgate/tollgate/internal/testwait"
)

// Client timeouts short enough for tests (see the package doc's traps).
const (
	sessionTimeout   = time.Second
	heartbeat        = 100 * time.Millisecond
	rebalanceTimeout = 2 * time.Second
	txnTimeout       = 10 * time.Second
	waitTimeout      = 15 * time.Second
	marker           = "__marker__"
)

// newClient returns a kgo client for b, closed at cleanup.
func newClient(t *testing.T, b *kafkabroker.Broker, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	opts = append([]kgo.Opt{
		kgo.SeedBrokers(b.Addrs()...),
		kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	}, opts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatalf("new kgo client: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// groupOpts make a group member that notices a lost peer within a second.
func groupOpts(group string, topics ...string) []kgo.Opt {
	return []kgo.Opt{
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topics...),
		kgo.SessionTimeout(sessionTimeout),
		kgo.HeartbeatInterval(heartbeat),
		kgo.RebalanceTimeout(rebalanceTimeout),
	}
}

func newAdmin(t *testing.T, b *kafkabroker.Broker) *kadm.Client {
	t.Helper()
	return kadm.NewClient(newClient(t, b))
}

// createTopic creates topic with the broker's default replication factor.
func createTopic(t *testing.T, adm *kadm.Client, topic string, partitions int32, configs map[string]*string) {
	t.Helper()
	resp, err := adm.CreateTopic(t.Context(), partitions, -1, configs, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
}

func produce(t *testing.T, cl *kgo.Client, topic string, values ...string) {
	t.Helper()
	recs := make([]*kgo.Record, len(values))
	for i, v := range values {
		recs[i] = &kgo.Record{Topic: topic, Key: []byte(v), Value: []byte(v)}
	}
	if err := cl.ProduceSync(t.Context(), recs...).FirstErr(); err != nil {
		t.Fatalf("produce to %s: %v", topic, err)
	}
}

func seq(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + strconv.Itoa(i)
	}
	return out
}

// markAll appends a marker record to every partition of topic with a plain
// producer, so readToMarkers knows where the log ends.
func markAll(t *testing.T, b *kafkabroker.Broker, topic string, partitions int32) {
	t.Helper()
	cl := newClient(t, b, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	recs := make([]*kgo.Record, partitions)
	for p := range partitions {
		recs[p] = &kgo.Record{Topic: topic, Partition: p, Value: []byte(marker)}
	}
	if err := cl.ProduceSync(t.Context(), recs...).FirstErr(); err != nil {
		t.Fatalf("mark %s: %v", topic, err)
	}
}

// readToMarkers reads topic from the start until it has seen a marker on
// each of its partitions and returns the other records, in offset order
// per partition. A record written after a marker is not read, so markAll
// must come last.
func readToMarkers(t *testing.T, b *kafkabroker.Broker, topic string, partitions int32, opts ...kgo.Opt) []*kgo.Record {
	t.Helper()
	cl := newClient(t, b, append([]kgo.Opt{kgo.ConsumeTopics(topic)}, opts...)...)
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	var out []*kgo.Record
	seen := map[int32]bool{}
	for len(seen) < int(partitions) {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read %s: markers seen on %d of %d partitions, %d records: %v", topic, len(seen), partitions, len(out), err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			switch {
			case seen[r.Partition]:
			case string(r.Value) == marker:
				seen[r.Partition] = true
			default:
				out = append(out, r)
			}
		})
	}
	return out
}

func values(recs []*kgo.Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = string(r.Value)
	}
	return out
}

// sameSet fails unless got holds each of want exactly once.
func sameSet(t *testing.T, what string, got, want []string) {
	t.Helper()
	g := slices.Sorted(slices.Values(got))
	w := slices.Sorted(slices.Values(want))
	if !slices.Equal(g, w) {
		t.Fatalf("%s: got %d values %v, want %d values %v", what, len(g), g, len(w), w)
	}
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	b := kafkatest.StartTB(t)
	t.Logf("broker started in %v at %s", time.Since(t0), b.Addr())

	adm := newAdmin(t, b)
	createTopic(t, adm, "rt", -1, nil) // -1: the broker's default count
	details, err := adm.ListTopics(t.Context(), "rt")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(details["rt"].Partitions); n != kafkabroker.DefaultPartitions {
		t.Fatalf("topic created with -1 partitions has %d, want %d", n, kafkabroker.DefaultPartitions)
	}

	want := seq("v", 100)
	produce(t, newClient(t, b), "rt", want...)
	markAll(t, b, "rt", kafkabroker.DefaultPartitions)
	sameSet(t, "consumed", values(readToMarkers(t, b, "rt", kafkabroker.DefaultPartitions)), want)
}

func TestAutoCreateTopic(t *testing.T) {
	t.Parallel()
	b := kafkatest.StartTB(t, kafkabroker.WithPartitions(3))
	produce(t, newClient(t, b, kgo.AllowAutoTopicCreation()), "auto", "a")
	details, err := newAdmin(t, b).ListTopics(t.Context(), "auto")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(details["auto"].Partitions); n != 3 {
		t.Fatalf("auto-created topic has %d partitions, want 3", n)
	}
}

func TestSeedTopicsAndBrokers(t *testing.T) {
	t.Parallel()
	b := kafkatest.StartTB(t, kafkabroker.WithBrokers(3), kafkabroker.WithPartitions(4),
		kafkabroker.WithSeedTopics("seed.a", "seed.b"))
	if n := len(b.Addrs()); n != 3 {
		t.Fatalf("Addrs = %v, want 3 brokers", b.Addrs())
	}
	details, err := newAdmin(t, b).ListTopics(t.Context(), "seed.a", "seed.b")
	if err != nil {
		t.Fatal(err)
	}
	leaders := map[int32]bool{}
	for _, topic := range []string{"seed.a", "seed.b"} {
		if n := len(details[topic].Partitions); n != 4 {
			t.Fatalf("seed topic %s has %d partitions, want 4", topic, n)
		}
		for _, p := range details[topic].Partitions {
			leaders[p.Leader] = true
		}
	}
	if len(leaders) < 2 {
		t.Fatalf("partition leaders %v: want them spread over the brokers", leaders)
	}
	produce(t, newClient(t, b), "seed.a", seq("s", 20)...)
	markAll(t, b, "seed.a", 4)
	sameSet(t, "consumed", values(readToMarkers(t, b, "seed.a", 4)), seq("s", 20))
}

// TestStartWaitsForPorts: with WithWaitForPorts, Start waits, as Up does,
// while the port is taken (the other starters' WithListen behaviour is
// held to one test in compose/internal/lifecycle).
func TestStartWaitsForPorts(t *testing.T) {
	t.Parallel()
	l := testnet.Listen(t)
	addr := l.Addr().String()
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, err := kafkabroker.Start(ctx, kafkabroker.WithListen(addr), kafkabroker.WithWaitForPorts())
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("Start(WithWaitForPorts) on taken %s = %v, want a deadline error after EADDRINUSE", addr, err)
	}
}

func TestRestartKeepsDataAndGroupOffsets(t *testing.T) {
	t.Parallel()
	b := kafkatest.StartTB(t)
	adm := newAdmin(t, b)
	createTopic(t, adm, "keep", 2, nil)
	produce(t, newClient(t, b), "keep", seq("a", 30)...)

	// A group member consumes everything and commits.
	consumeAndCommit := func(n int) []string {
		t.Helper()
		cl := newClient(t, b, append(groupOpts("keepers", "keep"), kgo.DisableAutoCommit())...)
		defer cl.Close()
		ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
		defer cancel()
		var got []string
		for len(got) < n {
			fs := cl.PollFetches(ctx)
			if ctx.Err() != nil {
				t.Fatalf("consumed %d of %d: %v", len(got), n, ctx.Err())
			}
			got = append(got, values(fs.Records())...)
		}
		if err := cl.CommitUncommittedOffsets(ctx); err != nil {
			t.Fatalf("commit: %v", err)
		}
		return got
	}
	sameSet(t, "first read", consumeAndCommit(30), seq("a", 30))

	t0 := time.Now()
	if err := b.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Logf("restart took %v", time.Since(t0))

	ends, err := adm.ListEndOffsets(t.Context(), "keep")
	if err != nil {
		t.Fatal(err)
	}
	committed, err := adm.FetchOffsets(t.Context(), "keepers")
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	ends.Each(func(o kadm.ListedOffset) {
		total += o.Offset
		c, ok := committed.Lookup(o.Topic, o.Partition)
		if !ok || c.At != o.Offset {
			t.Errorf("partition %d: committed %+v after restart, want %d", o.Partition, c, o.Offset)
		}
	})
	if total != 30 {
		t.Fatalf("end offsets sum to %d after restart, want 30", total)
	}
	markAll(t, b, "keep", 2)
	sameSet(t, "log after restart", values(readToMarkers(t, b, "keep", 2)), seq("a", 30))

	// The group resumes from its committed offsets: only new records.
	produce(t, newClient(t, b), "keep", seq("b", 10)...)
	got := consumeAndCommit(12) // 10 records and the 2 markers
	sameSet(t, "read after restart", got, append(seq("b", 10), marker, marker))
}

func TestDataDirAcrossBrokers(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b1, err := kafkabroker.Start(t.Context(), kafkabroker.WithDataDir(dir), kafkabroker.WithSeedTopics("persist"))
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(b1.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	produce(t, cl, "persist", seq("p", 10)...)
	cl.Close()
	if err := b1.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("Stop removed a data dir it did not create: %v", err)
	}

	b2 := kafkatest.StartTB(t, kafkabroker.WithDataDir(dir))
	if b2.DataDir() != dir {
		t.Fatalf("DataDir = %s, want %s", b2.DataDir(), dir)
	}
	markAll(t, b2, "persist", kafkabroker.DefaultPartitions)
	sameSet(t, "read from a new broker on the same dir", values(readToMarkers(t, b2, "persist", kafkabroker.DefaultPartitions)), seq("p", 10))
}

// dialCounter is a kgo hook counting failed dials.
type dialCounter struct{ failed atomic.Int64 }

func (d *dialCounter) OnBrokerConnect(_ kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err != nil {
		d.failed.Add(1)
	}
}

func TestIdempotentProducerAcrossDownUp(t *testing.T) {
	t.Parallel()
	b := kafkatest.StartTB(t)
	createTopic(t, newAdmin(t, b), "outage", 3, nil)
	dials := &dialCounter{}
	// With kgo's defaults the buffered records go out about 5s after Up:
	// a client refreshes metadata at most every MetadataMinAge (5s), and
	// its retry backoff grows to 5s. Short values keep the test short.
	cl := newClient(t, b, kgo.WithHooks(dials), kgo.DefaultProduceTopic("outage"),
		kgo.RetryBackoffFn(func(int) time.Duration { return 100 * time.Millisecond }),
		kgo.MetadataMinAge(100*time.Millisecond))
	produce(t, cl, "outage", seq("before", 50)...)

	if err := b.Down(); err != nil {
		t.Fatal(err)
	}
	if err := b.Down(); err != nil {
		t.Fatalf("second Down: %v", err)
	}
	if b.Cluster() != nil {
		t.Fatal("Cluster() is not nil while down")
	}
	// Produce while down: kgo buffers the records and retries.
	var (
		mu       sync.Mutex
		failures []error
		acked    atomic.Int64
	)
	during := seq("during", 50)
	for _, v := range during {
		cl.Produce(t.Context(), &kgo.Record{Key: []byte(v), Value: []byte(v)}, func(_ *kgo.Record, err error) {
			if err != nil {
				mu.Lock()
				failures = append(failures, err)
				mu.Unlock()
				return
			}
			acked.Add(1)
		})
	}
	// Stay down until the client has failed to dial.
	testwait.Eventually(t, waitTimeout, func() error {
		if n := dials.failed.Load(); n < 1 {
			return fmt.Errorf("%d failed dials so far", n)
		}
		return nil
	})
	if n := acked.Load(); n != 0 {
		t.Fatalf("%d records acknowledged while the broker was down", n)
	}

	t0 := time.Now()
	if err := b.Up(t.Context()); err != nil {
		t.Fatal(err)
	}
	upTook := time.Since(t0)
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	if err := cl.Flush(ctx); err != nil {
		t.Fatalf("flush after Up: %v", err)
	}
	t.Logf("Up took %v; buffered records acknowledged %v after Up (%d failed dials while down)",
		upTook, time.Since(t0), dials.failed.Load())
	mu.Lock()
	if len(failures) > 0 {
		t.Fatalf("%d records failed: %v", len(failures), failures[0])
	}
	mu.Unlock()
	produce(t, cl, "outage", seq("after", 50)...)

	markAll(t, b, "outage", 3)
	want := slices.Concat(seq("before", 50), during, seq("after", 50))
	sameSet(t, "records across the outage", values(readToMarkers(t, b, "outage", 3)), want)
}

func TestTransactionsReadCommitted(t *testing.T) {
	t.Parallel()
	b := kafkatest.StartTB(t)
	createTopic(t, newAdmin(t, b), "txn", 1, nil)
	cl := newClient(t, b, kgo.TransactionalID("txn-test"), kgo.TransactionTimeout(txnTimeout),
		kgo.DefaultProduceTopic("txn"))

	inTxn := func(values []string, commit kgo.TransactionEndTry) {
		t.Helper()
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		produce(t, cl, "txn", values...)
		if err := cl.EndTransaction(t.Context(), commit); err != nil {
			t.Fatalf("end transaction (commit %v): %v", commit, err)
		}
	}
	inTxn(seq("aborted", 5), kgo.TryAbort)
	inTxn(seq("committed", 5), kgo.TryCommit)

	// A transaction still open across a broker restart: kfake restores it
	// and it commits afterwards.
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	produce(t, cl, "txn", seq("open", 5)...)
	if err := b.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := cl.EndTransaction(t.Context(), kgo.TryCommit); err != nil {
		t.Fatalf("commit a transaction begun before the restart: %v", err)
	}

	markAll(t, b, "txn", 1)
	committed := values(readToMarkers(t, b, "txn", 1, kgo.FetchIsolationLevel(kgo.ReadCommitted())))
	if want := slices.Concat(seq("committed", 5), seq("open", 5)); !slices.Equal(committed, want) {
		t.Fatalf("read_committed read %v, want %v", committed, want)
	}
	all := values(readToMarkers(t, b, "txn", 1, kgo.FetchIsolationLevel(kgo.ReadUncommitted())))
	if want := slices.Concat(seq("aborted", 5), seq("committed", 5), seq("open", 5)); !slices.Equal(all, want) {
		t.Fatalf("read_uncommitted read %v, want %v", all, want)
	}
}

func TestOpenTransactionBlocksReadCommitted(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		timeout time.Duration
		end     func(*testing.T, *kgo.Client) // nil: let the transaction time out
		want    []string
	}{
		{"until commit", txnTimeout, func(t *testing.T, tx *kgo.Client) {
			if err := tx.EndTransaction(t.Context(), kgo.TryCommit); err != nil {
				t.Fatal(err)
			}
		}, []string{"before", "pending", "after"}},
		// A producer that dies mid transaction: the broker aborts the
		// transaction once its timeout passes.
		{"until timeout", time.Second, nil, []string{"before", "after"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := kafkatest.StartTB(t)
			createTopic(t, newAdmin(t, b), "lso", 1, nil)
			tx := newClient(t, b, kgo.TransactionalID("lso-test"), kgo.TransactionTimeout(tc.timeout))
			plain := newClient(t, b)
			produce(t, plain, "lso", "before")
			if err := tx.BeginTransaction(); err != nil {
				t.Fatal(err)
			}
			produce(t, tx, "lso", "pending")
			produce(t, plain, "lso", "after")
			t0 := time.Now()

			// A read_committed reader stops at the open transaction's
			// first record (the last stable offset), so "after" is held
			// back too.
			rc := newClient(t, b, kgo.ConsumeTopics("lso"), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
			var got []string
			readUntil := func(want []string) {
				t.Helper()
				testwait.Eventually(t, waitTimeout, func() error {
					ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
					defer cancel()
					got = append(got, values(rc.PollFetches(ctx).Records())...)
					if !slices.Equal(got, want) {
						return fmt.Errorf("read %v, want %v", got, want)
					}
					return nil
				})
			}
			readUntil([]string{"before"})
			if tc.end != nil {
				tc.end(t, tx)
			}
			readUntil(tc.want)
			t.Logf("read_committed reader blocked for %v", time.Since(t0).Round(time.Millisecond))
		})
	}
}

func TestTransactionalProducerFenced(t *testing.T) {
	t.Parallel()
	b := kafkatest.StartTB(t)
	createTopic(t, newAdmin(t, b), "fence", 1, nil)
	opts := []kgo.Opt{kgo.TransactionalID("same-id"), kgo.TransactionTimeout(txnTimeout)}
	zombie := newClient(t, b, opts...)
	if err := zombie.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	produce(t, zombie, "fence", "zombie")

	// A new instance with the same transactional id (a restarted
	// aggregator) fences the old one and aborts its open transaction.
	fresh := newClient(t, b, opts...)
	if err := fresh.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	produce(t, fresh, "fence", "fresh")
	if err := fresh.EndTransaction(t.Context(), kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	err := zombie.EndTransaction(t.Context(), kgo.TryCommit)
	if err == nil {
		t.Fatal("the fenced producer committed")
	}
	t.Logf("fenced producer's commit: %v", err)

	markAll(t, b, "fence", 1)
	if got := values(readToMarkers(t, b, "fence", 1, kgo.FetchIsolationLevel(kgo.ReadCommitted()))); !slices.Equal(got, []string{"fresh"}) {
		t.Fatalf("read_committed read %v, want [fresh]", got)
	}
}

// transactor runs kgo's consume-transform-produce loop, the aggregator's
// shape: in one transaction, copy what it polls from "in" to "out" and
// commit the consumed offsets.
type transactor struct {
	s         *kgo.GroupTransactSession
	assigned  atomic.Int64 // partitions currently assigned
	commits   atomic.Int64
	aborts    atomic.Int64
	lastError atomic.Pointer[error]
}

// copyInput is how many records startCopy produces to "in".
const copyInput = 200

// startCopy starts a broker for transactors to copy on: topics "in" and
// "out" of four partitions each, and copyInput records in "in".
func startCopy(t *testing.T) (*kafkabroker.Broker, *kadm.Client) {
	t.Helper()
	b := kafkatest.StartTB(t)
	adm := newAdmin(t, b)
	createTopic(t, adm, "in", 4, nil)
	createTopic(t, adm, "out", 4, nil)
	produce(t, newClient(t, b), "in", seq("e", copyInput)...)
	return b, adm
}

func newTransactor(t *testing.T, b *kafkabroker.Broker, id string) *transactor {
	t.Helper()
	tr := &transactor{}
	count := func(sign int64) func(context.Context, *kgo.Client, map[string][]int32) {
		return func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			for _, ps := range m {
				tr.assigned.Add(sign * int64(len(ps)))
			}
		}
	}
	opts := append(groupOpts("aggregators", "in"),
		kgo.SeedBrokers(b.Addrs()...),
		kgo.ClientID(id),
		kgo.TransactionalID(id),
		kgo.TransactionTimeout(txnTimeout),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.RequireStableFetchOffsets(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100*time.Millisecond),
		kgo.MetadataMinAge(100*time.Millisecond), // see TestIdempotentProducerAcrossDownUp
		kgo.RetryBackoffFn(func(int) time.Duration { return 100 * time.Millisecond }),
		kgo.OnPartitionsAssigned(count(1)),
		kgo.OnPartitionsRevoked(count(-1)),
		kgo.OnPartitionsLost(count(-1)),
	)
	s, err := kgo.NewGroupTransactSession(opts...)
	if err != nil {
		t.Fatal(err)
	}
	tr.s = s
	t.Cleanup(s.Close)
	return tr
}

// step runs one transaction: poll up to 20 records (waiting up to 100ms),
// copy them, then end with commit. hold, if set, runs between producing and
// ending.
func (tr *transactor) step(ctx context.Context, hold func()) (polled int, committed bool, err error) {
	if err := tr.s.Begin(); err != nil {
		return 0, false, err
	}
	pctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	fs := tr.s.PollRecords(pctx, 20)
	cancel()
	var recs []*kgo.Record
	fs.EachRecord(func(r *kgo.Record) {
		recs = append(recs, &kgo.Record{Topic: "out", Key: r.Key, Value: r.Value})
	})
	if len(recs) > 0 {
		if err := tr.s.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			_, _ = tr.s.End(ctx, kgo.TryAbort)
			return 0, false, err
		}
	}
	if hold != nil {
		hold()
	}
	committed, err = tr.s.End(ctx, kgo.TryCommit)
	if committed {
		tr.commits.Add(1)
	} else {
		tr.aborts.Add(1)
	}
	return len(recs), committed, err
}

// loop runs steps until ctx ends, recording the last error.
func (tr *transactor) loop(ctx context.Context) {
	for ctx.Err() == nil {
		if _, _, err := tr.step(ctx, nil); err != nil && ctx.Err() == nil {
			tr.lastError.Store(&err)
		}
	}
}

func TestGroupTransactSession(t *testing.T) {
	t.Parallel()
	b, adm := startCopy(t)
	const n = copyInput

	// Member A copies a first batch but holds its transaction open until
	// member B has joined and taken partitions: the rebalance must abort
	// A's transaction, and nothing A copied in it may become visible.
	a := newTransactor(t, b, "agg-a")
	var bMember *transactor
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var heldPolled int
	testwait.Eventually(t, waitTimeout, func() error {
		polled, committed, err := a.step(ctx, func() {})
		if err != nil {
			t.Fatalf("first transaction: %v", err)
		}
		if committed && polled > 0 {
			return nil // A committed a batch alone: fine, now hold the next one
		}
		return errors.New("A has not committed a batch yet")
	})
	polled, committed, err := a.step(ctx, func() {
		bMember = newTransactor(t, b, "agg-b")
		testwait.Eventually(t, waitTimeout, func() error {
			if n := bMember.assigned.Load(); n == 0 {
				return errors.New("B has no partitions yet")
			}
			return nil
		})
	})
	heldPolled = polled
	if err != nil {
		t.Fatalf("held transaction: %v", err)
	}
	if heldPolled == 0 {
		t.Fatal("the held transaction copied nothing; the test proves nothing")
	}
	if committed {
		t.Fatalf("A's transaction (%d records) committed across a rebalance that moved its partitions to B", polled)
	}
	t.Logf("A's transaction with %d copied records aborted by the rebalance; A holds %d partitions, B %d",
		heldPolled, a.assigned.Load(), bMember.assigned.Load())

	// Both members now copy the rest.
	var wg sync.WaitGroup
	for _, tr := range []*transactor{a, bMember} {
		wg.Go(func() { tr.loop(ctx) })
	}
	testwait.Eventually(t, waitTimeout, func() error {
		offs, err := adm.FetchOffsets(t.Context(), "aggregators")
		if err != nil {
			return err
		}
		var sum int64
		offs.Each(func(o kadm.OffsetResponse) { sum += o.At })
		if sum != n {
			return fmt.Errorf("committed input offsets sum to %d, want %d", sum, n)
		}
		return nil
	})
	cancel()
	wg.Wait()
	for _, tr := range []*transactor{a, bMember} {
		if p := tr.lastError.Load(); p != nil {
			t.Errorf("transactor error: %v", *p)
		}
	}
	t.Logf("commits: A %d, B %d; aborts: A %d, B %d", a.commits.Load(), bMember.commits.Load(),
		a.aborts.Load(), bMember.aborts.Load())

	markAll(t, b, "out", 4)
	sameSet(t, "committed output", values(readToMarkers(t, b, "out", 4, kgo.FetchIsolationLevel(kgo.ReadCommitted()))), seq("e", n))
	uncommitted := readToMarkers(t, b, "out", 4, kgo.FetchIsolationLevel(kgo.ReadUncommitted()))
	if len(uncommitted) < n+heldPolled {
		t.Errorf("read_uncommitted sees %d records, want at least %d (the aborted copies too)", len(uncommitted), n+heldPolled)
	}
}

func TestGroupTransactSessionAcrossRestart(t *testing.T) {
	t.Parallel()
	b, adm := startCopy(t)
	const n = copyInput

	tr := newTransactor(t, b, "agg-r")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var wg sync.WaitGroup
	var stepErrs []error
	wg.Go(func() {
		for ctx.Err() == nil {
			if _, _, err := tr.step(ctx, nil); err != nil && ctx.Err() == nil {
				stepErrs = append(stepErrs, err)
			}
		}
	})
	committedSum := func() (int64, error) {
		offs, err := adm.FetchOffsets(t.Context(), "aggregators")
		if err != nil {
			return 0, err
		}
		var sum int64
		offs.Each(func(o kadm.OffsetResponse) { sum += o.At })
		return sum, nil
	}
	testwait.Eventually(t, waitTimeout, func() error {
		if c := tr.commits.Load(); c < 2 {
			return fmt.Errorf("%d commits so far", c)
		}
		return nil
	})
	if err := b.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	testwait.Eventually(t, waitTimeout, func() error {
		sum, err := committedSum()
		if err != nil {
			return err
		}
		if sum != n {
			return fmt.Errorf("committed input offsets sum to %d, want %d", sum, n)
		}
		return nil
	})
	cancel()
	wg.Wait()
	t.Logf("after the restart the session finished the input in %v; %d commits, %d aborts, errors: %v",
		time.Since(t0).Round(time.Millisecond), tr.commits.Load(), tr.aborts.Load(), stepErrs)
	markAll(t, b, "out", 4)
	sameSet(t, "committed output", values(readToMarkers(t, b, "out", 4, kgo.FetchIsolationLevel(kgo.ReadCommitted()))), seq("e", n))
}

func TestCompaction(t *testing.T) {
	t.Parallel()
	compact := "compact"
	cases := []struct {
		name string
		opts []kafkabroker.Option
		run  func(*testing.T, *kafkabroker.Broker)
	}{
		{"on demand", nil, func(t *testing.T, b *kafkabroker.Broker) { b.Cluster().Compact() }},
		{"periodic", []kafkabroker.Option{kafkabroker.WithBrokerConfigs(map[string]string{"log.cleaner.backoff.ms": "50"})}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := kafkatest.StartTB(t, tc.opts...)
			adm := newAdmin(t, b)
			createTopic(t, adm, "changelog", 1, map[string]*string{"cleanup.policy": &compact})
			cfgs, err := adm.DescribeTopicConfigs(t.Context(), "changelog")
			if err != nil {
				t.Fatal(err)
			}
			if v, err := cfgs.On("changelog", nil); err != nil || !slices.ContainsFunc(v.Configs, func(c kadm.Config) bool {
				return c.Key == "cleanup.policy" && c.MaybeValue() == "compact"
			}) {
				t.Fatalf("topic configs %+v (%v): want cleanup.policy=compact", v.Configs, err)
			}

			// One batch per record: kfake compacts batch by batch and
			// never touches the last one.
			cl := newClient(t, b)
			for _, kv := range [][2]string{{"k1", "v1"}, {"k2", "v1"}, {"k1", "v2"}, {"k3", "v1"}, {"k1", "v3"}, {"k3", "v2"}} {
				rec := &kgo.Record{Topic: "changelog", Key: []byte(kv[0]), Value: []byte(kv[1])}
				if err := cl.ProduceSync(t.Context(), rec).FirstErr(); err != nil {
					t.Fatal(err)
				}
			}
			markAll(t, b, "changelog", 1)
			if tc.run != nil {
				tc.run(t, b)
			}
			want := []string{"k2=v1", "k1=v3", "k3=v2"}
			took := testwait.Eventually(t, waitTimeout, func() error {
				var got []string
				for _, r := range readToMarkers(t, b, "changelog", 1) {
					got = append(got, string(r.Key)+"="+string(r.Value))
				}
				if !slices.Equal(got, want) {
					return fmt.Errorf("compacted log %v, want %v", got, want)
				}
				return nil
			})
			t.Logf("compacted within %v", took)
		})
	}
}

// cuttableDialer dials normally until cut; then every dial fails and the
// connections it made are closed, as if the client's process had died.
type cuttableDialer struct {
	mu    sync.Mutex
	cut   bool
	conns []net.Conn
}

func (d *cuttableDialer) dial(ctx context.Context, network, host string) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cut {
		return nil, errors.New("cut")
	}
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, host)
	if err == nil {
		d.conns = append(d.conns, c)
	}
	return c, err
}

func (d *cuttableDialer) setCut(cut bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cut = cut
	if cut {
		for _, c := range d.conns {
			_ = c.Close()
		}
		d.conns = nil
	}
}

// assignment returns, per member client id, the partitions the group's
// members hold, once the group is stable.
func assignment(ctx context.Context, adm *kadm.Client, group string) (map[string]int, error) {
	gs, err := adm.DescribeGroups(ctx, group)
	if err != nil {
		return nil, err
	}
	g := gs[group]
	if g.Err != nil {
		return nil, g.Err
	}
	if g.State != "Stable" {
		return nil, fmt.Errorf("group %s is %s", group, g.State)
	}
	out := map[string]int{}
	for _, m := range g.Members {
		n := 0
		if ca, ok := m.Assigned.AsConsumer(); ok {
			for _, tp := range ca.Topics {
				n += len(tp.Partitions)
			}
		}
		out[m.ClientID] = n
	}
	return out, nil
}

func TestGroupRebalance(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		leave func(*kgo.Client, *cuttableDialer)
	}{
		// Close sends LeaveGroup: the peer takes over at once.
		{"member leaves", func(cl *kgo.Client, _ *cuttableDialer) { cl.Close() }},
		// A member that vanishes keeps its partitions until its
		// session times out.
		{"member vanishes", func(_ *kgo.Client, d *cuttableDialer) { d.setCut(true) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := kafkatest.StartTB(t)
			adm := newAdmin(t, b)
			createTopic(t, adm, "work", 6, nil)
			d := &cuttableDialer{}
			stay := newClient(t, b, append(groupOpts("workers", "work"), kgo.ClientID("stay"))...)
			goner := newClient(t, b, append(groupOpts("workers", "work"), kgo.ClientID("goner"), kgo.Dialer(d.dial))...)
			t.Cleanup(func() { d.setCut(false) }) // let the goner's Close reach the broker

			// Members rejoin from their heartbeat loop; polling keeps
			// cooperative revocations moving.
			ctx, cancel := context.WithCancel(t.Context())
			var wg sync.WaitGroup
			defer func() { cancel(); wg.Wait() }()
			poll := func(cl *kgo.Client) {
				for ctx.Err() == nil {
					pctx, pcancel := context.WithTimeout(ctx, 50*time.Millisecond)
					cl.PollFetches(pctx)
					pcancel()
				}
			}
			wg.Go(func() { poll(stay) })
			gctx, gcancel := context.WithCancel(ctx)
			var gwg sync.WaitGroup
			gwg.Go(func() {
				for gctx.Err() == nil {
					pctx, pcancel := context.WithTimeout(gctx, 50*time.Millisecond)
					goner.PollFetches(pctx)
					pcancel()
				}
			})
			testwait.Eventually(t, waitTimeout, func() error {
				a, err := assignment(t.Context(), adm, "workers")
				if err != nil {
					return err
				}
				if a["stay"] == 0 || a["goner"] == 0 || a["stay"]+a["goner"] != 6 {
					return fmt.Errorf("assignment %v, want 6 partitions split over both", a)
				}
				return nil
			})
			gcancel()
			gwg.Wait()

			t0 := time.Now()
			tc.leave(goner, d)
			testwait.Eventually(t, waitTimeout, func() error {
				a, err := assignment(t.Context(), adm, "workers")
				if err != nil {
					return err
				}
				if len(a) != 1 || a["stay"] != 6 {
					return fmt.Errorf("assignment %v, want all 6 on stay", a)
				}
				return nil
			})
			t.Logf("%s: the other member held all partitions %v later (session timeout %v)",
				tc.name, time.Since(t0).Round(time.Millisecond), sessionTimeout)
		})
	}
}

func TestLogger(t *testing.T) {
	t.Parallel()
	rec := &logtest.Recorder{}
	b := kafkatest.StartTB(t, kafkabroker.WithLogger(slog.New(rec)))
	createTopic(t, newAdmin(t, b), "logged", 1, nil)
	if err := b.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, prefix := range []string{"INFO kafka broker started", "INFO kafka broker restarted", "DEBUG "} {
		if rec.Count(prefix) == 0 {
			t.Errorf("no log line starting %q", prefix)
		}
	}
}

// forwarder accepts connections on a free loopback port and forwards each
// to target, counting them; it stands in for a proxy in front of a broker.
func forwarder(t *testing.T) (addr string, setTarget func(string), accepted *atomic.Int64) {
	t.Helper()
	ln := testnet.Listen(t)
	var (
		target  atomic.Value
		count   atomic.Int64
		wg      sync.WaitGroup
		mu      sync.Mutex
		conns   []net.Conn
		stopped bool
	)
	track := func(c net.Conn) bool {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			c.Close()
			return false
		}
		conns = append(conns, c)
		return true
	}
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		stopped = true
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			count.Add(1)
			s, err := net.Dial("tcp", target.Load().(string))
			if err != nil {
				c.Close()
				continue
			}
			if !track(c) || !track(s) {
				c.Close()
				s.Close()
				continue
			}
			wg.Add(2)
			go func() { defer wg.Done(); _, _ = io.Copy(s, c); s.Close() }()
			go func() { defer wg.Done(); _, _ = io.Copy(c, s); c.Close() }()
		}
	}()
	return ln.Addr().String(), func(a string) { target.Store(a) }, &count
}

func TestAdvertisedAddr(t *testing.T) {
	t.Parallel()
	front, setTarget, accepted := forwarder(t)
	b := kafkatest.StartTB(t, kafkabroker.WithAdvertisedAddr(front))
	setTarget(b.Addr())
	if b.Addr() == front {
		t.Fatalf("Addr() = the advertised address %s, want the listening one", front)
	}
	// A client seeded with the front learns the front from the metadata,
	// and every connection it makes goes through it.
	cl, err := kgo.NewClient(kgo.SeedBrokers(front), kgo.FetchMaxWait(100*time.Millisecond),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	meta, err := adm.BrokerMetadata(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(meta.Brokers) != 1 || net.JoinHostPort(meta.Brokers[0].Host, strconv.Itoa(int(meta.Brokers[0].Port))) != front {
		t.Fatalf("metadata names %+v, want %s", meta.Brokers, front)
	}
	createTopic(t, adm, "adv", 1, nil)
	produce(t, cl, "adv", "through the front")
	if accepted.Load() < 2 {
		t.Fatalf("the front accepted %d connections, want the seed's and the broker's", accepted.Load())
	}
}
