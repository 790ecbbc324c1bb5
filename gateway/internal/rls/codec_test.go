package rls

import (
	"math/rand/v2"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

var codecStrings = []string{"", "api_key", "sk_live_1", "/v1/items", "tenant", "日本", "a\x00b", "remote_address", "10.0.0.1"}

func randomRequest(rng *rand.Rand) *rlsv3.RateLimitRequest {
	r := &rlsv3.RateLimitRequest{Domain: codecStrings[rng.IntN(len(codecStrings))], HitsAddend: uint32(rng.IntN(3))}
	for range rng.IntN(4) {
		d := &ratelimitv3.RateLimitDescriptor{IsNegativeHits: rng.IntN(8) == 0}
		for range rng.IntN(7) {
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{
				Key: codecStrings[rng.IntN(len(codecStrings))], Value: codecStrings[rng.IntN(len(codecStrings))],
			})
		}
		if rng.IntN(3) == 0 {
			d.HitsAddend = wrapperspb.UInt64(uint64(rng.IntN(3)))
		}
		if rng.IntN(10) == 0 {
			d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5}
		}
		r.Descriptors = append(r.Descriptors, d)
	}
	return r
}

// decode reads b with c, as gRPC would.
func decode(t testing.TB, c codec, b []byte) (*rlsv3.RateLimitRequest, error) {
	r := new(rlsv3.RateLimitRequest)
	err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, r)
	return r, err
}

// TestCodecRequests: every request protobuf-go writes reads back through
// the codec as protobuf-go reads it (or fails alike: invalid UTF-8).
func TestCodecRequests(t *testing.T) {
	t.Parallel()
	c := Codec().(codec)
	rng := rand.New(rand.NewPCG(1, 2))
	fast := 0
	for i := range 20000 {
		want := randomRequest(rng)
		b, err := proto.MarshalOptions{AllowPartial: true}.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		var ref rlsv3.RateLimitRequest
		refErr := proto.Unmarshal(b, &ref)
		got, err := decode(t, c, b)
		if (err == nil) != (refErr == nil) {
			t.Fatalf("request %d: error %v, protobuf-go %v", i, err, refErr)
		}
		if err == nil && !proto.Equal(got, &ref) {
			t.Fatalf("request %d:\n got %v\nwant %v", i, got, &ref)
		}
		if parseRequest(b, new(rlsv3.RateLimitRequest), nil) {
			fast++
		}
	}
	if fast < 10000 {
		t.Fatalf("only %d of 20000 requests read by hand", fast)
	}
	// Invalid UTF-8 in a string field: refused as protobuf-go refuses it.
	bad := protowire.AppendTag(nil, 1, protowire.BytesType)
	bad = protowire.AppendString(bad, "k\xff")
	if _, err := decode(t, c, bad); err == nil {
		t.Fatal("a domain of invalid UTF-8 was accepted")
	}
}

// FuzzCodecRequest: whatever bytes the hand reader accepts, it reads as
// protobuf-go does.
func FuzzCodecRequest(f *testing.F) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 20 {
		b, _ := proto.Marshal(randomRequest(rng))
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var got rlsv3.RateLimitRequest
		if !parseRequest(b, &got, nil) {
			return
		}
		var want rlsv3.RateLimitRequest
		if err := proto.Unmarshal(b, &want); err != nil {
			t.Fatalf("%x: read by hand, protobuf-go refuses it: %v", b, err)
		}
		if !proto.Equal(&got, &want) {
			t.Fatalf("%x:\n got %v\nwant %v", b, &got, &want)
		}
	})
}

// TestCodecResponses: the codec writes answers byte for byte as
// protobuf-go does.
func TestCodecResponses(t *testing.T) {
	t.Parallel()
	c := Codec().(codec)
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range 20000 {
		r := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_Code(rng.IntN(3))}
		for range rng.IntN(3) {
			st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_Code(rng.IntN(3)), LimitRemaining: uint32(rng.IntN(3)) * rng.Uint32()}
			if rng.IntN(4) > 0 {
				st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{Name: codecStrings[rng.IntN(4)], RequestsPerUnit: uint32(rng.IntN(3)) * rng.Uint32(), Unit: rlsv3.RateLimitResponse_RateLimit_Unit(rng.IntN(8))}
			}
			if rng.IntN(4) > 0 {
				st.DurationUntilReset = &durationpb.Duration{Seconds: rng.Int64N(3) * rng.Int64N(1e9), Nanos: int32(rng.IntN(3)) * rng.Int32N(1e9)}
			}
			r.Statuses = append(r.Statuses, st)
		}
		for range rng.IntN(9) {
			r.ResponseHeadersToAdd = append(r.ResponseHeadersToAdd, &corev3.HeaderValue{Key: codecStrings[rng.IntN(5)], Value: codecStrings[rng.IntN(5)]})
		}
		if rng.IntN(10) == 0 {
			r.RequestHeadersToAdd = append(r.RequestHeadersToAdd, &corev3.HeaderValue{Key: "x", RawValue: []byte("y")})
		}
		if rng.IntN(20) == 0 {
			r.RawBody = []byte("body")
		}
		want, err := proto.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		bs, err := c.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		got := bs.Materialize()
		bs.Free()
		if string(got) != string(want) {
			t.Fatalf("response %d: %v\n got %x\nwant %x", i, r, got, want)
		}
	}
}
