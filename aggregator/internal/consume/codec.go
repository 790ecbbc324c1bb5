package consume

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/tollgate/tollgate/aggregator/internal/abuse"
	"github.com/tollgate/tollgate/aggregator/internal/audit"
	"github.com/tollgate/tollgate/aggregator/internal/windows"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

var errBadEvent = errors.New("consume: malformed decision event")

// Field numbers of tollgate.v1.DecisionEvent the aggregator reads.
const (
	fGatewayID = 1
	fEpoch     = 2
	fPartition = 3
	fSeq       = 4
	fTime      = 5
	fKind      = 6
	fKeyID     = 7
	fKeyPrefix = 8
	fTenant    = 9
	fEndpoint  = 11
	fCost      = 13
	fRuleID    = 14
	fAllowed   = 16
	fReason    = 17
	fRetry     = 20
	fLastSeq   = 25
	fCmdActor  = 100
	fCmdReason = 101
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
}

const reasonAllowlisted = "allowlisted"

// decodeEvent reads the fields of a DecisionEvent the usage windows and the
// abuse detectors need, skipping the rest, without building the whole
// message (checked against the generated code in the tests). An event
// whose kind this aggregator does not know decodes with Kind 0 and Lift
// false, and is skipped by the caller.
func decodeEvent(b []byte, ev *event) error {
	*ev = event{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return errBadEvent
		}
		b = b[n:]
		switch {
		case typ == protowire.BytesType && num == fReason:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return errBadEvent
			}
			ev.Allowlisted = string(v) == reasonAllowlisted // no allocation
			b = b[n:]
		case typ == protowire.BytesType && (num == fGatewayID || num == fKeyID || num == fKeyPrefix || num == fTenant || num == fEndpoint || num == fRuleID || num == fCmdActor || num == fCmdReason):
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return errBadEvent
			}
			s := string(v)
			switch num {
			case fCmdActor:
				ev.Actor = s
			case fCmdReason:
				ev.CmdReason = s
			case fGatewayID:
				ev.Gateway = s
			case fKeyID:
				ev.KeyID = s
			case fKeyPrefix:
				ev.KeyPrefix = s
			case fTenant:
				ev.Tenant = s
			case fEndpoint:
				ev.Endpoint = s
			case fRuleID:
				ev.Rule = s
			}
			b = b[n:]
		case typ == protowire.VarintType && (num == fEpoch || num == fPartition || num == fSeq || num == fTime || num == fKind || num == fCost || num == fAllowed || num == fLastSeq || num == fRetry):
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return errBadEvent
			}
			switch num {
			case fEpoch:
				ev.Epoch = v
			case fPartition:
				ev.Partition = int32(v)
			case fSeq:
				ev.Seq = v
			case fTime:
				ev.TimeMicros = int64(v)
			case fKind:
				switch tollgatev1.DecisionEvent_Kind(v) {
				case tollgatev1.DecisionEvent_KIND_DECISION:
					ev.Kind = windows.KindDecision
				case tollgatev1.DecisionEvent_KIND_REPORT:
					ev.Kind = windows.KindReport
				case tollgatev1.DecisionEvent_KIND_EPOCH_CLOSED:
					ev.Kind = windows.KindEpochClosed
				case tollgatev1.DecisionEvent_KIND_PENALTY_LIFT:
					ev.Kind, ev.Lift = 0, true
				default:
					ev.Kind, ev.Lift = 0, false
				}
			case fCost:
				ev.Cost = int64(v)
			case fAllowed:
				ev.Allowed = v != 0
			case fLastSeq:
				ev.LastSeq = v
			case fRetry:
				ev.RetryAfter = int64(v)
			}
			b = b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return errBadEvent
			}
			b = b[n:]
		}
	}
	return nil
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
	return proto.Marshal(&tollgatev1.UsageRollup{
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
	})
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
