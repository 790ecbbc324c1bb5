package consume

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/tollgate/tollgate/aggregator/internal/windows"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

func TestDecodeEventMatchesSchema(t *testing.T) {
	in := &tollgatev1.DecisionEvent{GatewayId: "gw", Epoch: 1 << 60, Partition: 5, Seq: 99, TimeUnixMicros: 1_700_000_000_123_456,
		Kind: tollgatev1.DecisionEvent_KIND_REPORT, KeyId: "kid", KeyPrefix: "sk_…", Tenant: "acme", Tier: "pro",
		Endpoint: "/v1/x", Method: "GET", Cost: 7, RuleId: "r1", Algorithm: "gcra", Allowed: true, Reason: "allowed",
		Status: 200, Remaining: 3, ShadowWouldReject: []string{"s"}, ClientIp: "10.0.0.1", LastSeq: 12, RetryAfterSeconds: 9,
		PenaltyLevel: 2}
	ev := decodeProto(t, in)
	want := windows.Event{Source: windows.Source{Gateway: "gw", Epoch: 1 << 60, Partition: 5}, Seq: 99,
		TimeMicros: 1_700_000_000_123_456, Kind: windows.KindReport, Tenant: "acme", KeyID: "kid", KeyPrefix: "sk_…",
		Endpoint: "/v1/x", Rule: "r1", Allowed: true, Cost: 7, LastSeq: 12}
	if ev.Event != want || ev.RetryAfter != 9 || ev.Allowlisted || ev.Lift || ev.Actor != "" || ev.CmdReason != "" ||
		ev.TooLong || ev.BadPartition {
		t.Fatalf("decoded %+v\nwant    %+v, RetryAfter 9", ev, want)
	}
	b, _ := proto.Marshal(in)
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

// BenchmarkApply measures the aggregator's CPU per event without Kafka
// (ApplyBench): decoding, checking the bounds, counting into a partition
// table (3 rows per event) and, in "abuse", feeding the detectors too: the
// work the target of ≥ 250 k events/s per core is about. loadtest sweep
// -what aggregator runs the same at other key counts; "new-keys" is its
// case of every event a key not seen before (fresh tables every 2^20
// events).
func BenchmarkApply(b *testing.B) {
	// 4 096 distinct keys, the figure docs/benchmarks.md has always
	// shown; the sweep shows how it moves with more.
	const keys, newKeys = 4096, 1 << 20
	a, err := NewApplyBench(keys, keys)
	if err != nil {
		b.Fatal(err)
	}
	for _, detect := range []bool{false, true} {
		name := "usage"
		if detect {
			name = "usage+abuse"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.ResetTimer()
			if err := a.Run(b.N, detect); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
	b.Run("new-keys+abuse", func(b *testing.B) {
		a, err := NewApplyBench(newKeys, newKeys)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for n := b.N; n > 0; n -= newKeys {
			if err := a.Run(min(n, newKeys), true); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
	})
}

// TestCheckRefusesFieldsOutOfBounds checks each bound the aggregator holds
// decision events to, and that a valid event passes.
func TestCheckRefusesFieldsOutOfBounds(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	valid := func() *tollgatev1.DecisionEvent {
		return &tollgatev1.DecisionEvent{GatewayId: "gw", Epoch: 9, Partition: 2, Seq: 5, TimeUnixMicros: now.UnixMicro(),
			Kind: tollgatev1.DecisionEvent_KIND_DECISION, KeyId: "kid", KeyPrefix: "tg_…", Tenant: "acme", Endpoint: "/v1/x",
			Cost: 3, RuleId: "r1", Allowed: true, RetryAfterSeconds: 0}
	}
	long := func(n int) string { return strings.Repeat("x", n) }
	for _, tc := range []struct {
		name     string
		change   func(*tollgatev1.DecisionEvent)
		ts       time.Time // the record's timestamp; zero: now
		reason   string
		identity bool
	}{
		{name: "valid", change: func(*tollgatev1.DecisionEvent) {}},
		{name: "valid at the bounds", change: func(ev *tollgatev1.DecisionEvent) {
			ev.Cost, ev.RetryAfterSeconds = tollgatev1.MaxCost, tollgatev1.MaxRetryAfterSeconds
			ev.Endpoint, ev.GatewayId, ev.Tenant = long(tollgatev1.MaxEndpointLen), long(tollgatev1.MaxGatewayIDLen), long(tollgatev1.MaxNameLen)
			ev.TimeUnixMicros = now.Add(tollgatev1.MaxEventAhead).UnixMicro()
		}},
		{name: "replayed a month later", ts: now, change: func(ev *tollgatev1.DecisionEvent) {
			ev.TimeUnixMicros = now.Add(-tollgatev1.MaxEventAge).UnixMicro()
		}},
		{name: "negative cost", change: func(ev *tollgatev1.DecisionEvent) { ev.Cost = -1 }, reason: "cost"},
		{name: "cost above the bound", change: func(ev *tollgatev1.DecisionEvent) { ev.Cost = tollgatev1.MaxCost + 1 }, reason: "cost"},
		{name: "report cost above the bound", change: func(ev *tollgatev1.DecisionEvent) {
			ev.Kind, ev.Cost = tollgatev1.DecisionEvent_KIND_REPORT, 9_000_000_000_000_000_000
		}, reason: "cost"},
		{name: "2099", change: func(ev *tollgatev1.DecisionEvent) {
			ev.TimeUnixMicros = time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
		}, reason: "time"},
		{name: "2099 in a record stamped 2099", ts: time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC), change: func(ev *tollgatev1.DecisionEvent) {
			ev.TimeUnixMicros = time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
		}, reason: "time"},
		{name: "1970", change: func(ev *tollgatev1.DecisionEvent) { ev.TimeUnixMicros = 0 }, reason: "time"},
		{name: "1970 in a record stamped 1970", ts: time.Unix(0, 1000), change: func(ev *tollgatev1.DecisionEvent) { ev.TimeUnixMicros = 1 }, reason: "time"},
		{name: "older than the bound before its record", ts: now, change: func(ev *tollgatev1.DecisionEvent) {
			ev.TimeUnixMicros = now.Add(-tollgatev1.MaxEventAge - time.Second).UnixMicro()
		}, reason: "time"},
		{name: "long endpoint", change: func(ev *tollgatev1.DecisionEvent) { ev.Endpoint = long(950_000) }, reason: "length"},
		{name: "long key prefix", change: func(ev *tollgatev1.DecisionEvent) { ev.KeyPrefix = long(tollgatev1.MaxNameLen + 1) }, reason: "length"},
		{name: "long tenant", change: func(ev *tollgatev1.DecisionEvent) { ev.Tenant = long(tollgatev1.MaxNameLen + 1) }, reason: "length"},
		{name: "long rule id", change: func(ev *tollgatev1.DecisionEvent) { ev.RuleId = long(tollgatev1.MaxNameLen + 1) }, reason: "length"},
		{name: "long key id", change: func(ev *tollgatev1.DecisionEvent) { ev.KeyId = long(tollgatev1.MaxNameLen + 1) }, reason: "length"},
		{name: "retry after", change: func(ev *tollgatev1.DecisionEvent) { ev.RetryAfterSeconds = -1 }, reason: "retry_after"},
		{name: "no gateway", change: func(ev *tollgatev1.DecisionEvent) { ev.GatewayId = "" }, reason: "identity", identity: true},
		{name: "long gateway", change: func(ev *tollgatev1.DecisionEvent) { ev.GatewayId = long(tollgatev1.MaxGatewayIDLen + 1) }, reason: "identity", identity: true},
		{name: "no epoch", change: func(ev *tollgatev1.DecisionEvent) { ev.Epoch = 0 }, reason: "identity", identity: true},
		{name: "no seq", change: func(ev *tollgatev1.DecisionEvent) { ev.Seq = 0 }, reason: "identity", identity: true},
		{name: "another partition", change: func(ev *tollgatev1.DecisionEvent) { ev.Partition = 3 }, reason: "identity", identity: true},
		{name: "negative partition", change: func(ev *tollgatev1.DecisionEvent) { ev.Partition = -2 }, reason: "identity", identity: true},
		{name: "marker", change: func(ev *tollgatev1.DecisionEvent) {
			*ev = tollgatev1.DecisionEvent{GatewayId: "gw", Epoch: 9, Partition: 2, Seq: 8, LastSeq: 7,
				TimeUnixMicros: now.UnixMicro(), Kind: tollgatev1.DecisionEvent_KIND_EPOCH_CLOSED}
		}},
		{name: "marker with seq not last_seq + 1", change: func(ev *tollgatev1.DecisionEvent) {
			*ev = tollgatev1.DecisionEvent{GatewayId: "gw", Epoch: 9, Partition: 2, Seq: 1_000_000, LastSeq: 7,
				TimeUnixMicros: now.UnixMicro(), Kind: tollgatev1.DecisionEvent_KIND_EPOCH_CLOSED}
		}, reason: "marker", identity: true},
		{name: "lift", change: func(ev *tollgatev1.DecisionEvent) {
			*ev = tollgatev1.DecisionEvent{Partition: 2, TimeUnixMicros: now.UnixMicro(), Kind: tollgatev1.DecisionEvent_KIND_PENALTY_LIFT,
				KeyId: "kid", CommandActor: "alice", CommandReason: "fixed"}
		}},
		{name: "lift from 2099", change: func(ev *tollgatev1.DecisionEvent) {
			*ev = tollgatev1.DecisionEvent{Partition: 2, TimeUnixMicros: time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro(),
				Kind: tollgatev1.DecisionEvent_KIND_PENALTY_LIFT, KeyId: "kid"}
		}, reason: "time"},
		{name: "lift with a long reason", change: func(ev *tollgatev1.DecisionEvent) {
			*ev = tollgatev1.DecisionEvent{Partition: 2, TimeUnixMicros: now.UnixMicro(), Kind: tollgatev1.DecisionEvent_KIND_PENALTY_LIFT,
				KeyId: "kid", CommandReason: long(tollgatev1.MaxCommandReasonLen + 1)}
		}, reason: "length"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			in := valid()
			tc.change(in)
			ev := decodeProto(t, in)
			ts := tc.ts
			if ts.IsZero() {
				ts = now
			}
			reason, identity := check(&ev, 2, ts, now)
			if reason != tc.reason || identity != tc.identity {
				t.Fatalf("check = %q, identity %v; want %q, %v", reason, identity, tc.reason, tc.identity)
			}
			if ev.TooLong && len(ev.Endpoint)+len(ev.KeyPrefix)+len(ev.Tenant)+len(ev.Rule)+len(ev.KeyID)+len(ev.CmdReason) > 4*tollgatev1.MaxEndpointLen {
				t.Error("a string beyond its bound was copied")
			}
		})
	}
}

// TestCheckRefusesAPartitionBeyondInt32: a partition field of 2^32+2 reads
// as 2 when truncated to an int32, as the generated code reads it; it is
// not partition 2's.
func TestCheckRefusesAPartitionBeyondInt32(t *testing.T) {
	t.Parallel()
	now := time.Now()
	b, err := proto.Marshal(&tollgatev1.DecisionEvent{GatewayId: "gw", Epoch: 9, Seq: 5, TimeUnixMicros: now.UnixMicro(),
		Kind: tollgatev1.DecisionEvent_KIND_DECISION, KeyId: "kid", Tenant: "acme", Cost: 1, Allowed: true})
	if err != nil {
		t.Fatal(err)
	}
	b = protowire.AppendVarint(protowire.AppendTag(b, 3, protowire.VarintType), 1<<32+2)
	var ev event
	if err := decodeEvent(b, &ev); err != nil {
		t.Fatal(err)
	}
	if reason, identity := check(&ev, 2, now, now); reason != invalidIdentity || !identity {
		t.Fatalf("check = %q, identity %v; want %q, true", reason, identity, invalidIdentity)
	}
}

// TestFitRollup cuts usage records to the topic's size, keeping cut
// endpoints apart and the counts whole.
func TestFitRollup(t *testing.T) {
	t.Parallel()
	row := &windows.Row{KeyPrefix: "tg_…", Allowed: 7, Rejected: 2, Cost: 9, Rules: []string{"a", "b"}, Revision: 1}
	k := windows.RowKey{Tenant: "acme", KeyID: "kid", Endpoint: "/v1/x", Gran: windows.Minute, Start: 60}
	key, v, cut, ok, err := fitRollup(k, row, 1, 1_000_000)
	if err != nil || !ok || cut || string(key) != "acme/kid//v1/x/minute@60" {
		t.Fatalf("a small rollup: %q %v %v %v", key, cut, ok, err)
	}
	var u tollgatev1.UsageRollup
	if err := proto.Unmarshal(v, &u); err != nil || u.Truncated || u.Endpoint != "/v1/x" || len(u.RulesHit) != 2 {
		t.Fatalf("a small rollup: %v %v", &u, err)
	}
	long := func(c string) windows.RowKey {
		kk := k
		kk.Endpoint = "/" + strings.Repeat(c, 950_000)
		return kk
	}
	seen := map[string]bool{}
	for _, c := range []string{"a", "b"} {
		for _, limit := range []int{2000, 1_000_000} {
			key, v, cut, ok, err := fitRollup(long(c), row, 1, limit)
			if err != nil || !ok || !cut {
				t.Fatalf("limit %d: cut %v ok %v %v", limit, cut, ok, err)
			}
			if n := len(key) + len(v) + recordOverhead; n > limit {
				t.Fatalf("limit %d: a record of %d bytes", limit, n)
			}
			var u tollgatev1.UsageRollup
			if err := proto.Unmarshal(v, &u); err != nil || !u.Truncated || u.Allowed != 7 || u.Cost != 9 ||
				!strings.Contains(string(key), u.Endpoint) || !utf8.ValidString(u.Endpoint) {
				t.Fatalf("limit %d: %v %v", limit, &u, err)
			}
			if seen[u.Endpoint] {
				t.Fatalf("two endpoints cut to the same %q", u.Endpoint)
			}
			seen[u.Endpoint] = true
		}
	}
	if _, _, _, ok, err := fitRollup(long("a"), row, 1, 100); ok || err != nil {
		t.Fatalf("a limit nothing fits in: ok %v %v", ok, err)
	}
}

func FuzzFitRollup(f *testing.F) {
	f.Add("/v1/ünï", "acme", 300)
	f.Fuzz(func(t *testing.T, endpoint, tenant string, limit int) {
		if limit < 0 || limit > 1<<20 || len(tenant) > tollgatev1.MaxNameLen {
			return
		}
		k := windows.RowKey{Tenant: tenant, KeyID: "kid", Endpoint: endpoint, Gran: windows.Hour, Start: 3600}
		key, v, _, ok, err := fitRollup(k, &windows.Row{Allowed: 1, Rules: []string{"r"}}, 1, limit)
		if err != nil {
			if utf8.ValidString(endpoint) && utf8.ValidString(tenant) {
				t.Fatal(err)
			}
			return // proto refuses invalid UTF-8 in strings
		}
		if ok && len(key)+len(v)+recordOverhead > limit {
			t.Fatalf("a record of %d bytes for a limit of %d", len(key)+len(v)+recordOverhead, limit)
		}
	})
}

// decodeProto decodes in, encoded by the generated code, as the consumer
// does.
func decodeProto(t *testing.T, in *tollgatev1.DecisionEvent) event {
	t.Helper()
	b, err := proto.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var ev event
	if err := decodeEvent(b, &ev); err != nil {
		t.Fatal(err)
	}
	return ev
}
