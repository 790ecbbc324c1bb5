package events

import (
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// The producer writes its records with the decision stream's codec
// (tollgatev1.AppendDecision): this file says which of a decision's
// values go into which field, and names the codec's corrections for the
// metrics.

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

// Corrections made so that every event is within the bounds of the
// schema (tollgatev1, bounds.go), which the aggregator refuses events
// beyond: the values of tollgate_events_corrected_total's field label. A
// correction never drops the event.
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

// numberFields are the fields whose corrections are not cuts.
var numberFields = tollgatev1.FieldsOf(tollgatev1.FieldCost, tollgatev1.FieldRetryAfterSeconds)

// fixesOf names the corrections of the fields AppendDecision corrected.
func fixesOf(corrected tollgatev1.FieldSet) fixes {
	var fx fixes
	if corrected.Has(tollgatev1.FieldCost) {
		fx |= 1 << fixCost
	}
	if corrected.Has(tollgatev1.FieldRetryAfterSeconds) {
		fx |= 1 << fixRetryAfter
	}
	if corrected&^numberFields != 0 {
		fx |= 1 << fixLength
	}
	return fx
}

// maxIPText is room for a client_ip's text: an IPv6 address with an IPv4
// suffix is at most 45 bytes (a zone makes it longer, and costs an
// allocation).
const maxIPText = 64

// eventOf is the event of a decision (k kindDecision) or a report
// (kindReport) made at t (Unix µs), but for its identity (gateway_id,
// epoch, partition, seq) and shadow ids (shadowIDs). The client's address
// is written into ip. A rejection's cost is 0 (the schema: it took
// nothing); a report has no admission, reason, status or Retry-After. (It
// returns the event rather than fill one: escape analysis would send ip
// to the heap through a pointer.)
func eventOf(k kind, t int64, req *guard.Request, d *guard.Decision, surface string, ip []byte) tollgatev1.Decision[string] {
	ev := tollgatev1.Decision[string]{TimeUnixMicros: t, Kind: k, KeyID: d.KeyID, KeyPrefix: d.KeyPrefix,
		Tenant: d.Tenant, Tier: d.Tier, Endpoint: d.Endpoint, Cost: d.Cost, Degraded: d.Degraded, Surface: surface,
		PenaltyLevel: int32(d.PenaltyLevel)}
	if req != nil {
		ev.Method = req.Method
		if req.IP.IsValid() {
			ev.ClientIP = req.IP.AppendTo(ip)
		}
	}
	rr := d.DecidingRule()
	if rr != nil {
		ev.RuleID, ev.Algorithm = rr.ID, string(rr.Algorithm)
	}
	if k != kindDecision {
		return ev
	}
	if !d.Allowed {
		ev.Cost = 0
	}
	ev.Allowed, ev.Reason, ev.Status, ev.RetryAfterSeconds = d.Allowed, string(d.Reason), int32(d.Status), d.RetryAfter
	if rr != nil {
		ev.Remaining = rr.Remaining
	}
	return ev
}

// shadowIDs appends to ids the ids of the shadow rules that would have
// rejected d.
func shadowIDs(ids []string, d *guard.Decision) []string {
	for i := range d.Rules {
		if rr := &d.Rules[i]; rr.Shadow && !rr.Allowed {
			ids = append(ids, rr.ID)
		}
	}
	return ids
}

// appendMarker appends an EpochClosed marker: it closes epoch of gatewayID
// on partition, whose last reserved sequence number was last.
func appendMarker(b []byte, gatewayID string, epoch uint64, partition int32, last uint64, t int64) []byte {
	b, _ = tollgatev1.AppendDecision(b, &tollgatev1.Decision[string]{GatewayID: gatewayID, Epoch: epoch,
		Partition: partition, Seq: last + 1, TimeUnixMicros: t, Kind: kindEpochClosed, LastSeq: last})
	return b
}
