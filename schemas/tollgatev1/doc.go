// Package tollgatev1 is version 1 of the wire contract of Tollgate's streaming
// pipeline: the Protocol Buffers messages on its Kafka topics (generated from
// schemas/proto/tollgate/v1) and the default names of its topics and NATS KV
// buckets. It is all an analytics consumer needs to read the topics, besides a
// Kafka client and google.golang.org/protobuf/proto.
//
// # Reading the topics
//
// A record's value is one message in the Protocol Buffers binary encoding,
// with no framing (no schema-registry magic byte or schema id): decode it with
// proto.Unmarshal into the message its topic carries.
//
//	topic (default name)   record key                      value
//	TopicDecisions         tenant                          DecisionEvent
//	TopicUsage             tenant/key_id/endpoint/window   UsageRollup
//	TopicPenalties         key_id                          PenaltyEvent
//	TopicAudit             subject (a key_id, "rules"…)    AuditEntry
//
// The aggregator publishes usage, penalties and audit entries in Kafka
// transactions, so read with isolation level read_committed (franz-go:
// kgo.FetchIsolationLevel(kgo.ReadCommitted()); elsewhere
// isolation.level=read_committed): a read_uncommitted reader also sees the
// records of aborted transactions, which the aggregator publishes again in a
// later one, and counts them twice.
//
// Records may repeat (a transaction retried, a gateway's spool replayed), so
// apply them idempotently:
//   - UsageRollup: upsert by (tenant, key_id, endpoint, granularity,
//     window_start_unix), keeping the highest revision. A closed window is
//     published again, with revision + 1, when late events change it; its
//     counts are totals, never deltas.
//   - DecisionEvent: keep the highest seq applied per (gateway_id, epoch,
//     partition); a record at or below it is a duplicate. See
//     DecisionEvent_KIND_EPOCH_CLOSED for the marker that ends an epoch. Do
//     not let one record move that mark by more than MaxSeqJump, and skip
//     records with a field outside its bound (bounds.go): anyone allowed to
//     write the topic can write such a record.
//   - PenaltyEvent by event_id, AuditEntry by id.
//
// A consumer that reads every decision can decode TopicDecisions without
// allocating: DecodeDecision reads a record into a Decision[[]byte] whose
// strings are the record's bytes, and reports the fields outside their
// bounds (AppendDecision is the writer's side). schemas/README.md shows
// the loop.
//
// Topic names are configurable; the constants are the defaults. A consumer of
// an older build decodes newer records: proto.Unmarshal keeps fields it does
// not know and an unknown enum value as its number. String vocabularies
// (reasons, actions, kinds, detectors) grow too: accept values you do not know.
// docs/examples/usage-consumer is a complete consumer of TopicUsage.
//
// # Compatibility
//
// Version 1 only grows: fields are added, never renumbered, retyped or reused,
// and a removed field's number and name are reserved. A breaking change is a
// new package, tollgatev2, on new topics named ….v2. schemas/README.md has
// the rules and the tests that enforce them.
package tollgatev1
