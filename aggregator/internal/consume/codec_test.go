package consume

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/tollgate/tollgate/aggregator/internal/windows"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

func TestDecodeEventMatchesSchema(t *testing.T) {
	in := &tollgatev1.DecisionEvent{GatewayId: "gw", Epoch: 1 << 60, Partition: 5, Seq: 99, TimeUnixMicros: 1_700_000_000_123_456,
		Kind: tollgatev1.DecisionEvent_KIND_REPORT, KeyId: "kid", KeyPrefix: "sk_…", Tenant: "acme", Tier: "pro",
		Endpoint: "/v1/x", Method: "GET", Cost: 7, RuleId: "r1", Algorithm: "gcra", Allowed: true, Reason: "allowed",
		Status: 200, Remaining: 3, ShadowWouldReject: []string{"s"}, ClientIp: "10.0.0.1", LastSeq: 12}
	b, err := proto.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var ev windows.Event
	if err := decodeEvent(b, &ev); err != nil {
		t.Fatal(err)
	}
	want := windows.Event{Source: windows.Source{Gateway: "gw", Epoch: 1 << 60, Partition: 5}, Seq: 99,
		TimeMicros: 1_700_000_000_123_456, Kind: windows.KindReport, Tenant: "acme", KeyID: "kid", KeyPrefix: "sk_…",
		Endpoint: "/v1/x", Rule: "r1", Allowed: true, Cost: 7, LastSeq: 12}
	if ev != want {
		t.Fatalf("decoded %+v\nwant    %+v", ev, want)
	}
	if err := decodeEvent(b[:len(b)-1], &ev); err == nil {
		t.Fatal("truncated event decoded")
	}
}

func FuzzDecodeEvent(f *testing.F) {
	b, _ := proto.Marshal(&tollgatev1.DecisionEvent{GatewayId: "g", Seq: 1, Kind: tollgatev1.DecisionEvent_KIND_DECISION})
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		var ev windows.Event
		_ = decodeEvent(b, &ev)
	})
}

// BenchmarkApply measures the aggregator's CPU per event without Kafka:
// decoding and counting into a partition table (3 rows per event), the
// work SPEC §8's ≥ 250 k events/s per core is about.
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
	tab := windows.NewTable(windows.Config{}, 0, nil, nil, nil)
	var ev windows.Event
	b.ReportAllocs()
	b.ResetTimer()
	x := tab.Begin()
	for i := range b.N {
		if err := decodeEvent(recs[i%len(recs)], &ev); err != nil {
			b.Fatal(err)
		}
		ev.Seq = uint64(i + 1)
		if _, err := x.Apply(&ev, 1_700_000_000); err != nil {
			b.Fatal(err)
		}
		if i%20_000 == 19_999 {
			_ = x.Changes()
			x.Commit(int64(i))
			x = tab.Begin()
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}
