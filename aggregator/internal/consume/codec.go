package consume

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/tollgate/tollgate/aggregator/internal/abuse"
	"github.com/tollgate/tollgate/aggregator/internal/audit"
	"github.com/tollgate/tollgate/aggregator/internal/windows"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// event is a decoded DecisionEvent: what the usage windows count, and what
// the abuse detectors and commands read besides.
type event struct {
	windows.Event
	// RetryAfter is the Retry-After sent, in seconds.
	RetryAfter int64
	// Allowlisted: the guard's reason was "allowlisted".
	Allowlisted bool
	// Lift: a KIND_PENALTY_LIFT command (Kind is 0), with its actor and
	// reason.
	Lift      bool
	Actor     string
	CmdReason string
	// TooLong: a string field the aggregator reads is longer than its
	// bound (it is left empty rather than copied); BadPartition: the
	// partition field is not a partition number.
	TooLong      bool
	BadPartition bool

	// shadow is room for the codec's shadow ids, reused from record to
	// record.
	shadow [][]byte
}

const reasonAllowlisted = "allowlisted"

// readStrings are the string fields the aggregator reads: one beyond its
// bound makes the event TooLong.
var readStrings = tollgatev1.FieldsOf(tollgatev1.FieldGatewayID, tollgatev1.FieldKeyID, tollgatev1.FieldKeyPrefix,
	tollgatev1.FieldTenant, tollgatev1.FieldEndpoint, tollgatev1.FieldRuleID, tollgatev1.FieldCommandActor,
	tollgatev1.FieldCommandReason)

// decodeEvent reads the fields of a DecisionEvent the usage windows and the
// abuse detectors need with the decision stream's codec
// (tollgatev1.DecodeDecision), copying only the strings it keeps, and
// none beyond its bound. An event whose kind this aggregator does not
// know decodes with Kind 0 and Lift false, and is skipped by the caller.
func decodeEvent(b []byte, ev *event) error {
	// w lives on the stack, not in ev: the codec's copy into it needs no
	// write barriers, and no reference to the record outlives this call.
	w := tollgatev1.Decision[[]byte]{ShadowWouldReject: ev.shadow}
	beyond, err := tollgatev1.DecodeDecision(b, &w)
	clear(w.ShadowWouldReject) // no reference to the record kept
	ev.shadow = w.ShadowWouldReject[:0]
	if err != nil {
		return err
	}
	ev.Event = windows.Event{Source: windows.Source{Gateway: string(w.GatewayID), Epoch: w.Epoch, Partition: w.Partition},
		Seq: w.Seq, TimeMicros: w.TimeUnixMicros, Tenant: string(w.Tenant), KeyID: string(w.KeyID),
		KeyPrefix: string(w.KeyPrefix), Endpoint: string(w.Endpoint), Rule: string(w.RuleID), Allowed: w.Allowed,
		Cost: w.Cost, LastSeq: w.LastSeq}
	ev.RetryAfter = w.RetryAfterSeconds
	ev.Allowlisted = string(w.Reason) == reasonAllowlisted // no allocation
	ev.Actor, ev.CmdReason = string(w.CommandActor), string(w.CommandReason)
	ev.TooLong = beyond&readStrings != 0
	ev.BadPartition = beyond.Has(tollgatev1.FieldPartition) || w.Partition < 0
	ev.Lift = false
	switch w.Kind {
	case tollgatev1.DecisionEvent_KIND_DECISION:
		ev.Kind = windows.KindDecision
	case tollgatev1.DecisionEvent_KIND_REPORT:
		ev.Kind = windows.KindReport
	case tollgatev1.DecisionEvent_KIND_EPOCH_CLOSED:
		ev.Kind = windows.KindEpochClosed
	case tollgatev1.DecisionEvent_KIND_PENALTY_LIFT:
		ev.Kind, ev.Lift = 0, true
	default:
		ev.Kind = 0
	}
	return nil
}

// Why an event is refused: the values of the reason label of
// tollgate_aggregator_events_invalid_total.
const (
	// invalidIdentity: no gateway_id, epoch or seq, a gateway_id longer
	// than its bound, or a partition field that is not the record's
	// partition. The event touches no mark.
	invalidIdentity = "identity"
	// invalidMarker: an EpochClosed marker whose seq is not last_seq + 1.
	invalidMarker = "marker"
	// The others: a field out of its bound. The event passes through its
	// source's mark (its number was used: it is not missing) and is not
	// counted.
	invalidCost       = "cost"
	invalidTime       = "time"
	invalidLength     = "length"
	invalidRetryAfter = "retry_after"
)

