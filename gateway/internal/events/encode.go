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

// Corrections the encoder makes so that every event is within the bounds
// of the schema (tollgatev1, bounds.go), which the aggregator refuses
// events beyond: the values of tollgate_events_corrected_total's field
// label. A correction never drops the event.
const (
	fixCost       = iota // a cost below 0 or above tollgatev1.MaxCost: clamped
	fixTime              // a decision time further than MaxEventAhead from the gateway's clock: the clock's
	fixLength            // a string longer than its bound: cut, ending with "…"
	fixRetryAfter        // a Retry-After beyond MaxRetryAfterSeconds: clamped
	numFixes
)

var fixNames = [numFixes]string{"cost", "time", "length", "retry_after"}

// fixes is a set of corrections made to one event (bit i: correction i).
type fixes uint8

// bounded is len(s) cut to max.
func bounded(s string, max int) int { return min(len(s), max) }

// maxEventSize bounds the size of the event appendEvent writes for req and
// d, beyond the header: the decision path uses it to decide whether the
// event fits in the open chunk before encoding it.
func maxEventSize(req *guard.Request, d *guard.Decision, surface string) int {
	const name = tollgatev1.MaxNameLen
	n := 26*fieldOverhead + bounded(d.KeyID, name) + bounded(d.KeyPrefix, name) + bounded(d.Tenant, name) +
		bounded(d.Tier, name) + bounded(d.Endpoint, tollgatev1.MaxEndpointLen) + bounded(surface, name) +
		len(string(guard.ReasonCostExceedsLimit)) + maxIPText
	if req != nil {
		n += bounded(req.Method, name)
	}
	if rr := d.DecidingRule(); rr != nil {
		n += bounded(rr.ID, name) + bounded(string(rr.Algorithm), name)
	}
	for i := range d.Rules {
		if rr := &d.Rules[i]; rr.Shadow && !rr.Allowed {
			n += fieldOverhead + bounded(rr.ID, name)
		}
	}
	return n + bounded(string(d.Reason), name)
}

// maxIPText is the longest client_ip appendEvent writes: an IPv6 address
// with an IPv4 suffix is at most 45 bytes; a zone beyond that is cut.
const maxIPText = 64

// appendEvent appends a decision or report event to b, after header (from
// appendHeader). t is the event time in Unix µs. It writes the proto3
// encoding that proto.Marshal writes (fields in number order, zero values
// left out) and allocates nothing when b has room for maxEventSize bytes.
// Values beyond the schema's bounds are corrected (cut or clamped), and
// the corrections made returned.
func appendEvent(b, header []byte, partition int32, seq uint64, k kind, t int64,
	req *guard.Request, d *guard.Decision, surface string) ([]byte, fixes) {
	const name = tollgatev1.MaxNameLen
	var fx fixes
	b = append(b, header...)
	b = appendInt(b, fPartition, int64(partition))
	b = appendUint(b, fSeq, seq)
	b = appendInt(b, fTimeUnixMicros, t)
	b = appendUint(b, fKind, uint64(k))
	b = appendBounded(b, fKeyID, d.KeyID, name, &fx)
	b = appendBounded(b, fKeyPrefix, d.KeyPrefix, name, &fx)
	b = appendBounded(b, fTenant, d.Tenant, name, &fx)
	b = appendBounded(b, fTier, d.Tier, name, &fx)
	b = appendBounded(b, fEndpoint, d.Endpoint, tollgatev1.MaxEndpointLen, &fx)
	if req != nil {
		b = appendBounded(b, fMethod, req.Method, name, &fx)
	}
	cost := d.Cost
	if k == kindDecision && !d.Allowed {
		cost = 0 // the schema: a rejection takes nothing
	}
	if cost < 0 || cost > tollgatev1.MaxCost {
		cost, fx = min(max(cost, 0), tollgatev1.MaxCost), fx|1<<fixCost
	}
	b = appendInt(b, fCost, cost)
	rr := d.DecidingRule()
	if rr != nil {
		b = appendBounded(b, fRuleID, rr.ID, name, &fx)
		b = appendBounded(b, fAlgorithm, string(rr.Algorithm), name, &fx)
	}
	if k == kindDecision {
		b = appendBool(b, fAllowed, d.Allowed)
		b = appendBounded(b, fReason, string(d.Reason), name, &fx)
		b = appendInt(b, fStatus, int64(d.Status))
		if rr != nil {
			b = appendInt(b, fRemaining, rr.Remaining)
		}
		retry := d.RetryAfter
		if retry < 0 || retry > tollgatev1.MaxRetryAfterSeconds {
			retry, fx = min(max(retry, 0), tollgatev1.MaxRetryAfterSeconds), fx|1<<fixRetryAfter
		}
		b = appendInt(b, fRetryAfterSeconds, retry)
	}
	b = appendBool(b, fDegraded, d.Degraded)
	for i := range d.Rules {
		if rr := &d.Rules[i]; rr.Shadow && !rr.Allowed {
			// A repeated string keeps empty elements: write every one.
			b = protowire.AppendTag(b, fShadowWouldReject, protowire.BytesType)
			b = appendCut(b, rr.ID, name, &fx)
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
	b = appendBounded(b, fSurface, surface, name, &fx)
	return appendInt(b, fPenaltyLevel, int64(d.PenaltyLevel)), fx
}

// appendBounded writes a string field of at most max bytes: a longer s is
// cut (tollgatev1.CutLen, ending with the truncation mark) and the cut
// noted in fx.
func appendBounded(b []byte, num protowire.Number, s string, max int, fx *fixes) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return appendCut(b, s, max, fx)
}

// appendCut writes s as a length-delimited value of at most max bytes
// (see appendBounded).
func appendCut(b []byte, s string, max int, fx *fixes) []byte {
	n := tollgatev1.CutLen(s, max)
	if n == len(s) {
		return protowire.AppendString(b, s)
	}
	*fx |= 1 << fixLength
	b = protowire.AppendVarint(b, uint64(n+len(tollgatev1.TruncationMark)))
	b = append(b, s[:n]...)
	return append(b, tollgatev1.TruncationMark...)
}

// boundedTenant is the tenant an event names for d: d.Tenant, cut as
// appendEvent cuts it (allocating only then), so that the partition and
// the record key agree with the event.
func boundedTenant(tenant string) string {
	if n := tollgatev1.CutLen(tenant, tollgatev1.MaxNameLen); n < len(tenant) {
		return tenant[:n] + tollgatev1.TruncationMark
	}
	return tenant
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
