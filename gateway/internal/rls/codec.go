package rls

import (
	"fmt"
	"slices"
	"unicode/utf8"
	"unsafe"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Codec is the gRPC codec of the rate-limit service: the protobuf codec,
// except that the two messages of every call, RateLimitRequest and
// RateLimitResponse, are read and written by hand — in the shape Envoy
// sends and this package answers, anything else going to the protobuf
// codec — which spares the reflection protobuf-go does per message (about
// a tenth of a decision's CPU) and most of the request's allocations (its
// strings share one copy of the message). Install it with
// grpc.ForceServerCodecV2(rls.Codec()). Tests hold both directions to
// protobuf-go's results.
func Codec() encoding.CodecV2 { return codec{proto: encoding.GetCodecV2("proto")} }

type codec struct{ proto encoding.CodecV2 }

func (codec) Name() string { return "proto" }

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(*rlsv3.RateLimitResponse); ok && plainResponse(r) {
		pool := mem.DefaultBufferPool()
		buf := pool.Get(responseSize(r))
		*buf = appendResponse((*buf)[:0], r)
		return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
	}
	return c.proto.Marshal(v)
}

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	if r, ok := v.(*rlsv3.RateLimitRequest); ok {
		buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
		ok := parseRequest(buf.ReadOnlyData(), r, nil)
		buf.Free()
		if ok {
			return nil
		}
		*r = rlsv3.RateLimitRequest{}
	}
	return c.proto.Unmarshal(data, v)
}

// requestArena holds the messages of a request of one descriptor of up to
// four entries, allocated at once.
type requestArena struct {
	descPtrs  [1]*ratelimitv3.RateLimitDescriptor
	desc      ratelimitv3.RateLimitDescriptor
	entryPtrs [4]*ratelimitv3.RateLimitDescriptor_Entry
	entries   [4]ratelimitv3.RateLimitDescriptor_Entry
	hits      wrapperspb.UInt64Value
}

// parseRequest reads a RateLimitRequest of known fields into r, its
// first descriptor into ar (nil: one allocated when needed); ok is false
// for anything else (unknown fields, a descriptor's limit override,
// repeated singular fields, invalid UTF-8, malformed input), which the
// protobuf codec then reads.
func parseRequest(b []byte, r *rlsv3.RateLimitRequest, ar *requestArena) (ok bool) {
	// One copy of the message: every string is a slice of it.
	str := strings{base: b, own: string(b)}
	arenaUsed := false
	seenDomain, seenHits := false, false
	for len(b) > 0 {
		var f field
		if f, b, ok = nextField(b); !ok {
			return false
		}
		switch {
		case f.num == 1 && f.typ == protowire.BytesType && !seenDomain:
			if r.Domain, ok = str.of(f.bytes); !ok {
				return false
			}
			seenDomain = true
		case f.num == 2 && f.typ == protowire.BytesType:
			var d *ratelimitv3.RateLimitDescriptor
			if !arenaUsed {
				if ar == nil {
					ar = new(requestArena)
				}
				arenaUsed = true
				d = &ar.desc
				ar.descPtrs[0] = d
				r.Descriptors = ar.descPtrs[:1:1]
			} else {
				d = new(ratelimitv3.RateLimitDescriptor)
				r.Descriptors = append(r.Descriptors, d)
			}
			if !parseDescriptor(f.bytes, d, ar, &str) {
				return false
			}
		case f.num == 3 && f.typ == protowire.VarintType && !seenHits:
			r.HitsAddend, seenHits = uint32(f.varint), true
		default:
			return false
		}
	}
	return true
}

// field is a message's field of a wire type the messages read by hand
// use: bytes (a string or a message) or varint.
type field struct {
	num    protowire.Number
	typ    protowire.Type
	bytes  []byte // BytesType
	varint uint64 // VarintType
}

// nextField reads the field b starts with, and returns what follows it;
// ok is false for a malformed field or one of another wire type.
func nextField(b []byte) (f field, rest []byte, ok bool) {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 {
		return f, nil, false
	}
	f.num, f.typ, b = num, typ, b[n:]
	var m int
	switch typ {
	case protowire.BytesType:
		f.bytes, m = protowire.ConsumeBytes(b)
	case protowire.VarintType:
		f.varint, m = protowire.ConsumeVarint(b)
	default:
		return f, nil, false
	}
	if m < 0 {
		return f, nil, false
	}
	return f, b[m:], true
}