var invalidReasons = []string{invalidIdentity, invalidMarker, invalidCost, invalidTime, invalidLength, invalidRetryAfter}

// check returns why ev, read from a record of partition q with timestamp
// ts, cannot be counted ("" when it can) and whether the fault is in its
// identity, so that it must not touch its source's mark either. now is the
// wall clock. Event times must lie within tollgatev1.MaxEventAge before
// and MaxEventAhead after the record's timestamp, and never more than
// MaxEventAhead ahead of now; a timestamp itself outside that window of
// now (a producer's clock gone wrong, a forged one) is replaced by now.
func check(ev *event, q int32, ts, now time.Time) (reason string, identity bool) {
	switch {
	case ev.BadPartition || ev.Partition != q:
		return invalidIdentity, true
	case ev.Lift:
		if ev.KeyID == "" {
			return invalidIdentity, true
		}
	case ev.Gateway == "" && !ev.TooLong || ev.Epoch == 0 || ev.Seq == 0:
		return invalidIdentity, true
	case ev.Kind == windows.KindEpochClosed && (ev.LastSeq == 0 || ev.Seq != ev.LastSeq+1):
		return invalidMarker, true
	}
	if ev.TooLong {
		if ev.Gateway == "" && !ev.Lift {
			return invalidIdentity, true // the gateway_id was the long one
		}
		return invalidLength, false
	}
	if !timeWithin(ev.TimeMicros, ts, now) {
		return invalidTime, false
	}
	if ev.Cost < 0 || ev.Cost > tollgatev1.MaxCost {
		return invalidCost, false
	}
	if ev.RetryAfter < 0 || ev.RetryAfter > tollgatev1.MaxRetryAfterSeconds {
		return invalidRetryAfter, false
	}
	return "", false
}

// timeWithin reports whether an event time (Unix µs) is within the bounds
// of its record's timestamp ts and the wall clock now (see check).
func timeWithin(t int64, ts, now time.Time) bool {
	ahead, age := tollgatev1.MaxEventAhead.Microseconds(), tollgatev1.MaxEventAge.Microseconds()
	n := now.UnixMicro()
	ref := ts.UnixMicro()
	if ts.IsZero() || ref < n-age || ref > n+ahead {
		ref = n
	}
	return t >= ref-age && t <= ref+ahead && t <= n+ahead
}

// rollupKey is the usage topic's record key: tenant/key_id/endpoint/window,
// where window is granularity@start (Unix seconds).
func rollupKey(k windows.RowKey) []byte {
	var sb strings.Builder
	sb.Grow(len(k.Tenant) + len(k.KeyID) + len(k.Endpoint) + 24)
	sb.WriteString(k.Tenant)
	sb.WriteByte('/')
	sb.WriteString(k.KeyID)
	sb.WriteByte('/')
	sb.WriteString(k.Endpoint)
	fmt.Fprintf(&sb, "/%s@%d", k.Gran, k.Start)
	return []byte(sb.String())
}

func granularity(g windows.Granularity) tollgatev1.Granularity {
	switch g {
	case windows.Minute:
		return tollgatev1.Granularity_GRANULARITY_MINUTE
	case windows.Hour:
		return tollgatev1.Granularity_GRANULARITY_HOUR
	case windows.Day:
		return tollgatev1.Granularity_GRANULARITY_DAY
	}
	return tollgatev1.Granularity_GRANULARITY_UNSPECIFIED
}

// rollupValue encodes a published window.
func rollupValue(k windows.RowKey, r *windows.Row, closedAt int64) ([]byte, error) {
	b, err := proto.Marshal(rollup(k, r, closedAt))
	if err != nil {
		return nil, fmt.Errorf("consume: encode usage rollup: %w", err)
	}
	return b, nil
}

func rollup(k windows.RowKey, r *windows.Row, closedAt int64) *tollgatev1.UsageRollup {
	return &tollgatev1.UsageRollup{
		Tenant:          k.Tenant,
		KeyId:           k.KeyID,
		KeyPrefix:       r.KeyPrefix,
		Endpoint:        k.Endpoint,
		Granularity:     granularity(k.Gran),
		WindowStartUnix: k.Start,
		WindowSeconds:   k.Gran.Seconds(),
		Allowed:         r.Allowed,
		Rejected:        r.Rejected,
		Cost:            r.Cost,
		RulesHit:        r.Rules,
		Revision:        r.Revision,
		ClosedAtUnix:    closedAt,
	}
}

// recordOverhead is more than a record adds to its key and value in a
// produce request's record batch (the batch header, lengths, attributes,
// offset and timestamp deltas).
const recordOverhead = 128

