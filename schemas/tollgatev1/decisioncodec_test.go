package tollgatev1

import (
	"bytes"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// The codec is held to the generated code: the random messages below set
// every field the descriptor has (a field added to decision.proto is set
// too, and fails these tests until the codec writes and reads it), and
// what AppendDecision writes and DecodeDecision reads is compared with
// proto.Marshal and proto.Unmarshal.

// textOf returns random text of at most n bytes (exactly n or a little
// less), of one-, two-, three- and four-byte runes.
func textOf(rng *rand.Rand, n int) string {
	runes := []string{"a", "Z", "/", "é", "…", "😀"}
	var sb strings.Builder
	for {
		r := runes[rng.IntN(len(runes))]
		if sb.Len()+len(r) > n {
			return sb.String()
		}
		sb.WriteString(r)
	}
}

// boundOf is the bound of a string field the codec may not know yet.
func boundOf(fd protoreflect.FieldDescriptor) int {
	if b := DecisionField(fd.Number()).Bound(); b > 0 {
		return b
	}
	return MaxNameLen
}

// randomEvent sets each field of a DecisionEvent, or leaves it zero, at
// random. With beyond, strings may exceed their bounds and cost and
// retry_after_seconds take any value.
func randomEvent(t testing.TB, rng *rand.Rand, beyond bool) *DecisionEvent {
	m := &DecisionEvent{}
	r := m.ProtoReflect()
	fields := r.Descriptor().Fields()
	text := func(fd protoreflect.FieldDescriptor) protoreflect.Value {
		n := rng.IntN(boundOf(fd) + 1)
		if beyond && rng.IntN(3) == 0 {
			n = boundOf(fd) + 1 + rng.IntN(2*boundOf(fd))
		}
		return protoreflect.ValueOfString(textOf(rng, n))
	}
	anyInt := func() int64 { return int64(rng.Uint64()) >> rng.IntN(64) }
	for i := range fields.Len() {
		fd := fields.Get(i)
		if rng.IntN(4) == 0 {
			continue // the zero value: not on the wire
		}
		var v protoreflect.Value
		switch f := DecisionField(fd.Number()); {
		case fd.IsList() && fd.Kind() == protoreflect.StringKind:
			l := r.Mutable(fd).List()
			for n := rng.IntN(4); n > 0; n-- {
				if rng.IntN(4) == 0 {
					l.Append(protoreflect.ValueOfString("")) // kept: a list keeps empty elements
				} else {
					l.Append(text(fd))
				}
			}
			continue
		case fd.Kind() == protoreflect.StringKind:
			v = text(fd)
		case !beyond && f == FieldCost:
			v = protoreflect.ValueOfInt64(rng.Int64N(MaxCost + 1))
		case !beyond && f == FieldRetryAfterSeconds:
			v = protoreflect.ValueOfInt64(rng.Int64N(MaxRetryAfterSeconds + 1))
		case fd.Kind() == protoreflect.Int64Kind:
			v = protoreflect.ValueOfInt64(anyInt())
		case fd.Kind() == protoreflect.Int32Kind:
			v = protoreflect.ValueOfInt32(int32(anyInt()))
		case fd.Kind() == protoreflect.Uint64Kind:
			v = protoreflect.ValueOfUint64(rng.Uint64() >> rng.IntN(64))
		case fd.Kind() == protoreflect.BoolKind:
			v = protoreflect.ValueOfBool(true)
		case fd.Kind() == protoreflect.EnumKind:
			v = protoreflect.ValueOfEnum(protoreflect.EnumNumber(anyInt() % 8)) // known and unknown values
		default:
			t.Fatalf("field %s is a %v, which the codec does not handle", fd.Name(), fd.Kind())
		}
		r.Set(fd, v)
	}
	return m
}

// toDecision is m as AppendDecision takes it.
func toDecision(m *DecisionEvent) *Decision[string] {
	return &Decision[string]{GatewayID: m.GatewayId, Epoch: m.Epoch, Partition: m.Partition, Seq: m.Seq,
		TimeUnixMicros: m.TimeUnixMicros, Kind: m.Kind, KeyID: m.KeyId, KeyPrefix: m.KeyPrefix, Tenant: m.Tenant,
		Tier: m.Tier, Endpoint: m.Endpoint, Method: m.Method, Cost: m.Cost, RuleID: m.RuleId, Algorithm: m.Algorithm,
		Allowed: m.Allowed, Reason: m.Reason, Status: m.Status, Remaining: m.Remaining,
		RetryAfterSeconds: m.RetryAfterSeconds, Degraded: m.Degraded, ShadowWouldReject: m.ShadowWouldReject,
		ClientIP: []byte(m.ClientIp), Surface: m.Surface, LastSeq: m.LastSeq, PenaltyLevel: m.PenaltyLevel,
		CommandActor: m.CommandActor, CommandReason: m.CommandReason}
}

// toEvent is what DecodeDecision read, as a message.
func toEvent(d *Decision[[]byte]) *DecisionEvent {
	m := &DecisionEvent{GatewayId: string(d.GatewayID), Epoch: d.Epoch, Partition: d.Partition, Seq: d.Seq,
		TimeUnixMicros: d.TimeUnixMicros, Kind: d.Kind, KeyId: string(d.KeyID), KeyPrefix: string(d.KeyPrefix),
		Tenant: string(d.Tenant), Tier: string(d.Tier), Endpoint: string(d.Endpoint), Method: string(d.Method),
		Cost: d.Cost, RuleId: string(d.RuleID), Algorithm: string(d.Algorithm), Allowed: d.Allowed,
		Reason: string(d.Reason), Status: d.Status, Remaining: d.Remaining, RetryAfterSeconds: d.RetryAfterSeconds,
		Degraded: d.Degraded, ClientIp: string(d.ClientIP), Surface: string(d.Surface), LastSeq: d.LastSeq,
		PenaltyLevel: d.PenaltyLevel, CommandActor: string(d.CommandActor), CommandReason: string(d.CommandReason)}
	for _, id := range d.ShadowWouldReject {
		m.ShadowWouldReject = append(m.ShadowWouldReject, string(id))
	}
	return m
}

// withinBounds clears the strings of m beyond their bounds, as
// DecodeDecision leaves them, and returns their fields.
func withinBounds(m *DecisionEvent) FieldSet {
	var out FieldSet
	r := m.ProtoReflect()
	fields := r.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		f := DecisionField(fd.Number())
		switch {
		case fd.IsList():
			l := r.Get(fd).List()
			for j := range l.Len() {
				if len(l.Get(j).String()) > f.Bound() {
					l.Set(j, protoreflect.ValueOfString(""))
					out |= f.bit()
				}
			}
		case fd.Kind() == protoreflect.StringKind && len(r.Get(fd).String()) > f.Bound():
			r.Clear(fd)
			out |= f.bit()
		}
	}
	return out
}

