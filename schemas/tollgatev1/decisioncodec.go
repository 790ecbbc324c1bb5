package tollgatev1

import (
	"encoding/binary"
	"errors"
	"strconv"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// The decision stream's codec: DecisionEvent written and read without
// allocating, for the paths that handle every decision (a gateway's
// producer, the aggregator's apply loop) and for the aggregator's lift
// commands. AppendDecision writes the bytes proto.Marshal writes;
// DecodeDecision reads what proto.Unmarshal reads (both held to the
// generated code by the tests, randomized and fuzzed). A consumer that is
// not on such a path can use proto.Unmarshal instead.

// DecisionField is the number of a DecisionEvent field. The constants are
// the codec's one table of them; decision.proto is their source, and the
// tests check each against the generated descriptor.
type DecisionField protowire.Number

// The fields of DecisionEvent; DecisionEvent documents each.
const (
	FieldGatewayID         DecisionField = 1
	FieldEpoch             DecisionField = 2
	FieldPartition         DecisionField = 3
	FieldSeq               DecisionField = 4
	FieldTimeUnixMicros    DecisionField = 5
	FieldKind              DecisionField = 6
	FieldKeyID             DecisionField = 7
	FieldKeyPrefix         DecisionField = 8
	FieldTenant            DecisionField = 9
	FieldTier              DecisionField = 10
	FieldEndpoint          DecisionField = 11
	FieldMethod            DecisionField = 12
	FieldCost              DecisionField = 13
	FieldRuleID            DecisionField = 14
	FieldAlgorithm         DecisionField = 15
	FieldAllowed           DecisionField = 16
	FieldReason            DecisionField = 17
	FieldStatus            DecisionField = 18
	FieldRemaining         DecisionField = 19
	FieldRetryAfterSeconds DecisionField = 20
	FieldDegraded          DecisionField = 21
	FieldShadowWouldReject DecisionField = 22
	FieldClientIP          DecisionField = 23
	FieldSurface           DecisionField = 24
	FieldLastSeq           DecisionField = 25
	FieldPenaltyLevel      DecisionField = 26
	// Command records only (KIND_PENALTY_LIFT).
	FieldCommandActor  DecisionField = 100
	FieldCommandReason DecisionField = 101
)

// Bound is the most bytes the value of string field f may hold (bounds.go;
// for shadow_would_reject, each id): 0 when f is not a string field.
func (f DecisionField) Bound() int {
	switch f {
	case FieldGatewayID:
		return MaxGatewayIDLen
	case FieldEndpoint:
		return MaxEndpointLen
	case FieldCommandReason:
		return MaxCommandReasonLen
	case FieldKeyID, FieldKeyPrefix, FieldTenant, FieldTier, FieldMethod, FieldRuleID, FieldAlgorithm,
		FieldReason, FieldShadowWouldReject, FieldClientIP, FieldSurface, FieldCommandActor:
		return MaxNameLen
	}
	return 0
}

// Cut returns s as AppendDecision writes it in string field f: s itself
// when it is within f's bound, else cut (CutLen) and ending with
// TruncationMark. It allocates only when it cuts. A producer that derives
// something from a value before writing it (the partition from the
// tenant) derives it from Cut's result, so that the two agree.
func (f DecisionField) Cut(s string) string {
	if n := CutLen(s, f.Bound()); n < len(s) {
		return s[:n] + TruncationMark
	}
	return s
}

// String is the field's name in decision.proto ("key_id").
func (f DecisionField) String() string {
	if fd := decisionDescriptor().Fields().ByNumber(protowire.Number(f)); fd != nil {
		return string(fd.Name())
	}
	return "field " + strconv.Itoa(int(f))
}

// decisionDescriptor is DecisionEvent's descriptor, from the generated code.
func decisionDescriptor() protoreflect.MessageDescriptor {
	return (*DecisionEvent)(nil).ProtoReflect().Descriptor()
}

// bit is f's member of a FieldSet: bit f for numbers 1 to 61, bits 63
// and 62 for the command fields (100, 101), none for other numbers
// (TestDecisionFieldTable fails for a field of the schema without one).
func (f DecisionField) bit() FieldSet {
	switch {
	case f > 0 && f < 62:
		return 1 << f
	case f >= FieldCommandActor && f <= FieldCommandReason:
		return 1 << (63 - (f - FieldCommandActor))
	}
	return 0
}

// FieldSet is a set of DecisionEvent fields.
type FieldSet uint64

// FieldsOf is the set of fs.
func FieldsOf(fs ...DecisionField) FieldSet {
	var s FieldSet
	for _, f := range fs {
		s |= f.bit()
	}
	return s
}

// Has reports whether f is in s.
func (s FieldSet) Has(f DecisionField) bool { return s&f.bit() != 0 }

// String names the fields of s in number order, comma-separated.
func (s FieldSet) String() string {
	var names []string
	fields := decisionDescriptor().Fields()
	for i := range fields.Len() {
		if f := DecisionField(fields.Get(i).Number()); s.Has(f) {
			names = append(names, f.String())
		}
	}
	return strings.Join(names, ",")
}

// Decision holds a DecisionEvent's fields as plain values (DecisionEvent
// documents each). Decision[string] is what AppendDecision writes, built
// on the caller's stack; Decision[[]byte] is what DecodeDecision reads, its
// strings sub-slices of the record.
type Decision[S string | []byte] struct {
	GatewayID         S
	Epoch             uint64
	Partition         int32
	Seq               uint64
	TimeUnixMicros    int64
	Kind              DecisionEvent_Kind
	KeyID             S
	KeyPrefix         S
	Tenant            S
	Tier              S
	Endpoint          S
	Method            S
	Cost              int64
	RuleID            S
	Algorithm         S
	Allowed           bool
	Reason            S
	Status            int32
	Remaining         int64
	RetryAfterSeconds int64
	Degraded          bool
	ShadowWouldReject []S
	// ClientIP is text in bytes in both forms, so that a writer can format
	// an address into a buffer of its own (netip.Addr.AppendTo).
	ClientIP      []byte
	Surface       S
	LastSeq       uint64
	PenaltyLevel  int32
	CommandActor  S
	CommandReason S
}

// AppendDecision appends the encoding of d to b: the bytes proto.Marshal
// (deterministic) writes for the same message, fields in number order and
// zero values left out. It allocates nothing when b has room for
// MaxDecisionSize(d) more bytes. A value beyond its bound (bounds.go) is
// corrected as a gateway corrects it: a longer string is cut on a UTF-8
// boundary and ends with TruncationMark, cost and retry_after_seconds are
// clamped; the fields corrected are returned. Strings are written as they
// are: proto.Marshal would refuse one that is not UTF-8.
func AppendDecision(b []byte, d *Decision[string]) ([]byte, FieldSet) {
	var c FieldSet
	b = appendText(b, FieldGatewayID, d.GatewayID, &c)
	b = appendVarint(b, FieldEpoch, d.Epoch)
	b = appendVarint(b, FieldPartition, uint64(d.Partition))
	b = appendVarint(b, FieldSeq, d.Seq)
	b = appendVarint(b, FieldTimeUnixMicros, uint64(d.TimeUnixMicros))
	b = appendVarint(b, FieldKind, uint64(d.Kind))
	b = appendText(b, FieldKeyID, d.KeyID, &c)
	b = appendText(b, FieldKeyPrefix, d.KeyPrefix, &c)
	b = appendText(b, FieldTenant, d.Tenant, &c)
	b = appendText(b, FieldTier, d.Tier, &c)
	b = appendText(b, FieldEndpoint, d.Endpoint, &c)
	b = appendText(b, FieldMethod, d.Method, &c)
	b = appendVarint(b, FieldCost, uint64(clamp(FieldCost, d.Cost, MaxCost, &c)))
	b = appendText(b, FieldRuleID, d.RuleID, &c)
	b = appendText(b, FieldAlgorithm, d.Algorithm, &c)
	b = appendVarint(b, FieldAllowed, protowire.EncodeBool(d.Allowed))
	b = appendText(b, FieldReason, d.Reason, &c)
	b = appendVarint(b, FieldStatus, uint64(d.Status))
	b = appendVarint(b, FieldRemaining, uint64(d.Remaining))
	b = appendVarint(b, FieldRetryAfterSeconds, uint64(clamp(FieldRetryAfterSeconds, d.RetryAfterSeconds, MaxRetryAfterSeconds, &c)))
	b = appendVarint(b, FieldDegraded, protowire.EncodeBool(d.Degraded))
	for _, id := range d.ShadowWouldReject {
		// A repeated string keeps its empty elements: every one is written.
		b = appendTag(b, FieldShadowWouldReject, protowire.BytesType)
		b = appendCut(b, FieldShadowWouldReject, id, &c)
	}
	b = appendText(b, FieldClientIP, d.ClientIP, &c)
	b = appendText(b, FieldSurface, d.Surface, &c)
	b = appendVarint(b, FieldLastSeq, d.LastSeq)
	b = appendVarint(b, FieldPenaltyLevel, uint64(d.PenaltyLevel))
	b = appendText(b, FieldCommandActor, d.CommandActor, &c)
	return appendText(b, FieldCommandReason, d.CommandReason, &c), c
}

// maxFieldOverhead is more than the bytes a field takes beyond its
// string's: a tag (2 bytes for numbers below 2048) and a varint (at most
// 10).
const maxFieldOverhead = 2 + binary.MaxVarintLen64

// numDecisionFields is the number of DecisionEvent's fields.
const numDecisionFields = 28

// MaxDecisionSize bounds the bytes AppendDecision writes for d, so that a
// caller can make room for them first.
func MaxDecisionSize(d *Decision[string]) int {
	n := (numDecisionFields+len(d.ShadowWouldReject))*maxFieldOverhead +
		textSize(FieldGatewayID, d.GatewayID) + textSize(FieldKeyID, d.KeyID) + textSize(FieldKeyPrefix, d.KeyPrefix) +
		textSize(FieldTenant, d.Tenant) + textSize(FieldTier, d.Tier) + textSize(FieldEndpoint, d.Endpoint) +
		textSize(FieldMethod, d.Method) + textSize(FieldRuleID, d.RuleID) + textSize(FieldAlgorithm, d.Algorithm) +
		textSize(FieldReason, d.Reason) + textSize(FieldClientIP, d.ClientIP) + textSize(FieldSurface, d.Surface) +
		textSize(FieldCommandActor, d.CommandActor) + textSize(FieldCommandReason, d.CommandReason)
	for _, id := range d.ShadowWouldReject {
		n += textSize(FieldShadowWouldReject, id)
	}
	return n
}

// textSize is the most bytes string field f takes for s beyond its
// overhead: s, or its bound.
func textSize[S string | []byte](f DecisionField, s S) int { return min(len(s), f.Bound()) }

// clamp returns v within 0..bound, adding f to c when it had to move it.
func clamp(f DecisionField, v, bound int64, c *FieldSet) int64 {
	if v < 0 || v > bound {
		*c |= f.bit()
		return min(max(v, 0), bound)
	}
	return v
}

// appendVarint writes a varint field, or nothing for 0 (proto3's zero
// value). An int32 or int64 is passed sign-extended: a negative value
// takes ten bytes, as proto3 encodes it.
func appendVarint(b []byte, f DecisionField, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = appendTag(b, f, protowire.VarintType)
	return appendUvarint(b, v)
}

// appendText writes a string field, or nothing for "".
func appendText[S string | []byte](b []byte, f DecisionField, s S, c *FieldSet) []byte {
	if len(s) == 0 {
		return b
	}
	b = appendTag(b, f, protowire.BytesType)
	return appendCut(b, f, s, c)
}

// appendCut writes s as a length-delimited value within f's bound: a
// longer s is cut and ends with TruncationMark, and f added to c.
func appendCut[S string | []byte](b []byte, f DecisionField, s S, c *FieldSet) []byte {
	n := cutLen(s, f.Bound())
	if n == len(s) {
		b = appendUvarint(b, uint64(len(s)))
		return append(b, s...)
	}
	*c |= f.bit()
	b = appendUvarint(b, uint64(n+len(TruncationMark)))
	b = append(b, s[:n]...)
	return append(b, TruncationMark...)
}

// appendTag appends the tag of field f with wire type typ: one byte for
// numbers below 16, two below 2048 (TestDecisionFieldTable holds every
// number below it). Inlined with a constant f, it appends constants.
func appendTag(b []byte, f DecisionField, typ protowire.Type) []byte {
	x := uint64(f)<<3 | uint64(typ)
	if x < 0x80 {
		return append(b, byte(x))
	}
	return append(b, byte(x)|0x80, byte(x>>7))
}

// appendUvarint appends v as a varint, the common one-byte case inline.
func appendUvarint(b []byte, v uint64) []byte {
	if v < 0x80 {
		return append(b, byte(v))
	}
	return protowire.AppendVarint(b, v)
}

// ErrMalformedDecision: the bytes are not a Protocol Buffers encoding
// (DecodeDecision).
var ErrMalformedDecision = errors.New("tollgatev1: malformed DecisionEvent")

// DecodeDecision reads the DecisionEvent encoded in b into d, neither
// allocating nor copying: d's strings are sub-slices of b, and the
// shadow_would_reject ids are appended to d.ShadowWouldReject[:0] (so a
// d reused from record to record allocates nothing). It reads what
// proto.Unmarshal reads: the last value of a field repeated on the wire,
// fields this version does not know (or with another wire type) skipped.
// Unlike proto.Unmarshal it does not check that strings are UTF-8.
//
// It returns the fields outside their bounds: a string longer than its
// bound (bounds.go) is left nil, so a reader holding events to the bounds
// never copies it; an int32 or enum field whose varint does not fit in 32
// bits is read truncated, as the generated code reads it.
func DecodeDecision(b []byte, into *Decision[[]byte]) (FieldSet, error) {
	// This loop runs for every decision the aggregator reads. It decodes
	// into locals and stores them once (stores into a local need no write
	// barriers), in one function (a call per field, given the local's
	// address, costs about a fifth of the decoding).
	d := Decision[[]byte]{ShadowWouldReject: into.ShadowWouldReject[:0]}
	var varints [FieldPenaltyLevel + 1]uint64 // by number; the varint fields' values
	var out FieldSet
	var err error
	for len(b) > 0 {
		num, typ, n := protowire.Number(b[0]>>3), protowire.Type(b[0]&7), 1
		if b[0] >= 0x80 || num == 0 { // not a one-byte tag
			num, typ, n = protowire.ConsumeTag(b)
		}
		if n < 0 || num > protowire.MaxValidNumber {
			err = ErrMalformedDecision
			break
		}
		b = b[n:]
		f := DecisionField(num)
		if typ == protowire.VarintType {
			v, n := consumeUvarint(b)
			if n < 0 {
				err = ErrMalformedDecision
				break
			}
			b = b[n:]
			if f < DecisionField(len(varints)) {
				varints[f] = v // the last value is the field's
			}
			continue
		}
		if typ != protowire.BytesType || f.Bound() == 0 {
			// Not a string field of this version: skipped.
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				err = ErrMalformedDecision
				break
			}
			b = b[n:]
			continue
		}
		s, n := consumeBytes(b)
		if n < 0 {
			err = ErrMalformedDecision
			break
		}
		b = b[n:]
		switch {
		case len(s) > f.Bound():
			out |= f.bit() // left nil: never copied
			s = nil
		case f != FieldShadowWouldReject:
			out &^= f.bit() // the last value is the field's
		}
		switch f {
		case FieldGatewayID:
			d.GatewayID = s
		case FieldKeyID:
			d.KeyID = s
		case FieldKeyPrefix:
			d.KeyPrefix = s
		case FieldTenant:
			d.Tenant = s
		case FieldTier:
			d.Tier = s
		case FieldEndpoint:
			d.Endpoint = s
		case FieldMethod:
			d.Method = s
		case FieldRuleID:
			d.RuleID = s
		case FieldAlgorithm:
			d.Algorithm = s
		case FieldReason:
			d.Reason = s
		case FieldShadowWouldReject:
			d.ShadowWouldReject = append(d.ShadowWouldReject, s)
		case FieldClientIP:
			d.ClientIP = s
		case FieldSurface:
			d.Surface = s
		case FieldCommandActor:
			d.CommandActor = s
		case FieldCommandReason:
			d.CommandReason = s
		}
	}
	v := &varints
	d.Epoch, d.Seq, d.TimeUnixMicros, d.Cost = v[FieldEpoch], v[FieldSeq], int64(v[FieldTimeUnixMicros]), int64(v[FieldCost])
	d.Allowed, d.Degraded = v[FieldAllowed] != 0, v[FieldDegraded] != 0
	d.Remaining, d.RetryAfterSeconds, d.LastSeq = int64(v[FieldRemaining]), int64(v[FieldRetryAfterSeconds]), v[FieldLastSeq]
	// An int32 or enum keeps its low 32 bits, as the generated code reads it.
	d.Partition, d.Kind = int32(v[FieldPartition]), DecisionEvent_Kind(v[FieldKind])
	d.Status, d.PenaltyLevel = int32(v[FieldStatus]), int32(v[FieldPenaltyLevel])
	for _, f := range [...]DecisionField{FieldPartition, FieldKind, FieldStatus, FieldPenaltyLevel} {
		if int64(int32(v[f])) != int64(v[f]) {
			out |= f.bit() // does not fit in 32 bits
		}
	}
	*into = d
	return out, err
}

// consumeUvarint is protowire.ConsumeVarint, the one-byte case inline.
func consumeUvarint(b []byte) (uint64, int) {
	if len(b) > 0 && b[0] < 0x80 {
		return uint64(b[0]), 1
	}
	return protowire.ConsumeVarint(b)
}

// consumeBytes is protowire.ConsumeBytes, a length below 128 inline.
func consumeBytes(b []byte) ([]byte, int) {
	if len(b) > 0 && b[0] < 0x80 && int(b[0]) < len(b) {
		n := 1 + int(b[0])
		return b[1:n:n], n
	}
	return protowire.ConsumeBytes(b)
}

// DecisionTenant returns the tenant of an encoded DecisionEvent (a
// decisions record's key) without decoding the rest: the first tenant
// field, nil when there is none (markers, anonymous requests) or b is
// malformed before it.
func DecisionTenant(b []byte) []byte {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil
		}
		b = b[n:]
		if DecisionField(num) == FieldTenant && typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(b)
			return v
		}
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return nil
		}
		b = b[n:]
	}
	return nil
}