// strings turns the bytes of a message's string fields into strings
// sharing one copy of the message.
type strings struct {
	base []byte // the message
	own  string // its copy
}

// of returns v, a part of base, as a string; ok is false for invalid
// UTF-8, which protobuf refuses in a string field.
func (s *strings) of(v []byte) (string, bool) {
	if !utf8.Valid(v) {
		return "", false
	}
	off := int(uintptr(unsafe.Pointer(unsafe.SliceData(v))) - uintptr(unsafe.Pointer(unsafe.SliceData(s.base))))
	return s.own[off : off+len(v)], true
}

func parseDescriptor(b []byte, d *ratelimitv3.RateLimitDescriptor, ar *requestArena, str *strings) bool {
	seenHits, seenNeg := false, false
	for len(b) > 0 {
		f, rest, ok := nextField(b)
		if !ok {
			return false
		}
		b = rest
		switch {
		case f.num == 1 && f.typ == protowire.BytesType:
			var e *ratelimitv3.RateLimitDescriptor_Entry
			if k := len(d.Entries); d == &ar.desc && k < len(ar.entries) {
				e = &ar.entries[k]
				ar.entryPtrs[k] = e
				d.Entries = ar.entryPtrs[: k+1 : k+1]
			} else {
				e = new(ratelimitv3.RateLimitDescriptor_Entry)
				d.Entries = append(d.Entries, e)
			}
			if !parseEntry(f.bytes, e, str) {
				return false
			}
		case f.num == 3 && f.typ == protowire.BytesType && !seenHits:
			h := &ar.hits
			if d != &ar.desc {
				h = new(wrapperspb.UInt64Value)
			}
			for v := f.bytes; len(v) > 0; {
				var hf field
				if hf, v, ok = nextField(v); !ok || hf.num != 1 || hf.typ != protowire.VarintType {
					return false
				}
				h.Value = hf.varint
			}
			d.HitsAddend, seenHits = h, true
		case f.num == 4 && f.typ == protowire.VarintType && !seenNeg:
			d.IsNegativeHits, seenNeg = protowire.DecodeBool(f.varint), true
		default:
			return false
		}
	}
	return true
}

func parseEntry(b []byte, e *ratelimitv3.RateLimitDescriptor_Entry, str *strings) bool {
	seenKey, seenValue := false, false
	for len(b) > 0 {
		f, rest, ok := nextField(b)
		if !ok || f.typ != protowire.BytesType {
			return false
		}
		b = rest
		s, ok := str.of(f.bytes)
		if !ok {
			return false
		}
		switch {
		case f.num == 1 && !seenKey:
			e.Key, seenKey = s, true
		case f.num == 2 && !seenValue:
			e.Value, seenValue = s, true
		default:
			return false
		}
	}
	return true
}

// plainResponse reports whether r holds only what appendResponse writes.
func plainResponse(r *rlsv3.RateLimitResponse) bool {
	if r.DynamicMetadata != nil || r.Quota != nil || len(r.ProtoReflect().GetUnknown()) > 0 {
		return false
	}
	for _, st := range r.Statuses {
		if st == nil || st.Quota != nil || (st.CurrentLimit != nil && st.CurrentLimit.UnitMultiplier != nil) {
			return false
		}
	}
	for _, hs := range [][]*corev3.HeaderValue{r.ResponseHeadersToAdd, r.RequestHeadersToAdd} {
		for _, h := range hs {
			if h == nil {
				return false
			}
		}
	}
	return true
}

func varintField(num protowire.Number, v uint64) int {
	if v == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeVarint(v)
}

func bytesField(num protowire.Number, n int) int {
	return protowire.SizeTag(num) + protowire.SizeBytes(n)
}

func stringField(num protowire.Number, s string) int {
	if s == "" {
		return 0
	}
	return bytesField(num, len(s))
}

func limitSize(l *rlsv3.RateLimitResponse_RateLimit) int {
	return varintField(1, uint64(l.RequestsPerUnit)) + varintField(2, uint64(l.Unit)) + stringField(3, l.Name)
}

func durationSize(d *durationpb.Duration) int {
	return varintField(1, uint64(d.Seconds)) + varintField(2, uint64(int64(d.Nanos)))
}