func marshal(t testing.TB, m *DecisionEvent) []byte {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDecisionFieldTable checks the codec's field table against the
// generated descriptor: every field of the schema has a number the codec
// knows under its name, a bound when it is a string, and its own member
// of a FieldSet.
func TestDecisionFieldTable(t *testing.T) {
	t.Parallel()
	fields := decisionDescriptor().Fields()
	if fields.Len() != numDecisionFields {
		t.Errorf("DecisionEvent has %d fields, numDecisionFields says %d", fields.Len(), numDecisionFields)
	}
	var seen FieldSet
	for i := range fields.Len() {
		fd := fields.Get(i)
		f := DecisionField(fd.Number())
		if got := f.String(); got != string(fd.Name()) {
			t.Errorf("field %d is named %q, String says %q", f, fd.Name(), got)
		}
		if isText := fd.Kind() == protoreflect.StringKind; isText != (f.Bound() > 0) {
			t.Errorf("field %s: a %v with bound %d", fd.Name(), fd.Kind(), f.Bound())
		}
		if f >= 2048 {
			t.Errorf("field %s (%d): appendTag writes tags of numbers below 2048", fd.Name(), f)
		}
		if f.bit() == 0 || seen&f.bit() != 0 {
			t.Errorf("field %s (%d) has no FieldSet member of its own", fd.Name(), f)
		}
		seen |= f.bit()
	}
	if s := FieldsOf(FieldTenant, FieldCommandReason); s.String() != "tenant,command_reason" || !s.Has(FieldTenant) || s.Has(FieldTier) {
		t.Errorf("FieldsOf(tenant, command_reason) = %q", s)
	}
}

// TestAppendDecisionIsMarshal writes random events within the bounds and
// compares the bytes with proto.Marshal's.
func TestAppendDecisionIsMarshal(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(19, 1))
	for range 5000 {
		m := randomEvent(t, rng, false)
		d := toDecision(m)
		b, corrected := AppendDecision(nil, d)
		if want := marshal(t, m); !bytes.Equal(b, want) {
			t.Fatalf("AppendDecision(%v)\n got %x\nwant %x", m, b, want)
		}
		if corrected != 0 {
			t.Fatalf("AppendDecision(%v) corrected %v within the bounds", m, corrected)
		}
		if len(b) > MaxDecisionSize(d) {
			t.Fatalf("%d bytes, MaxDecisionSize said at most %d", len(b), MaxDecisionSize(d))
		}
		if got := DecisionTenant(b); string(got) != m.Tenant {
			t.Fatalf("DecisionTenant = %q, want %q", got, m.Tenant)
		}
	}
}

