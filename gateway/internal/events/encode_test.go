package events

import (
	"bytes"
	"hash/fnv"
	"net/netip"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// fullDecision sets every field a Decision and a Request carry that an
// event holds, each to a value other than its zero.
func fullDecision() (*guard.Request, *guard.Decision) {
	req := &guard.Request{Key: "tg_live_secret", Method: "POST", Path: "/v1/users/42", IP: netip.MustParseAddr("2001:db8::7")}
	d := &guard.Decision{
		Allowed: false, Status: 429, Code: guard.CodeRateLimitExceeded, Reason: guard.ReasonRateLimited,
		Degraded: true, PenaltyLevel: 2, RetryAfter: 7, Time: 1_750_000_000_123_456,
		KeyID: "kid_0123", KeyPrefix: "tg_live_se", Tenant: "acme", Tier: "pro", Endpoint: "/v1/users/{id}", Cost: 3,
		Rules: []guard.RuleResult{
			{ID: "per-key", Algorithm: rules.TokenBucket, Allowed: true, Remaining: 9},
			{ID: "per-tenant", Algorithm: rules.GCRA, Allowed: false, Remaining: 4, RetryAfter: 7},
			{ID: "shadow-ok", Algorithm: rules.FixedWindow, Shadow: true, Allowed: true},
			{ID: "shadow-a", Algorithm: rules.SlidingWindowLog, Shadow: true, Allowed: false},
			{ID: "shadow-b", Algorithm: rules.SlidingWindowCounter, Shadow: true, Allowed: false},
		},
		Deciding: 1,
	}
	return req, d
}

// encodeOne encodes the event of d as Record does, as gw-1's event 12345
// of partition 5, and returns it with its corrections.
func encodeOne(t testing.TB, k kind, req *guard.Request, d *guard.Decision, surface string) ([]byte, fixes) {
	t.Helper()
	ev := eventOf(k, d.Time, req, d, surface, nil)
	ev.GatewayID, ev.Epoch, ev.Partition, ev.Seq = "gw-1", 0xfeedfacecafebeef, 5, 12345
	ev.ShadowWouldReject = shadowIDs(nil, d)
	bound := tollgatev1.MaxDecisionSize(&ev)
	b, corrected := tollgatev1.AppendDecision(make([]byte, 0, bound), &ev)
	if len(b) > bound {
		t.Fatalf("event of %d bytes, MaxDecisionSize said at most %d", len(b), bound)
	}
	if bound > 16<<10 {
		t.Fatalf("MaxDecisionSize %d: a bounded event must fit a chunk", bound)
	}
	return b, fixesOf(corrected)
}

// TestEncodeRoundTrip decodes the producer's events with the generated
// code and checks that every field holds the decision's value, and that
// the bytes are what proto.Marshal writes.
func TestEncodeRoundTrip(t *testing.T) {
	t.Parallel()
	req, d := fullDecision()
	denied := &tollgatev1.DecisionEvent{
		GatewayId: "gw-1", Epoch: 0xfeedfacecafebeef, Partition: 5, Seq: 12345, TimeUnixMicros: 1_750_000_000_123_456,
		Kind: tollgatev1.DecisionEvent_KIND_DECISION, KeyId: "kid_0123", KeyPrefix: "tg_live_se", Tenant: "acme",
		Tier: "pro", Endpoint: "/v1/users/{id}", Method: "POST", Cost: 0, RuleId: "per-tenant", Algorithm: "gcra",
		Allowed: false, Reason: "rate_limited", Status: 429, Remaining: 4, RetryAfterSeconds: 7, Degraded: true,
		ShadowWouldReject: []string{"shadow-a", "shadow-b"}, ClientIp: "2001:db8::7", Surface: "proxy", PenaltyLevel: 2,
	}
	allowedReq, allowedD := fullDecision()
	allowedD.Allowed, allowedD.Status, allowedD.Reason, allowedD.RetryAfter, allowedD.Deciding = true, 200, guard.ReasonAllowed, 0, 0
	allowedD.Rules[0].Remaining = -1 // fail-open: negative values take ten bytes
	allowed := proto.Clone(denied).(*tollgatev1.DecisionEvent)
	allowed.Allowed, allowed.Status, allowed.Reason, allowed.RetryAfterSeconds = true, 200, "allowed", 0
	allowed.Cost, allowed.RuleId, allowed.Algorithm, allowed.Remaining = 3, "per-key", "token_bucket", -1

	report := proto.Clone(allowed).(*tollgatev1.DecisionEvent)
	report.Kind = tollgatev1.DecisionEvent_KIND_REPORT
	report.Allowed, report.Reason, report.Status, report.Remaining, report.RetryAfterSeconds = false, "", 0, 0, 0
	report.Surface = "report"

	anonReq := &guard.Request{Method: "GET", IP: netip.MustParseAddr("203.0.113.9")}
	anonD := &guard.Decision{Allowed: true, Status: 200, Reason: guard.ReasonNoRule, Deciding: -1, Endpoint: "/health", Cost: 1, Time: 42}
	anon := &tollgatev1.DecisionEvent{GatewayId: "gw-1", Epoch: 0xfeedfacecafebeef, Partition: 5, Seq: 12345,
		TimeUnixMicros: 42, Kind: tollgatev1.DecisionEvent_KIND_DECISION, Endpoint: "/health", Method: "GET", Cost: 1,
		Allowed: true, Reason: "no_rule", Status: 200, ClientIp: "203.0.113.9", Surface: "check"}

	for _, tc := range []struct {
		name    string
		k       kind
		req     *guard.Request
		d       *guard.Decision
		surface string
		want    *tollgatev1.DecisionEvent
	}{
		{"rejected", kindDecision, req, d, "proxy", denied},
		{"allowed", kindDecision, allowedReq, allowedD, "proxy", allowed},
		{"report", kindReport, allowedReq, allowedD, "report", report},
		{"anonymous", kindDecision, anonReq, anonD, "check", anon},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, _ := encodeOne(t, tc.k, tc.req, tc.d, tc.surface)
			got := &tollgatev1.DecisionEvent{}
			if err := proto.Unmarshal(b, got); err != nil {
				t.Fatalf("unmarshal: %v", err)
			}
			if !proto.Equal(got, tc.want) {
				t.Fatalf("decoded\n%v\nwant\n%v", got, tc.want)
			}
			if len(got.ProtoReflect().GetUnknown()) > 0 {
				t.Fatalf("unknown fields in the encoding: %x", got.ProtoReflect().GetUnknown())
			}
			want, err := proto.MarshalOptions{Deterministic: true}.Marshal(tc.want)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(b, want) {
				t.Fatalf("bytes differ from proto.Marshal:\n got %x\nwant %x", b, want)
			}
			if k := tollgatev1.DecisionTenant(b); string(k) != tc.want.Tenant {
				t.Fatalf("DecisionTenant = %q, want %q", k, tc.want.Tenant)
			}
		})
	}

	// Every field of the schema is written by the rejection, the admission
	// or the marker: a new field fails here until the encoder writes it.
	var written []*tollgatev1.DecisionEvent
	rejection, _ := encodeOne(t, kindDecision, req, d, "proxy")
	admission, _ := encodeOne(t, kindDecision, allowedReq, allowedD, "proxy")
	for _, b := range [][]byte{rejection, admission, appendMarker(nil, "gw-1", 7, 3, 99, 1)} {
		m := &tollgatev1.DecisionEvent{}
		if err := proto.Unmarshal(b, m); err != nil {
			t.Fatal(err)
		}
		written = append(written, m)
	}
	fields := denied.ProtoReflect().Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		f := fields.Get(i)
		if f.Number() >= 100 {
			continue // the aggregator's command records, never a gateway's
		}
		has := false
		for _, m := range written {
			has = has || m.ProtoReflect().Has(f)
		}
		if !has {
			t.Errorf("field %s (%d) is written by no event", f.Name(), f.Number())
		}
	}
}

