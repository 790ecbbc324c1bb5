package rls

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"reflect"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/memstore"
	"github.com/tollgate/tollgate/guard/rules"
)

var defaultLimits = limits{descriptors: DefaultMaxDescriptors, entries: DefaultMaxEntries, valueLen: DefaultMaxValueLen}

func entries(kv ...string) []*ratelimitv3.RateLimitDescriptor_Entry {
	var es []*ratelimitv3.RateLimitDescriptor_Entry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return es
}

func TestConvert(t *testing.T) {
	t.Parallel()
	type want struct {
		req  guard.Request
		peek bool
	}
	for _, tt := range []struct {
		name    string
		d       *ratelimitv3.RateLimitDescriptor
		reqHits uint32
		want    want
	}{
		{
			name: "every field",
			d:    &ratelimitv3.RateLimitDescriptor{Entries: entries("api_key", "sk_1", "tenant", "acme", "remote_address", "2001:db8::1", "path", "/v1/x?q=1", "method", "POST", "plan", "gold")},
			want: want{req: guard.Request{Key: "sk_1", Tenant: "acme", IP: netip.MustParseAddr("2001:db8::1"), Path: "/v1/x?q=1", Method: "POST", Cost: 1}},
		},
		{
			name: "generic_key and endpoint",
			d:    &ratelimitv3.RateLimitDescriptor{Entries: entries("generic_key", "slowpath", "endpoint", "/v1/e")},
			want: want{req: guard.Request{Key: "slowpath", Path: "/v1/e", Cost: 1}},
		},
		{
			name: "api_key and path win",
			d:    &ratelimitv3.RateLimitDescriptor{Entries: entries("generic_key", "g", "api_key", "k", "endpoint", "/e", "path", "/p")},
			want: want{req: guard.Request{Key: "k", Path: "/p", Cost: 1}},
		},
		{
			name:    "request hits_addend",
			d:       &ratelimitv3.RateLimitDescriptor{Entries: entries("api_key", "k")},
			reqHits: 7,
			want:    want{req: guard.Request{Key: "k", Cost: 7}},
		},
		{
			name:    "descriptor hits_addend wins",
			d:       &ratelimitv3.RateLimitDescriptor{Entries: entries("api_key", "k"), HitsAddend: wrapperspb.UInt64(2)},
			reqHits: 7,
			want:    want{req: guard.Request{Key: "k", Cost: 2}},
		},
		{
			name:    "present 0 is a peek",
			d:       &ratelimitv3.RateLimitDescriptor{Entries: entries("api_key", "k"), HitsAddend: wrapperspb.UInt64(0)},
			reqHits: 7,
			want:    want{req: guard.Request{Key: "k"}, peek: true},
		},
		{
			name: "huge hits_addend saturates",
			d:    &ratelimitv3.RateLimitDescriptor{Entries: entries("api_key", "k"), HitsAddend: wrapperspb.UInt64(1 << 63)},
			want: want{req: guard.Request{Key: "k", Cost: 1<<63 - 1}},
		},
		{
			name: "limit ignored, equal repeat fine",
			d: &ratelimitv3.RateLimitDescriptor{Entries: entries("api_key", "k", "api_key", "k"),
				Limit: &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1}},
			want: want{req: guard.Request{Key: "k", Cost: 1}},
		},
		{
			name: "empty value: anonymous",
			d:    &ratelimitv3.RateLimitDescriptor{Entries: entries("api_key", "", "remote_address", "10.1.2.3")},
			want: want{req: guard.Request{IP: netip.MustParseAddr("10.1.2.3"), Cost: 1}},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			reqs, peek, err := convertCall(defaultLimits, &rlsv3.RateLimitRequest{Domain: "dom", Descriptors: []*ratelimitv3.RateLimitDescriptor{tt.d}, HitsAddend: tt.reqHits})
			if err != nil {
				t.Fatal(err)
			}
			w := tt.want.req
			w.Domain, w.Surface = "dom", "rls"
			w.Descriptor = map[string]string{}
			for _, e := range tt.d.Entries {
				w.Descriptor[e.Key] = e.Value
			}
			if !reflect.DeepEqual(reqs[0], w) || peek[0] != tt.want.peek {
				t.Errorf("got %+v peek=%v\nwant %+v peek=%v", reqs[0], peek[0], w, tt.want.peek)
			}
		})
	}
}

