// Package guardtest holds what tests of the guard and its stores share:
// a store decorator that drives the decision time from a test's clock, so
// that Redis and the reference model (memstore) decide at the same
// explicit times, and Redis clients built as the gateway builds them.
package guardtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/redisstore"
)

// Client returns a client of the redis-server at addr (a test starts one
// with redistest.StartTB) built as the gateway builds it, with a 2s
// timeout, closed by tb.Cleanup.
func Client(tb testing.TB, addr string) redis.UniversalClient {
	tb.Helper()
	return RedisClient(tb, redisstore.Config{Addrs: []string{addr}, Timeout: 2 * time.Second})
}

// RedisClient builds a client of cfg as the gateway builds it
// (redisstore.NewClient), closed by tb.Cleanup. Any error fails the test
// at once.
func RedisClient(tb testing.TB, cfg redisstore.Config) redis.UniversalClient {
	tb.Helper()
	c, err := redisstore.NewClient(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// Clocked returns s deciding at clock's time (Unix µs) whenever the caller
// leaves the time to the store (now == 0): Redis then uses that time
// instead of TIME. Only tests do this; gateways with skewed clocks would
// disagree. The result forwards guard.Namer to s.
func Clocked(s guard.Store, clock func() int64) guard.Store {
	c := &clocked{s: s, clock: clock}
	if n, ok := s.(guard.Namer); ok {
		return &clockedNamer{clocked: c, n: n}
	}
	return c
}

type clocked struct {
	s     guard.Store
	clock func() int64
}

func (c *clocked) Do(ctx context.Context, op guard.Op, now int64, counters []guard.Counter, res []guard.CounterResult) (int64, error) {
	if now == 0 {
		now = c.clock()
	}
	return c.s.Do(ctx, op, now, counters, res)
}

type clockedNamer struct {
	*clocked
	n guard.Namer
}

func (c *clockedNamer) CounterName(id *guard.CounterID) string { return c.n.CounterName(id) }

// TagOn returns a hash tag, prefix and a number, whose slot (that of
// "{tag}", and so of every key holding {tag}) is on node by nodeOf: a
// test Cluster's NodeOf, which says which primary serves a slot
// (StartCluster assigns the slots in order, a third each on a 3-primary
// Cluster).
func TagOn(tb testing.TB, nodeOf func(slot int) int, prefix string, node int) string {
	tb.Helper()
	for i := range 10_000 {
		tag := fmt.Sprintf("%s%d", prefix, i)
		if nodeOf(redisstore.Slot("{"+tag+"}")) == node {
			return tag
		}
	}
	tb.Fatalf("guardtest: no hash tag %s… on node %d", prefix, node)
	return ""
}

// FullRefill returns the rules.Params FullNum and FullDen of a bucket of
// limit units that refills n units per window µs: the time an empty one
// takes to fill, limit×window/n µs, as a fraction in lowest terms (as
// rules.Compile writes it).
func FullRefill(limit, window, n int64) (num, den int64) {
	num, den = limit*window, n
	g, r := num, den
	for r != 0 {
		g, r = r, g%r
	}
	return num / g, den / g
}