func TestMarkerRoundTrip(t *testing.T) {
	t.Parallel()
	b := appendMarker(nil, "gw-2", 77, 4, 20_000, 1_700_000_000_000_000)
	got := &tollgatev1.DecisionEvent{}
	if err := proto.Unmarshal(b, got); err != nil {
		t.Fatal(err)
	}
	want := &tollgatev1.DecisionEvent{GatewayId: "gw-2", Epoch: 77, Partition: 4, Seq: 20_001, LastSeq: 20_000,
		TimeUnixMicros: 1_700_000_000_000_000, Kind: tollgatev1.DecisionEvent_KIND_EPOCH_CLOSED}
	if !proto.Equal(got, want) {
		t.Fatalf("decoded %v, want %v", got, want)
	}
	if k := tollgatev1.DecisionTenant(b); k != nil {
		t.Fatalf("a marker has key %q, want none", k)
	}
}

func TestPartitionOfIsFNV32a(t *testing.T) {
	t.Parallel()
	for _, tenant := range []string{"", "acme", "~anonymous", "tenant-with-a-long-name-42", "ü"} {
		for _, n := range []int32{1, 6, 7, 64} {
			h := fnv.New32a()
			_, _ = h.Write([]byte(tenant))
			if got, want := PartitionOf(tenant, n), int32(h.Sum32()%uint32(n)); got != want {
				t.Errorf("PartitionOf(%q, %d) = %d, want %d", tenant, n, got, want)
			}
		}
	}
}