// fitRollup returns the key and value of a published window's usage
// record, at most limit bytes together with recordOverhead. A record that
// would be larger is cut: the endpoint keeps its first bytes followed by
// "…#" and a hash of the whole endpoint (in the key and the value), then
// key_prefix and rules_hit are dropped, and the value says truncated. ok
// is false when even that does not fit (tenant and key_id are bounded, so
// only a limit of a few hundred bytes does that).
func fitRollup(k windows.RowKey, r *windows.Row, closedAt int64, limit int) (key, value []byte, truncated, ok bool, err error) {
	key = rollupKey(k)
	if value, err = rollupValue(k, r, closedAt); err != nil {
		return nil, nil, false, false, err
	}
	if len(key)+len(value)+recordOverhead <= limit {
		return key, value, false, true, nil
	}
	u := rollup(k, r, closedAt)
	u.Truncated = true
	u.KeyPrefix, u.RulesHit = "", nil
	value, err = proto.Marshal(u)
	if err != nil {
		return nil, nil, false, false, fmt.Errorf("consume: encode usage rollup: %w", err)
	}
	if len(key)+len(value)+recordOverhead > limit {
		// The endpoint appears twice (key and value): what is left,
		// halved, for each.
		room := (limit - recordOverhead - len(key) - len(value) + 2*len(k.Endpoint)) / 2
		sum := fnv.New64a()
		_, _ = sum.Write([]byte(k.Endpoint))
		suffix := fmt.Sprintf("%s#%016x", tollgatev1.TruncationMark, sum.Sum64())
		if room < len(suffix) {
			return nil, nil, true, false, nil
		}
		cut := tollgatev1.CutLen(k.Endpoint, room-len(suffix)+len(tollgatev1.TruncationMark))
		k.Endpoint = k.Endpoint[:cut] + suffix
		u.Endpoint = k.Endpoint
		key = rollupKey(k)
		if value, err = proto.Marshal(u); err != nil {
			return nil, nil, false, false, fmt.Errorf("consume: encode usage rollup: %w", err)
		}
	}
	if len(key)+len(value)+recordOverhead > limit {
		return nil, nil, true, false, nil
	}
	return key, value, true, true, nil
}

// stepRecords turns a ladder step into its PenaltyEvent and its AuditEntry
// (same id), produced in the transaction that takes the step.
func stepRecords(st abuse.Step, now time.Time) (*tollgatev1.PenaltyEvent, *tollgatev1.AuditEntry) {
	id := audit.NewID(now)
	ev := &tollgatev1.PenaltyEvent{KeyId: st.KeyID, KeyPrefix: st.KeyPrefix, Tenant: st.Tenant, Level: int32(st.Level),
		PreviousLevel: int32(st.Previous), Action: st.Action, Factor: st.Factor, StartsAtUnixMicros: st.StartsAt,
		ExpiresAtUnixMicros: st.ExpiresAt, IssuedBy: st.IssuedBy, Reason: st.Reason, EventId: id, Step: st.Step}
	for _, e := range st.Evidence {
		ev.Evidence = append(ev.Evidence, &tollgatev1.Evidence{Detector: e.Detector, WindowSeconds: e.WindowSeconds,
			Requests: e.Requests, Rejected: e.Rejected, IgnoredBackoff: e.Ignored, Ratio: e.Ratio, RatePerSecond: e.RatePerSecond,
			FirstSeenUnixMicros: e.First, LastSeenUnixMicros: e.Last})
	}
	after := audit.PenaltyState{Level: st.Level, Action: abuse.LevelAction(st.Level), Change: st.Action, Step: st.Step, Factor: st.Factor}
	if st.ExpiresAt > 0 {
		after.ExpiresAt = time.UnixMicro(st.ExpiresAt).UTC().Format(time.RFC3339Nano)
		after.Enforced = st.ExpiresAt > st.StartsAt
	}
	before, _ := json.Marshal(audit.PenaltyState{Level: st.Previous, Action: abuse.LevelAction(st.Previous)})
	afterJSON, _ := json.Marshal(after)
	ae := &tollgatev1.AuditEntry{Id: id, TimeUnixMicros: st.StartsAt, Actor: st.IssuedBy, Kind: audit.KindPenalty,
		Subject: st.KeyID, Reason: st.Reason, Before: before, After: afterJSON, Evidence: ev.Evidence,
		KeyPrefix: st.KeyPrefix}
	if st.Reason == "" {
		ae.Reason = st.Action
	}
	return ev, ae
}
