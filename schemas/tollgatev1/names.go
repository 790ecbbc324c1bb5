package tollgatev1

// Default Kafka topic names. Gateways and aggregators take the names from
// configuration; these are the defaults, and the version suffix changes only
// with the package (tollgatev2 writes ….v2 topics).
const (
	// TopicDecisions carries DecisionEvent records, keyed by tenant, from
	// gateways to the aggregator.
	TopicDecisions = "tollgate.decisions.v1"
	// TopicUsage carries UsageRollup records, keyed by
	// tenant/key_id/endpoint/window: the aggregator's closed usage windows.
	TopicUsage = "tollgate.usage.v1"
	// TopicPenalties carries PenaltyEvent records, keyed by key_id: every
	// step of a key on the penalty ladder.
	TopicPenalties = "tollgate.penalties.v1"
	// TopicAudit carries AuditEntry records, keyed by subject: a retained
	// log of every operator and detector action.
	TopicAudit = "tollgate.audit.v1"
	// TopicChangelog is the aggregator's internal compacted changelog of
	// window state (its state store's truth). Its records are not part of
	// this contract; analytics consumers read TopicUsage instead.
	TopicChangelog = "tollgate.aggregator.changelog.v1"
)

// NATS JetStream KV buckets that carry configuration to gateways (fleet mode).
const (
	// BucketRules holds the ruleset under RulesKey; its history is kept for
	// rollback.
	BucketRules = "tollgate_rules"
	// BucketBlocklist holds one entry per blocked or penalised key, named by
	// key_id (NATS key names allow only -/_=.a-zA-Z0-9: never a raw API key).
	BucketBlocklist = "tollgate_blocklist"
	// BucketOverrides holds temporary per-key limit overrides, named by
	// key_id.
	BucketOverrides = "tollgate_overrides"
	// BucketGateways holds one GatewayEntry per gateway in fleet mode,
	// named by its gateway_id: the gateways seen, with the rules version
	// each runs. The bucket's entries expire by themselves (its MaxAge), so
	// a gateway that stops without deleting its entry leaves the list.
	BucketGateways = "tollgate_gateways"
	// RulesKey is the key of the active ruleset in BucketRules.
	RulesKey = "active"
)

// SubjectCounters is the core NATS subject on which the aggregator's
// operator API announces that it changed counters in Redis behind the
// gateways' backs — a reset or a quota grant (CountersChanged, JSON) — so
// that every gateway drops the local state it derived from them (the fast
// path's negative cache and, after a reset, its leases without giving
// their units back). At most once: a gateway disconnected at that
// moment keeps its negative cache until its Retry-After passes, as it
// would have without the message.
const SubjectCounters = "tollgate.counters.changed"

// DefaultConsumerGroup is the Kafka consumer group the aggregators share on
// TopicDecisions. Analytics consumers use a group of their own.
const DefaultConsumerGroup = "tollgate-aggregator"
