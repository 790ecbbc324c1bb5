package consume

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/tollgate/tollgate/aggregator/internal/abuse"
	"github.com/tollgate/tollgate/aggregator/internal/windows"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

func TestDecodeEventMatchesSchema(t *testing.T) {
	in := &tollgatev1.DecisionEvent{GatewayId: "gw", Epoch: 1 << 60, Partition: 5, Seq: 99, TimeUnixMicros: 1_700_000_000_123_456,
		Kind: tollgatev1.DecisionEvent_KIND_REPORT, KeyId: "kid", KeyPrefix: "sk_…", Tenant: "acme", Tier: "pro",
		Endpoint: "/v1/x", Method: "GET", Cost: 7, RuleId: "r1", Algorithm: "gcra", Allowed: true, Reason: "allowed",
		Status: 200, Remaining: 3, ShadowWouldReject: []string{"s"}, ClientIp: "10.0.0.1", LastSeq: 12, RetryAfterSeconds: 9,
		PenaltyLevel: 2}
	b, err := proto.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var ev event
	if err := decodeEvent(b, &ev); err != nil {
		t.Fatal(err)
	}
	want := event{Event: windows.Event{Source: windows.Source{Gateway: "gw", Epoch: 1 << 60, Partition: 5}, Seq: 99,
		TimeMicros: 1_700_000_000_123_456, Kind: windows.KindReport, Tenant: "acme", KeyID: "kid", KeyPrefix: "sk_…",
		Endpoint: "/v1/x", Rule: "r1", Allowed: true, Cost: 7, LastSeq: 12}, RetryAfter: 9}
	if ev != want {
		t.Fatalf("decoded %+v\nwant    %+v", ev, want)
	}
	if err := decodeEvent(b[:len(b)-1], &ev); err == nil {
		t.Fatal("truncated event decoded")
	}
	in.Reason = "allowlisted"
	b, _ = proto.Marshal(in)
	if err := decodeEvent(b, &ev); err != nil || !ev.Allowlisted {
		t.Fatalf("allowlisted reason not read: %+v %v", ev, err)
	}
	lift := &tollgatev1.DecisionEvent{Partition: 3, TimeUnixMicros: 42, Kind: tollgatev1.DecisionEvent_KIND_PENALTY_LIFT,
		KeyId: "kid", Tenant: "acme", CommandActor: "alice", CommandReason: "fixed"}
	b, _ = proto.Marshal(lift)
	if err := decodeEvent(b, &ev); err != nil || !ev.Lift || ev.Kind != 0 || ev.Actor != "alice" || ev.CmdReason != "fixed" ||
		ev.KeyID != "kid" || ev.TimeMicros != 42 {
		t.Fatalf("lift command decoded as %+v %v", ev, err)
	}
	unknown := &tollgatev1.DecisionEvent{Kind: 99, KeyId: "kid"}
	b, _ = proto.Marshal(unknown)
	if err := decodeEvent(b, &ev); err != nil || ev.Lift || ev.Kind != 0 {
		t.Fatalf("unknown kind decoded as %+v %v", ev, err)
	}
}

func FuzzDecodeEvent(f *testing.F) {
	b, _ := proto.Marshal(&tollgatev1.DecisionEvent{GatewayId: "g", Seq: 1, Kind: tollgatev1.DecisionEvent_KIND_DECISION})
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		var ev event
		_ = decodeEvent(b, &ev)
	})
}

// BenchmarkApply measures the aggregator's CPU per event without Kafka:
// decoding, counting into a partition table (3 rows per event) and, in
// "abuse", feeding the detectors too: the work the target of ≥ 250 k
// events/s per core is about.
func BenchmarkApply(b *testing.B) {
	const keys = 10_000
	recs := make([][]byte, 4096)
	for i := range recs {
		v, _ := proto.Marshal(&tollgatev1.DecisionEvent{GatewayId: "gw-1", Epoch: 1, Partition: 0,
			TimeUnixMicros: 1_700_000_000_000_000, Kind: tollgatev1.DecisionEvent_KIND_DECISION,
			KeyId: fmt.Sprintf("key-%06d-abcdefghijklm", i%keys), KeyPrefix: "sk_prod_ab…", Tenant: fmt.Sprint("tenant-", i%100),
			Endpoint: "/v1/orders", Method: "POST", Cost: 1, RuleId: "orders", Algorithm: "token_bucket", Allowed: i%10 != 0,
			Reason: "allowed", Status: 200, Remaining: 10, ClientIp: "10.1.2.3", Surface: "proxy"})
		recs[i] = v
	}
	for _, detect := range []bool{false, true} {
		name := "usage"
		if detect {
			name = "usage+abuse"
		}
		b.Run(name, func(b *testing.B) {
			tab := windows.NewTable(windows.Config{}, 0, nil, nil, nil)
			pen := abuse.NewTable(abuse.Config{}, 0, nil)
			now := time.Unix(1_700_000_000, 0)
			var ev event
			b.ReportAllocs()
			b.ResetTimer()
			x, px := tab.Begin(), pen.Begin()
			for i := range b.N {
				if err := decodeEvent(recs[i%len(recs)], &ev); err != nil {
					b.Fatal(err)
				}
				ev.Seq = uint64(i + 1)
				applied, err := x.Apply(&ev.Event, 1_700_000_000)
				if err != nil {
					b.Fatal(err)
				}
				if applied && detect {
					d := abuse.Decision{KeyID: ev.KeyID, KeyPrefix: ev.KeyPrefix, Tenant: ev.Tenant, TimeMicros: ev.TimeMicros,
						Allowed: ev.Allowed, RetryAfter: ev.RetryAfter}
					px.Observe(&d, now)
				}
				if i%20_000 == 19_999 {
					px.Evaluate(now)
					_ = x.Changes()
					_ = px.Changes()
					x.Commit(int64(i))
					px.Commit()
					x, px = tab.Begin(), pen.Begin()
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}
