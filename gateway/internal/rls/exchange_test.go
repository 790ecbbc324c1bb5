package rls_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/tollgate/tollgate/gateway/internal/rls"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/memstore"
)

// TestExchangeAnswersAsShouldRateLimit: a call decided through a pooled
// Exchange gets the bytes ShouldRateLimit's response encodes to, call
// after call, whatever the shape of the call before it (the pooled
// request, its descriptor and entries, and the response are reused):
// two servers with stores of their own and one fixed clock decide the
// same calls, twice over.
func TestExchangeAnswersAsShouldRateLimit(t *testing.T) {
	t.Parallel()
	const src = `
rules:
  - {id: per-key, match: {domain: d, anonymous: false}, algorithm: fixed_window, limit: 3, window: 1h}
  - {id: per-ip, scope: ip, match: {domain: d, anonymous: true}, algorithm: token_bucket, capacity: 5, rate: 5/1m}
  - {id: generic, match: {domain: g}, algorithm: sliding_window_counter, limit: 2, window: 1m}
`
	const now = 1_800_000_000_000_000
	clock := func() int64 { return now }
	server := func() *rls.Server {
		return rls.New(newGuard(t, memstore.New(memstore.WithClock(clock)), src, guard.WithClock(clock)))
	}
	viaCall, viaExchange := server(), server()

	encode := func(r *rlsv3.RateLimitRequest) []byte {
		b, err := proto.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// A request with a field this package does not read by hand: decoded
	// by protobuf-go, its unknown field kept.
	unknown := protowire.AppendVarint(protowire.AppendTag(encode(request("d", desc("api_key", "sk_exchange_u"))), 99, protowire.VarintType), 1)
	msgs := [][]byte{
		encode(request("d", desc("api_key", "sk_exchange_a", "path", "/v1/items", "method", "GET", "extra", "x"))),
		encode(request("d", desc("api_key", "sk_exchange_b"))),
		encode(request("d", desc("remote_address", "10.1.2.3", "path"))),
		encode(request("d", hits(desc("api_key", "sk_exchange_a"), 2))),
		encode(request("d", desc("api_key", "sk_exchange_a"))),
		encode(request("d", desc("api_key", "sk_exchange_c", "path", "/v1/x"), desc("remote_address", "10.1.2.4"))),
		encode(request("d", desc("api_key", strings.Repeat("k", 300)))),
		encode(&rlsv3.RateLimitRequest{Domain: "g", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("key", "generic-1")}, HitsAddend: 2}),
		encode(request("g", desc("key", "generic-1"))),
		encode(request("", desc("api_key", "sk_exchange_a"))),
		unknown,
		{0xff, 0xff},
	}
	for pass := range 2 {
		for i, msg := range msgs {
			var want, got []byte
			var wantErr, gotErr error
			if req, err := rls.DecodeRequest(msg); err != nil {
				wantErr = err
			} else if resp, err := viaCall.ShouldRateLimit(context.Background(), req); err != nil {
				wantErr = err
			} else if want, err = rls.AppendResponse(nil, resp); err != nil {
				t.Fatal(err)
			}
			if x, err := rls.DecodeExchange(msg); err != nil {
				gotErr = err
			} else {
				resp, err := viaExchange.Decide(context.Background(), x)
				if err != nil {
					gotErr = err
				} else if got, err = rls.AppendResponse(nil, resp); err != nil {
					t.Fatal(err)
				}
				x.Release()
			}
			if (wantErr == nil) != (gotErr == nil) || wantErr != nil && wantErr.Error() != gotErr.Error() {
				t.Errorf("pass %d, call %d: error %v, want %v", pass, i, gotErr, wantErr)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("pass %d, call %d: response\n%x\nwant\n%x", pass, i, got, want)
			}
		}
	}
}