const fuzzRules = `
blocklist: ["sk_revoked_*"]
allowlist: ["sk_internal_*"]
routes: ["/v1/users/{id}"]
rules:
  - {id: per-key, match: {}, algorithm: token_bucket, capacity: 3, rate: 3/1m}
  - {id: gold, match: {descriptor: {plan: gold}}, algorithm: sliding_window_log, limit: 2, window: 1s}
  - {id: edge, match: {domain: edge}, algorithm: gcra, limit: 10, window: 1m, burst: 2}
  - {id: ip, scope: ip, match: {anonymous: true}, algorithm: fixed_window, limit: 2, window: 1s}
  - {id: block, match: {descriptor: {block: "yes"}}, block: true}
`

// FuzzDescriptor feeds arbitrary entries (data split at NUL bytes into
// key, value, key, value…), domains and hits_addend values to the
// conversion and to a whole call on an in-memory guard: nothing panics, a
// refused call is InvalidArgument, an accepted one maps its entries as
// documented and gets one status.
func FuzzDescriptor(f *testing.F) {
	f.Add("tollgate", []byte("api_key\x00sk_1\x00path\x00/v1/users/3\x00method\x00GET"), false, uint64(0), uint32(0))
	f.Add("edge", []byte("generic_key\x00g\x00plan\x00gold\x00remote_address\x00::1"), true, uint64(0), uint32(3))
	f.Add("edge", []byte("remote_address\x0010.0.0.1\x00endpoint\x00/x"), true, uint64(2), uint32(0))
	f.Add("d", []byte("api_key\x00sk_revoked_9\x00block\x00yes"), false, uint64(0), uint32(0))
	f.Add("d", []byte("api_key\x00sk_internal_1\x00api_key\x00other"), true, uint64(1<<63), uint32(1<<31))
	f.Add("", []byte("\x00\x00"), false, uint64(0), uint32(0))
	f.Add("d", []byte("remote_address\x00fe80::1%eth0\x00api_key\x00k\xff"), false, uint64(0), uint32(0))

	rs, err := rules.Load([]byte(fuzzRules))
	if err != nil {
		f.Fatal(err)
	}
	g, err := guard.New(memstore.New(), []byte("fuzz-secret-0123456789"), rs)
	if err != nil {
		f.Fatal(err)
	}
	s := New(g, WithMaxValueLen(64), WithMaxEntries(8))

	f.Fuzz(func(t *testing.T, domain string, data []byte, hasHits bool, hits uint64, reqHits uint32) {
		parts := bytes.Split(data, []byte{0})
		d := &ratelimitv3.RateLimitDescriptor{}
		for i := 0; i+1 < len(parts); i += 2 {
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: string(parts[i]), Value: string(parts[i+1])})
		}
		if hasHits {
			d.HitsAddend = wrapperspb.UInt64(hits)
		}
		req := &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{d}, HitsAddend: reqHits}

		reqs, peek, err := convertCall(s.limits, req)
		if err != nil {
			var inv *invalidError
			if !errors.As(err, &inv) {
				t.Fatalf("error %v is not an invalid call", err)
			}
		} else {
			r := reqs[0]
			if r.Domain != domain || len(r.Descriptor) == 0 {
				t.Fatalf("request %+v", r)
			}
			for _, e := range d.Entries {
				if r.Descriptor[e.Key] != e.Value {
					t.Fatalf("entry %q: descriptor has %q, want %q", e.Key, r.Descriptor[e.Key], e.Value)
				}
			}
			key, ok := r.Descriptor["api_key"]
			if !ok {
				key = r.Descriptor["generic_key"]
			}
			if r.Key != key {
				t.Fatalf("key %q, want %q", r.Key, key)
			}
			if peek[0] != (hasHits && hits == 0) || (!peek[0] && r.Cost < 1) {
				t.Fatalf("peek %v cost %d for hits %v/%d, request hits %d", peek[0], r.Cost, hasHits, hits, reqHits)
			}
		}

		resp, rerr := s.ShouldRateLimit(context.Background(), req)
		switch {
		case err != nil:
			if status.Code(rerr) != codes.InvalidArgument {
				t.Fatalf("invalid call answered %v, %v", resp, rerr)
			}
		case rerr != nil:
			t.Fatalf("valid call: %v", rerr)
		case len(resp.Statuses) != 1 || resp.OverallCode == rlsv3.RateLimitResponse_UNKNOWN:
			t.Fatalf("response %v", resp)
		}
	})
}

// convertCall converts req in a call of its own.
func convertCall(l limits, req *rlsv3.RateLimitRequest) ([]guard.Request, []bool, error) {
	c := new(call)
	err := l.convert(req, c)
	return c.reqs, c.peek, err
}