// TestDecodeDecisionIsUnmarshal reads random events, some beyond the
// bounds, some written twice over (the last value of a field counts, lists
// add up), some with fields this version does not know, and compares with
// proto.Unmarshal.
func TestDecodeDecisionIsUnmarshal(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(19, 2))
	unknown := protowire.AppendVarint(protowire.AppendTag(nil, 60, protowire.VarintType), 7)
	unknown = protowire.AppendString(protowire.AppendTag(unknown, 61, protowire.BytesType), "x")
	unknown = protowire.AppendFixed32(protowire.AppendTag(unknown, 62, protowire.Fixed32Type), 7)
	unknown = protowire.AppendVarint(protowire.AppendTag(unknown, protowire.Number(FieldTenant), protowire.VarintType), 7)
	unknown = protowire.AppendString(protowire.AppendTag(unknown, protowire.Number(FieldEpoch), protowire.BytesType), "y")
	var d Decision[[]byte]
	for i := range 5000 {
		b := marshal(t, randomEvent(t, rng, true))
		if i%3 == 0 {
			b = append(b, marshal(t, randomEvent(t, rng, true))...)
		}
		if i%5 == 0 {
			b = append(b, unknown...)
		}
		want := &DecisionEvent{}
		if err := proto.Unmarshal(b, want); err != nil {
			t.Fatal(err)
		}
		beyond := withinBounds(want)
		got, err := DecodeDecision(b, &d)
		if err != nil {
			t.Fatalf("DecodeDecision(%x): %v", b, err)
		}
		want.ProtoReflect().SetUnknown(nil)
		if !proto.Equal(toEvent(&d), want) {
			t.Fatalf("DecodeDecision(%x)\n got %v\nwant %v", b, toEvent(&d), want)
		}
		if got != beyond {
			t.Fatalf("DecodeDecision(%x): beyond the bounds %v, want %v", b, got, beyond)
		}
	}
}

// TestDecodeDecisionMalformed: bytes that are not an encoding, or an int32
// that does not fit, are told apart from an event.
func TestDecodeDecisionMalformed(t *testing.T) {
	t.Parallel()
	valid := marshal(t, &DecisionEvent{GatewayId: "gw", Seq: 1, Tenant: "acme"})
	for _, tc := range []struct {
		name   string
		b      []byte
		err    bool
		beyond FieldSet
		check  func(*Decision[[]byte]) bool
	}{
		{"empty", nil, false, 0, func(d *Decision[[]byte]) bool { return d.GatewayID == nil }},
		{"truncated", valid[:len(valid)-1], true, 0, nil},
		{"field 0", []byte{0x00, 0x01}, true, 0, nil},
		{"a length beyond the end", []byte{0x4a, 0x7f, 'a'}, true, 0, nil},
		{"an end group alone", []byte{0x0c}, true, 0, nil},
		{"partition of 2^32+2", protowire.AppendVarint([]byte{0x18}, 1<<32+2), false, FieldsOf(FieldPartition),
			func(d *Decision[[]byte]) bool { return d.Partition == 2 }},
		{"a partition beyond 32 bits, then one within", protowire.AppendVarint(append(protowire.AppendVarint([]byte{0x18}, 1<<32+2), 0x18), 3),
			false, 0, func(d *Decision[[]byte]) bool { return d.Partition == 3 }},
		{"negative partition", protowire.AppendVarint([]byte{0x18}, math.MaxUint64-1), false, 0,
			func(d *Decision[[]byte]) bool { return d.Partition == -2 }},
		{"a long tenant, then a short one", append(marshal(t, &DecisionEvent{Tenant: strings.Repeat("t", MaxNameLen+1)}), valid...), false, 0,
			func(d *Decision[[]byte]) bool { return string(d.Tenant) == "acme" }},
		{"a short tenant, then a long one", append(valid, marshal(t, &DecisionEvent{Tenant: strings.Repeat("t", MaxNameLen+1)})...), false,
			FieldsOf(FieldTenant), func(d *Decision[[]byte]) bool { return d.Tenant == nil && string(d.GatewayID) == "gw" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var d Decision[[]byte]
			beyond, err := DecodeDecision(tc.b, &d)
			if (err != nil) != tc.err || (err != nil && err != ErrMalformedDecision) {
				t.Fatalf("error %v, want one: %v", err, tc.err)
			}
			if beyond != tc.beyond {
				t.Errorf("beyond the bounds %v, want %v", beyond, tc.beyond)
			}
			if tc.check != nil && !tc.check(&d) {
				t.Errorf("decoded %+v", d)
			}
		})
	}
}