// TestEncodeKeepsEventsWithinBounds gives the encoder decisions with values
// beyond the schema's bounds (a 950 KB endpoint, a cost of 9e18, a
// negative cost, a Retry-After of 2^62, long names): the event is kept,
// every field it writes is within its bound (what the aggregator checks),
// strings are cut on a rune boundary with the truncation mark, and each
// correction is reported.
func TestEncodeKeepsEventsWithinBounds(t *testing.T) {
	t.Parallel()
	long := func(n int) string { return strings.Repeat("é", n/2) + "x" }
	for _, tc := range []struct {
		name   string
		k      kind
		change func(*guard.Request, *guard.Decision)
		want   fixes
		check  func(*testing.T, *tollgatev1.DecisionEvent)
	}{
		{"within bounds", kindDecision, func(*guard.Request, *guard.Decision) {}, 0, nil},
		{"950 KB endpoint", kindDecision, func(_ *guard.Request, d *guard.Decision) { d.Endpoint = "/" + long(950_000) }, 1 << fixLength,
			func(t *testing.T, ev *tollgatev1.DecisionEvent) {
				if len(ev.Endpoint) > tollgatev1.MaxEndpointLen || !strings.HasSuffix(ev.Endpoint, tollgatev1.TruncationMark) {
					t.Errorf("endpoint of %d bytes ending %q", len(ev.Endpoint), ev.Endpoint[len(ev.Endpoint)-8:])
				}
			}},
		{"long names", kindDecision, func(req *guard.Request, d *guard.Decision) {
			req.Method, d.KeyPrefix, d.Tier, d.Rules[1].ID, d.Rules[3].ID = long(500), long(500), long(500), long(500), long(500)
		}, 1 << fixLength, func(t *testing.T, ev *tollgatev1.DecisionEvent) {
			for _, s := range append([]string{ev.Method, ev.KeyPrefix, ev.Tier, ev.RuleId}, ev.ShadowWouldReject...) {
				if len(s) > tollgatev1.MaxNameLen {
					t.Errorf("a name of %d bytes", len(s))
				}
			}
		}},
		{"cost of 9e18", kindReport, func(_ *guard.Request, d *guard.Decision) { d.Allowed, d.Cost = true, 9_000_000_000_000_000_000 }, 1 << fixCost,
			func(t *testing.T, ev *tollgatev1.DecisionEvent) {
				if ev.Cost != tollgatev1.MaxCost {
					t.Errorf("cost %d, want %d", ev.Cost, tollgatev1.MaxCost)
				}
			}},
		{"negative cost", kindDecision, func(_ *guard.Request, d *guard.Decision) { d.Allowed, d.Cost = true, -5 }, 1 << fixCost,
			func(t *testing.T, ev *tollgatev1.DecisionEvent) {
				if ev.Cost != 0 {
					t.Errorf("cost %d, want 0", ev.Cost)
				}
			}},
		{"a long tier and a negative cost", kindDecision, func(_ *guard.Request, d *guard.Decision) {
			d.Allowed, d.Cost, d.Tier = true, -5, long(500)
		}, 1<<fixCost | 1<<fixLength, nil},
		{"retry after", kindDecision, func(_ *guard.Request, d *guard.Decision) { d.RetryAfter = 1 << 62 }, 1 << fixRetryAfter,
			func(t *testing.T, ev *tollgatev1.DecisionEvent) {
				if ev.RetryAfterSeconds != tollgatev1.MaxRetryAfterSeconds {
					t.Errorf("retry after %d", ev.RetryAfterSeconds)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			req, d := fullDecision()
			tc.change(req, d)
			b, fx := encodeOne(t, tc.k, req, d, "proxy")
			if fx != tc.want {
				t.Errorf("corrections %b, want %b", fx, tc.want)
			}
			ev := &tollgatev1.DecisionEvent{}
			if err := proto.Unmarshal(b, ev); err != nil { // strings must be valid UTF-8
				t.Fatal(err)
			}
			if ev.Cost < 0 || ev.Cost > tollgatev1.MaxCost || ev.RetryAfterSeconds < 0 || ev.RetryAfterSeconds > tollgatev1.MaxRetryAfterSeconds {
				t.Errorf("cost %d, retry after %d", ev.Cost, ev.RetryAfterSeconds)
			}
			if tc.check != nil {
				tc.check(t, ev)
			}
		})
	}
	// A tenant beyond its bound: the record key is the cut tenant Record
	// chooses the partition by.
	_, d := fullDecision()
	d.Tenant = long(1000)
	b, _ := encodeOne(t, kindDecision, nil, d, "proxy")
	if key := tollgatev1.DecisionTenant(b); string(key) != tollgatev1.FieldTenant.Cut(d.Tenant) || len(key) > tollgatev1.MaxNameLen {
		t.Errorf("record key of %d bytes, not the cut tenant", len(key))
	}
}
