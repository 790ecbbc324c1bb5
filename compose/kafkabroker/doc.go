// Package kafkabroker runs an in-process Kafka-protocol broker (franz-go's
// kfake) on loopback, for tests and for the local stack (make run).
//
// A [Broker] listens on OS-chosen 127.0.0.1 ports by default (make run uses
// 127.0.0.1:9092) and keeps its log in a data directory, so it can be taken
// down and brought back on the same ports with the same data: [Broker.Down]
// and [Broker.Up] simulate an outage of any length, [Broker.Restart] a quick
// bounce. Clients (kgo) reconnect by themselves once it is up again. Test code
// should use package kafkatest, which registers Stop with tb.Cleanup; this
// package does not link "testing" into binaries.
//
// # What kfake does, as observed at the pinned version
//
// Exercised by this package's tests with real kgo clients:
//
//   - produce and fetch; topics created with kadm (-1 partitions means
//     [WithPartitions]) or auto-created;
//   - the idempotent producer: producer ids and sequences survive Down/Up, so
//     records buffered by kgo through an outage arrive exactly once;
//   - DataDir: records, topics and committed group offsets survive Restart
//     and a new Broker on the same directory;
//   - transactions: aborted records are invisible to read_committed readers
//     (read_uncommitted sees them); an open transaction holds every
//     read_committed reader of its partitions at its first record until it
//     ends or its timeout aborts it; a new producer with the same
//     transactional id fences the old one (PRODUCER_FENCED) and aborts its
//     open transaction; a transaction left open across Restart is restored
//     and commits afterwards;
//   - kgo's GroupTransactSession (consume, produce and commit offsets in one
//     transaction, read_committed, RequireStableFetchOffsets): a rebalance
//     during a transaction makes End abort it and return committed=false
//     with no error, even when the member keeps some of its partitions (kgo
//     aborts on any revocation); the aborted input is redelivered from the
//     committed offsets, and the output holds every input record exactly
//     once; across a broker Restart the session aborts at most the
//     transaction in flight, returns no error, and goes on;
//   - consumer groups across clients (classic protocol; KIP-848 only when a
//     client opts in with kgo.ServerSideBalancer): a member that leaves hands
//     its partitions over within a rebalance (about 0.1s), one that vanishes
//     after its session timeout;
//   - compaction of cleanup.policy=compact topics (the config is accepted by
//     CreateTopics and shown by DescribeConfigs).
//
// Compaction keeps the latest record per key but never touches a partition's
// last batch (kfake treats it as the active segment), drops aborted records
// and tombstones older than delete.retention.ms, and runs only every
// log.cleaner.backoff.ms (kfake's default: one hour; set it with
// [WithBrokerConfigs]) or when Cluster().Compact() is called. A reader of a
// compacted topic must therefore expect superseded values, as with Kafka.
//
// Not supported: replication (every partition has one replica, whatever the
// replication factor asked for, and a factor above the number of brokers is
// refused), quotas (stored, never enforced), throttling, tiered storage,
// delegation tokens, share groups.
//
// Down is a clean broker shutdown: kfake writes its whole state to DataDir
// (segments, topics and configs, committed group offsets, producer ids and
// sequences, group members and their assignments, open transactions with
// their staged offsets) and Up reloads it. On Up, a group member whose last
// heartbeat is older than its session timeout, counting the outage, is
// dropped (its client rejoins with a new member id); an open transaction
// older than its transaction timeout, counting the outage, is aborted.
// There is no crash: the in-process broker cannot lose what it
// acknowledged.
//
// A kgo client notices that the broker is back only at its next metadata
// refresh, at most every kgo.MetadataMinAge (default 5s), and its retry
// backoff grows to 5s: with the defaults, records buffered during an outage
// went out about 5s after Up; with MetadataMinAge and RetryBackoffFn at
// 100ms, about 0.2s.
//
// # Traps
//
// A group member that dies without leaving (SIGKILL, a lost process) holds
// its partitions until its session times out: 45s with kgo's defaults. Tests
// should set kgo.SessionTimeout to about one second (with a shorter
// kgo.HeartbeatInterval); this broker accepts session timeouts from 100ms
// (group.min.session.timeout.ms, Kafka's default is 6s; override it with
// WithBrokerConfigs). Likewise a transactional producer that dies mid
// transaction stalls every read_committed reader of its partitions until the
// transaction times out (kgo's default 40s): use kgo.TransactionTimeout of
// about 10s.
//
// kfake creates topics on a metadata request only when the client asks for it
// (kgo.AllowAutoTopicCreation); this broker allows it, with
// [WithPartitions] partitions, as Kafka does by default. Tollgate's own
// processes create their topics explicitly with kadm; pass replication factor
// -1 (the broker's default) so the same call works here and on a real
// cluster.
package kafkabroker