// TestAppendDecisionCorrects gives AppendDecision values beyond the
// bounds: each is corrected as the bounds say (a string cut on a rune
// boundary, ending with the mark; a number clamped), the corrections are
// reported, and the result is an event within the bounds.
func TestAppendDecisionCorrects(t *testing.T) {
	t.Parallel()
	long := func(n int) string { return strings.Repeat("é", n/2) + "x" }
	for _, tc := range []struct {
		name    string
		change  func(*Decision[string])
		want    FieldSet
		checkOK func(*DecisionEvent) bool
	}{
		{"within the bounds", func(*Decision[string]) {}, 0, nil},
		{"950 KB endpoint", func(d *Decision[string]) { d.Endpoint = "/" + long(950_000) }, FieldsOf(FieldEndpoint),
			func(m *DecisionEvent) bool {
				return len(m.Endpoint) <= MaxEndpointLen && strings.HasSuffix(m.Endpoint, TruncationMark) && strings.HasPrefix(m.Endpoint, "/éé")
			}},
		{"long names", func(d *Decision[string]) {
			d.GatewayID, d.Tenant, d.Method, d.CommandReason = long(300), long(200), long(129), long(2000)
			d.ShadowWouldReject = []string{"ok", long(500)}
			d.ClientIP = []byte(long(300))
		}, FieldsOf(FieldGatewayID, FieldTenant, FieldMethod, FieldShadowWouldReject, FieldClientIP, FieldCommandReason),
			func(m *DecisionEvent) bool {
				return len(m.GatewayId) <= MaxGatewayIDLen && len(m.Tenant) <= MaxNameLen && m.ShadowWouldReject[0] == "ok" &&
					len(m.ShadowWouldReject[1]) <= MaxNameLen && len(m.CommandReason) <= MaxCommandReasonLen
			}},
		{"a name at its bound", func(d *Decision[string]) { d.Tenant = strings.Repeat("t", MaxNameLen) }, 0,
			func(m *DecisionEvent) bool { return len(m.Tenant) == MaxNameLen }},
		{"cost of 9e18", func(d *Decision[string]) { d.Cost = 9_000_000_000_000_000_000 }, FieldsOf(FieldCost),
			func(m *DecisionEvent) bool { return m.Cost == MaxCost }},
		{"negative cost", func(d *Decision[string]) { d.Cost = -5 }, FieldsOf(FieldCost),
			func(m *DecisionEvent) bool { return m.Cost == 0 }},
		{"retry after 2^62", func(d *Decision[string]) { d.RetryAfterSeconds = 1 << 62 }, FieldsOf(FieldRetryAfterSeconds),
			func(m *DecisionEvent) bool { return m.RetryAfterSeconds == MaxRetryAfterSeconds }},
		{"negative retry after", func(d *Decision[string]) { d.RetryAfterSeconds = -1 }, FieldsOf(FieldRetryAfterSeconds),
			func(m *DecisionEvent) bool { return m.RetryAfterSeconds == 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := &Decision[string]{GatewayID: "gw", Epoch: 1, Seq: 1, Kind: DecisionEvent_KIND_DECISION, Tenant: "acme",
				Endpoint: "/v1/x", Cost: 1, RetryAfterSeconds: 3}
			tc.change(d)
			b, corrected := AppendDecision(nil, d)
			if corrected != tc.want {
				t.Errorf("corrected %v, want %v", corrected, tc.want)
			}
			if len(b) > MaxDecisionSize(d) {
				t.Errorf("%d bytes, MaxDecisionSize said at most %d", len(b), MaxDecisionSize(d))
			}
			m := &DecisionEvent{}
			if err := proto.Unmarshal(b, m); err != nil { // cuts keep strings UTF-8
				t.Fatal(err)
			}
			var v Decision[[]byte]
			if beyond, err := DecodeDecision(b, &v); err != nil || beyond != 0 {
				t.Errorf("the corrected event decodes with %v beyond the bounds, %v", beyond, err)
			}
			if tc.checkOK != nil && !tc.checkOK(m) {
				t.Errorf("written as %v", m)
			}
		})
	}
}