func statusSize(st *rlsv3.RateLimitResponse_DescriptorStatus) int {
	n := varintField(1, uint64(st.Code)) + varintField(3, uint64(st.LimitRemaining))
	if st.CurrentLimit != nil {
		n += bytesField(2, limitSize(st.CurrentLimit))
	}
	if st.DurationUntilReset != nil {
		n += bytesField(4, durationSize(st.DurationUntilReset))
	}
	return n
}

func headerSize(h *corev3.HeaderValue) int {
	n := stringField(1, h.Key) + stringField(2, h.Value)
	if len(h.RawValue) > 0 {
		n += bytesField(3, len(h.RawValue))
	}
	return n
}

func responseSize(r *rlsv3.RateLimitResponse) int {
	n := varintField(1, uint64(r.OverallCode))
	for _, st := range r.Statuses {
		n += bytesField(2, statusSize(st))
	}
	for _, h := range r.ResponseHeadersToAdd {
		n += bytesField(3, headerSize(h))
	}
	for _, h := range r.RequestHeadersToAdd {
		n += bytesField(4, headerSize(h))
	}
	if len(r.RawBody) > 0 {
		n += bytesField(5, len(r.RawBody))
	}
	return n
}

func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func appendStringField(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func appendHeader(b []byte, num protowire.Number, h *corev3.HeaderValue) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(headerSize(h)))
	b = appendStringField(b, 1, h.Key)
	b = appendStringField(b, 2, h.Value)
	if len(h.RawValue) > 0 {
		b = protowire.AppendTag(b, 3, protowire.BytesType)
		b = protowire.AppendBytes(b, h.RawValue)
	}
	return b
}

// appendResponse writes r as protobuf-go does (fields in number order).
func appendResponse(b []byte, r *rlsv3.RateLimitResponse) []byte {
	b = appendVarintField(b, 1, uint64(r.OverallCode))
	for _, st := range r.Statuses {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(statusSize(st)))
		b = appendVarintField(b, 1, uint64(st.Code))
		if l := st.CurrentLimit; l != nil {
			b = protowire.AppendTag(b, 2, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(limitSize(l)))
			b = appendVarintField(b, 1, uint64(l.RequestsPerUnit))
			b = appendVarintField(b, 2, uint64(l.Unit))
			b = appendStringField(b, 3, l.Name)
		}
		b = appendVarintField(b, 3, uint64(st.LimitRemaining))
		if d := st.DurationUntilReset; d != nil {
			b = protowire.AppendTag(b, 4, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(durationSize(d)))
			b = appendVarintField(b, 1, uint64(d.Seconds))
			b = appendVarintField(b, 2, uint64(int64(d.Nanos)))
		}
	}
	for _, h := range r.ResponseHeadersToAdd {
		b = appendHeader(b, 3, h)
	}
	for _, h := range r.RequestHeadersToAdd {
		b = appendHeader(b, 4, h)
	}
	if len(r.RawBody) > 0 {
		b = protowire.AppendTag(b, 5, protowire.BytesType)
		b = protowire.AppendBytes(b, r.RawBody)
	}
	return b
}

// DecodeRequest reads a RateLimitRequest message, by hand when it has the
// shape Envoy sends, else with protobuf-go.
func DecodeRequest(b []byte) (*rlsv3.RateLimitRequest, error) {
	r := new(rlsv3.RateLimitRequest)
	if err := decodeRequest(b, r, nil); err != nil {
		return nil, err
	}
	return r, nil
}

// decodeRequest is DecodeRequest into r (zero), the first descriptor
// into ar (nil: allocated).
func decodeRequest(b []byte, r *rlsv3.RateLimitRequest, ar *requestArena) error {
	if parseRequest(b, r, ar) {
		return nil
	}
	*r = rlsv3.RateLimitRequest{}
	if err := proto.Unmarshal(b, r); err != nil {
		return fmt.Errorf("rls: decode RateLimitRequest: %w", err)
	}
	return nil
}

// AppendResponse appends r, encoded, to b: by hand when it holds only
// what this package answers, else with protobuf-go.
func AppendResponse(b []byte, r *rlsv3.RateLimitResponse) ([]byte, error) {
	if plainResponse(r) {
		return appendResponse(slices.Grow(b, responseSize(r)), r), nil
	}
	out, err := proto.MarshalOptions{}.MarshalAppend(b, r)
	if err != nil {
		return b, fmt.Errorf("rls: encode RateLimitResponse: %w", err)
	}
	return out, nil
}
