package rls_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tollgate/tollgate/gateway/internal/rls"
	"github.com/tollgate/tollgate/guard"
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