func TestDecisionFieldCut(t *testing.T) {
	t.Parallel()
	if got := FieldTenant.Cut("acme"); got != "acme" {
		t.Errorf("Cut(acme) = %q", got)
	}
	long := strings.Repeat("é", 100)
	got := FieldTenant.Cut(long)
	b, _ := AppendDecision(nil, &Decision[string]{Tenant: long})
	if len(got) > MaxNameLen || !strings.HasSuffix(got, TruncationMark) || string(DecisionTenant(b)) != got {
		t.Errorf("Cut gave %q, AppendDecision wrote %q", got, DecisionTenant(b))
	}
}

// TestCodecDoesNotAllocate: appending into a buffer with room, and
// decoding into a Decision reused, allocate nothing.
func TestCodecDoesNotAllocate(t *testing.T) {
	rng := rand.New(rand.NewPCG(19, 3))
	m := randomEvent(t, rng, true)
	m.ShadowWouldReject = []string{"a", strings.Repeat("b", 300)}
	d := toDecision(m)
	buf := make([]byte, 0, MaxDecisionSize(d))
	var enc []byte
	if n := testing.AllocsPerRun(1000, func() { enc, _ = AppendDecision(buf[:0], d) }); n != 0 {
		t.Errorf("AppendDecision allocates %v times", n)
	}
	var v Decision[[]byte]
	if n := testing.AllocsPerRun(1000, func() { _, _ = DecodeDecision(enc, &v) }); n != 0 {
		t.Errorf("DecodeDecision allocates %v times", n)
	}
}

// FuzzDecodeDecision reads any bytes: never a panic, and the same event as
// proto.Unmarshal whenever that reads one; where only DecodeDecision reads
// one, a string is not UTF-8 (which it does not check). An event it reads
// within the bounds is written back as proto.Marshal writes it.
func FuzzDecodeDecision(f *testing.F) {
	rng := rand.New(rand.NewPCG(19, 4))
	for range 8 {
		f.Add(marshal(f, randomEvent(f, rng, true)))
	}
	f.Add([]byte{0x18, 0x82, 0x80, 0x80, 0x80, 0x10})
	f.Add([]byte{0x4a, 0x02, 0xff, 0xfe})
	f.Fuzz(func(t *testing.T, b []byte) {
		var d Decision[[]byte]
		beyond, err := DecodeDecision(b, &d)
		want := &DecisionEvent{}
		werr := proto.Unmarshal(b, want)
		switch {
		case werr == nil && err != nil:
			t.Fatalf("DecodeDecision: %v; proto.Unmarshal read %v", err, want)
		case werr != nil && err == nil:
			if !invalidText(b) {
				t.Fatalf("DecodeDecision read %v; proto.Unmarshal: %v", toEvent(&d), werr)
			}
			return
		case werr != nil:
			return
		}
		withinBounds(want)
		want.ProtoReflect().SetUnknown(nil)
		if !proto.Equal(toEvent(&d), want) {
			t.Fatalf("DecodeDecision read\n%v\nproto.Unmarshal\n%v", toEvent(&d), want)
		}
		if beyond == 0 {
			got, corrected := AppendDecision(nil, toDecision(want))
			if w := marshal(t, want); corrected&^FieldsOf(FieldCost, FieldRetryAfterSeconds) != 0 ||
				corrected == 0 && !bytes.Equal(got, w) {
				t.Fatalf("written back as %x (corrected %v), proto.Marshal %x", got, corrected, w)
			}
		}
	})
}

