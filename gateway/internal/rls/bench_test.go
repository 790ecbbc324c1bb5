package rls_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tollgate/tollgate/gateway/internal/rls"
	"google.golang.org/protobuf/proto"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/lease"
	"github.com/tollgate/tollgate/guard/memstore"
	"github.com/tollgate/tollgate/guard/rules"
)

// BenchmarkShouldRateLimit measures the service's own cost, without gRPC
// and Redis: calls of two descriptors (a key, a client IP) over 1,000 keys,
// decided by an in-memory store with limits no run exhausts. Every answer
// must be OK, or the benchmark measured rejections.
func BenchmarkShouldRateLimit(b *testing.B) {
	rs, err := rules.Load([]byte(`
rules:
  - {id: per-key, match: {anonymous: false}, algorithm: token_bucket, capacity: 1000000000, rate: 1000000000/1h}
  - {id: per-ip, scope: ip, match: {anonymous: true}, algorithm: gcra, limit: 1000000000, window: 1h, burst: 1000000000}
`))
	if err != nil {
		b.Fatal(err)
	}
	g, err := guard.New(memstore.New(), []byte("bench-secret-0123456789"), rs)
	if err != nil {
		b.Fatal(err)
	}
	s := rls.New(g)
	reqs := make([]*rlsv3.RateLimitRequest, 1000)
	for i := range reqs {
		reqs[i] = request("tollgate",
			desc("api_key", fmt.Sprintf("sk_bench_%04d", i), "path", "/v1/items", "method", "GET"),
			desc("remote_address", fmt.Sprintf("10.0.%d.%d", i/256, i%256)),
		)
	}
	var next, notOK atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := s.ShouldRateLimit(context.Background(), reqs[next.Add(1)%int64(len(reqs))])
			if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
				notOK.Add(1)
			}
		}
	})
	if n := notOK.Load(); n > 0 {
		b.Fatalf("%d answers were not OK", n)
	}
}

// BenchmarkLeasedCall measures what the gateway's RLS listener does for a
// call its fast path answers, one call at a time: decode the request
// message, decide it under guard.LocalOnly from the counter's lease (the
// in-memory store behind the lease store, so that nothing is waited for),
// encode the response. The request is the one the side-by-side load sends
// (api_key, path), over 1,000 keys each holding a lease.
func BenchmarkLeasedCall(b *testing.B) {
	rs, err := rules.Load([]byte("rules:\n  - {id: under, match: {domain: under}, algorithm: fixed_window, limit: 1000000000000, window: 1h}\n"))
	if err != nil {
		b.Fatal(err)
	}
	ls := lease.New(memstore.New())
	b.Cleanup(func() { ls.Close() })
	g, err := guard.New(ls, []byte("bench-secret-0123456789"), rs)
	if err != nil {
		b.Fatal(err)
	}
	s := rls.New(g)
	msgs := make([][]byte, 1000)
	for i := range msgs {
		msgs[i], err = proto.Marshal(request("under", desc("api_key", fmt.Sprintf("sk_bench_%04d", i), "path", "/v1/items")))
		if err != nil {
			b.Fatal(err)
		}
	}
	local := guard.LocalOnly(context.Background())
	var out []byte
	call := func(ctx context.Context, msg []byte) error {
		x, err := rls.DecodeExchange(msg)
		if err != nil {
			return err
		}
		defer x.Release()
		resp, err := s.Decide(ctx, x)
		if err != nil {
			return err
		}
		if resp.OverallCode != rlsv3.RateLimitResponse_OK {
			return fmt.Errorf("answer %v", resp.OverallCode)
		}
		out, err = rls.AppendResponse(out[:0], resp)
		return err
	}
	// Until every key is answered from its lease.
	for round := 0; ; round++ {
		blocked := 0
		for _, m := range msgs {
			if err := call(local, m); errors.Is(err, guard.ErrWouldBlock) {
				blocked++
				if err := call(context.Background(), m); err != nil {
					b.Fatal(err)
				}
			} else if err != nil {
				b.Fatal(err)
			}
		}
		if blocked == 0 {
			break
		}
		if round == 50 {
			b.Fatalf("after %d rounds, %d of %d keys still need the store", round, blocked, len(msgs))
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		if err := call(local, msgs[i%len(msgs)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
