package events

import (
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// Field numbers of tollgate.v1.DecisionEvent (schemas/proto/tollgate/v1/
// decision.proto). The encoder writes them by hand; TestEncoderKnowsEveryField
// fails when the schema has a field that is not listed in fieldUse, and
// TestEncodeRoundTrip decodes the bytes with the generated code.
const (
	fGatewayID         protowire.Number = 1
	fEpoch             protowire.Number = 2
	fPartition         protowire.Number = 3
	fSeq               protowire.Number = 4
	fTimeUnixMicros    protowire.Number = 5
	fKind              protowire.Number = 6
	fKeyID             protowire.Number = 7
	fKeyPrefix         protowire.Number = 8
	fTenant            protowire.Number = 9
	fTier              protowire.Number = 10
	fEndpoint          protowire.Number = 11
	fMethod            protowire.Number = 12
	fCost              protowire.Number = 13
	fRuleID            protowire.Number = 14
	fAlgorithm         protowire.Number = 15
	fAllowed           protowire.Number = 16
	fReason            protowire.Number = 17
	fStatus            protowire.Number = 18
	fRemaining         protowire.Number = 19
	fRetryAfterSeconds protowire.Number = 20
	fDegraded          protowire.Number = 21
	fShadowWouldReject protowire.Number = 22
	fClientIP          protowire.Number = 23
	fSurface           protowire.Number = 24
	fLastSeq           protowire.Number = 25
	fPenaltyLevel      protowire.Number = 26
	// Command fields (100+) belong to the aggregator's command records
	// (KIND_PENALTY_LIFT), never to a gateway's events.
	fCommandActor  protowire.Number = 100
	fCommandReason protowire.Number = 101
)

// fieldUse says, for every DecisionEvent field, which records the encoder
// writes it in: decision and report events ("event"), reports too but not
// meaningful there ("decision"), EpochClosed markers only ("marker"), or
// none: the aggregator's command records ("command").
// Adding a field to the schema fails TestEncoderKnowsEveryField until it is
// listed here and encoded (or deliberately left out, with the reason).
var fieldUse = map[protowire.Number]string{
	fGatewayID: "all", fEpoch: "all", fPartition: "all", fSeq: "all",
	fTimeUnixMicros: "all", fKind: "all",
	fKeyID: "event", fKeyPrefix: "event", fTenant: "event", fTier: "event",
	fEndpoint: "event", fMethod: "event", fCost: "event", fRuleID: "event",
	fAlgorithm: "event", fDegraded: "event", fShadowWouldReject: "event",
	fClientIP: "event", fSurface: "event", fPenaltyLevel: "event",
	fAllowed: "decision", fReason: "decision", fStatus: "decision",
	fRemaining: "decision", fRetryAfterSeconds: "decision",
	fLastSeq: "marker",
	// Written by the aggregator's operator API only (penalty lifts).
	fCommandActor: "command", fCommandReason: "command",
}

// kind is a DecisionEvent kind the producer writes.
type kind = tollgatev1.DecisionEvent_Kind

const (
	kindDecision    = tollgatev1.DecisionEvent_KIND_DECISION
	kindReport      = tollgatev1.DecisionEvent_KIND_REPORT
	kindEpochClosed = tollgatev1.DecisionEvent_KIND_EPOCH_CLOSED
)

// PartitionOf is the Kafka partition of a tenant's events among n
// partitions: tollgatev1.PartitionOf, the one definition gateways and the
// aggregator share.
func PartitionOf(tenant string, n int32) int32 { return tollgatev1.PartitionOf(tenant, n) }

// appendHeader appends the fields every record of one gateway epoch starts
// with (gateway_id, epoch): computed once per epoch.
func appendHeader(b []byte, gatewayID string, epoch uint64) []byte {
	b = appendString(b, fGatewayID, gatewayID)
	return appendUint(b, fEpoch, epoch)
}

// Bytes an encoded field can take beyond its string's bytes: a tag of at
// most 2 bytes (numbers below 2048) and a varint of at most 10.
const fieldOverhead = 2 + binaryMaxVarint

const binaryMaxVarint = 10

// maxEventSize bounds the size of the event appendEvent writes for req and
// d, beyond the header: the decision path uses it to decide whether the
// event fits in the open chunk before encoding it.
func maxEventSize(req *guard.Request, d *guard.Decision, surface string) int {
	n := 26*fieldOverhead + len(d.KeyID) + len(d.KeyPrefix) + len(d.Tenant) + len(d.Tier) +
		len(d.Endpoint) + len(surface) + len(string(guard.ReasonCostExceedsLimit)) + maxIPText
	if req != nil {
		n += len(req.Method)
	}
	if rr := d.DecidingRule(); rr != nil {
		n += len(rr.ID) + len(rr.Algorithm)
	}
	for i := range d.Rules {
		if rr := &d.Rules[i]; rr.Shadow && !rr.Allowed {
			n += fieldOverhead + len(rr.ID)
		}
	}
	return n + len(d.Reason)
}

// maxIPText is the longest client_ip appendEvent writes: an IPv6 address
// with an IPv4 suffix is at most 45 bytes; a zone beyond that is cut.
const maxIPText = 64

// appendEvent appends a decision or report event to b, after header (from
// appendHeader). t is the event time in Unix µs. It writes the proto3
// encoding that proto.Marshal writes (fields in number order, zero values
// left out) and allocates nothing when b has room for maxEventSize bytes.
func appendEvent(b, header []byte, partition int32, seq uint64, k kind, t int64,
	req *guard.Request, d *guard.Decision, surface string) []byte {
	b = append(b, header...)
	b = appendInt(b, fPartition, int64(partition))
	b = appendUint(b, fSeq, seq)
	b = appendInt(b, fTimeUnixMicros, t)
	b = appendUint(b, fKind, uint64(k))
	b = appendString(b, fKeyID, d.KeyID)
	b = appendString(b, fKeyPrefix, d.KeyPrefix)
	b = appendString(b, fTenant, d.Tenant)
	b = appendString(b, fTier, d.Tier)
	b = appendString(b, fEndpoint, d.Endpoint)
	if req != nil {
		b = appendString(b, fMethod, req.Method)
	}
	cost := d.Cost
	if k == kindDecision && !d.Allowed {
		cost = 0 // the schema: a rejection takes nothing
	}
	b = appendInt(b, fCost, cost)
	rr := d.DecidingRule()
	if rr != nil {
		b = appendString(b, fRuleID, rr.ID)
		b = appendString(b, fAlgorithm, string(rr.Algorithm))
	}
	if k == kindDecision {
		b = appendBool(b, fAllowed, d.Allowed)
		b = appendString(b, fReason, string(d.Reason))
		b = appendInt(b, fStatus, int64(d.Status))
		if rr != nil {
			b = appendInt(b, fRemaining, rr.Remaining)
		}
		b = appendInt(b, fRetryAfterSeconds, d.RetryAfter)
	}
	b = appendBool(b, fDegraded, d.Degraded)
	for i := range d.Rules {
		if rr := &d.Rules[i]; rr.Shadow && !rr.Allowed {
			// A repeated string keeps empty elements: write every one.
			b = protowire.AppendTag(b, fShadowWouldReject, protowire.BytesType)
			b = protowire.AppendString(b, rr.ID)
		}
	}
	if req != nil && req.IP.IsValid() {
		var ip [maxIPText]byte
		txt := req.IP.AppendTo(ip[:0])
		if len(txt) > maxIPText {
			txt = txt[:maxIPText]
		}
		b = protowire.AppendTag(b, fClientIP, protowire.BytesType)
		b = protowire.AppendBytes(b, txt)
	}
	b = appendString(b, fSurface, surface)
	return appendInt(b, fPenaltyLevel, int64(d.PenaltyLevel))
}

// appendMarker appends an EpochClosed marker: it closes epoch of gatewayID
// on partition, whose last reserved sequence number was last.
func appendMarker(b []byte, gatewayID string, epoch uint64, partition int32, last uint64, t int64) []byte {
	b = appendHeader(b, gatewayID, epoch)
	b = appendInt(b, fPartition, int64(partition))
	b = appendUint(b, fSeq, last+1)
	b = appendInt(b, fTimeUnixMicros, t)
	b = appendUint(b, fKind, uint64(kindEpochClosed))
	return appendUint(b, fLastSeq, last)
}

// tenantOf returns the tenant field of an encoded event (the record key),
// nil when it has none (markers, anonymous requests) or b is malformed.
func tenantOf(b []byte) []byte {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil
		}
		b = b[n:]
		if num == fTenant && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil
			}
			return v
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return nil
		}
		b = b[n:]
	}
	return nil
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func appendUint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

// appendInt writes an int32 or int64 field: negative values take ten bytes
// (sign-extended), as proto3 encodes them.
func appendInt(b []byte, num protowire.Number, v int64) []byte {
	return appendUint(b, num, uint64(v))
}

func appendBool(b []byte, num protowire.Number, v bool) []byte {
	if !v {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return append(b, 1)
}