// invalidText reports whether a string field of the event encoded in b
// (any of its values on the wire) is not UTF-8.
func invalidText(b []byte) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		if typ == protowire.BytesType && DecisionField(num).Bound() > 0 {
			if v, _ := protowire.ConsumeBytes(b); !utf8.Valid(v) {
				return true
			}
		}
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return false
		}
		b = b[n:]
	}
	return false
}

// FuzzAppendDecision writes any values: the event reads back, every
// value within its bound, in at most MaxDecisionSize bytes.
func FuzzAppendDecision(f *testing.F) {
	f.Add("acme", "/v1/ünï", "shadow", int64(3), int64(-1), int32(-7), uint64(1))
	f.Fuzz(func(t *testing.T, tenant, endpoint, shadow string, cost, retry int64, status int32, seq uint64) {
		if !utf8.ValidString(tenant) || !utf8.ValidString(endpoint) || !utf8.ValidString(shadow) {
			return // proto.Unmarshal refuses what a writer should never hold
		}
		d := &Decision[string]{GatewayID: tenant + tenant, Seq: seq, Kind: DecisionEvent_KIND_REPORT, Tenant: tenant,
			Endpoint: endpoint, Cost: cost, RetryAfterSeconds: retry, Status: status,
			ShadowWouldReject: []string{shadow, tenant}, ClientIP: []byte(endpoint), CommandReason: endpoint + endpoint}
		b, _ := AppendDecision(nil, d)
		if len(b) > MaxDecisionSize(d) {
			t.Fatalf("%d bytes, MaxDecisionSize said at most %d", len(b), MaxDecisionSize(d))
		}
		m := &DecisionEvent{}
		if err := proto.Unmarshal(b, m); err != nil {
			t.Fatal(err)
		}
		if withinBounds(proto.Clone(m).(*DecisionEvent)) != 0 || m.Cost < 0 || m.Cost > MaxCost ||
			m.RetryAfterSeconds < 0 || m.RetryAfterSeconds > MaxRetryAfterSeconds || m.Seq != seq || m.Status != status {
			t.Fatalf("written as %v", m)
		}
	})
}

func BenchmarkAppendDecision(b *testing.B) {
	d := &Decision[string]{GatewayID: "gw-7f3a", Epoch: 1 << 60, Partition: 3, Seq: 123456, TimeUnixMicros: 1_700_000_000_000_000,
		Kind: DecisionEvent_KIND_DECISION, KeyID: "key-000042-abcdefghijklm", KeyPrefix: "sk_prod_ab…", Tenant: "tenant-42",
		Endpoint: "/v1/orders", Method: "POST", Cost: 1, RuleID: "orders", Algorithm: "token_bucket", Allowed: true,
		Reason: "allowed", Status: 200, Remaining: 10, ClientIP: []byte("10.1.2.3"), Surface: "proxy"}
	buf := make([]byte, 0, MaxDecisionSize(d))
	b.ReportAllocs()
	for b.Loop() {
		buf, _ = AppendDecision(buf[:0], d)
	}
}

func BenchmarkDecodeDecision(b *testing.B) {
	rec := marshal(b, &DecisionEvent{GatewayId: "gw-7f3a", Epoch: 1 << 60, Partition: 3, Seq: 123456,
		TimeUnixMicros: 1_700_000_000_000_000, Kind: DecisionEvent_KIND_DECISION, KeyId: "key-000042-abcdefghijklm",
		KeyPrefix: "sk_prod_ab…", Tenant: "tenant-42", Endpoint: "/v1/orders", Method: "POST", Cost: 1, RuleId: "orders",
		Algorithm: "token_bucket", Allowed: true, Reason: "allowed", Status: 200, Remaining: 10, ClientIp: "10.1.2.3",
		Surface: "proxy"})
	var d Decision[[]byte]
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeDecision(rec, &d); err != nil {
			b.Fatal(err)
		}
	}
}
