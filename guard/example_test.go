package guard_test

import (
	"context"
	"fmt"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/memstore"
	"github.com/tollgate/tollgate/guard/rules"
)

// A service limits its callers to 3 requests, refilling 3 a minute. In
// production the store is redisstore.New(client) and time comes from Redis;
// here an in-memory store with a fixed clock makes the output exact.
func Example() {
	rs, err := rules.Load([]byte(`
rules:
  - id: per-key
    match: {}
    algorithm: token_bucket
    capacity: 3
    rate: 3/1m
`))
	if err != nil {
		panic(err)
	}
	clock := func() int64 { return 1_763_000_000_000_000 } // Unix µs
	store := memstore.New(memstore.WithClock(clock))
	g, err := guard.New(store, []byte("key-secret-0123456789"), rs, guard.WithClock(clock))
	if err != nil {
		panic(err)
	}
	req := &guard.Request{Key: "sk_live_abc123", Path: "/v1/search", Method: "GET"}
	for range 4 {
		d, err := g.Check(context.Background(), req)
		if err != nil {
			panic(err)
		}
		r := d.DecidingRule()
		fmt.Printf("status=%d remaining=%d retry-after=%d\n", d.Status, r.Remaining, d.RetryAfter)
	}
	// Output:
	// status=200 remaining=2 retry-after=0
	// status=200 remaining=1 retry-after=0
	// status=200 remaining=0 retry-after=0
	// status=429 remaining=0 retry-after=20
}
