package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/tollgate/tollgate/compose/redisserver"
	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/breaker"
	"github.com/tollgate/tollgate/guard/internal/guardtest"
	"github.com/tollgate/tollgate/guard/memstore"
	"github.com/tollgate/tollgate/guard/redisstore"
	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/internal/testwait"
)

const clusterRules = `
keys:
  a1: {tenant: acme}
  a2: {tenant: acme}
  b1: {tenant: beta}
rules:
  - id: key
    match: {}
    algorithm: token_bucket
    capacity: 6
    rate: 6/2s
  - id: tenant
    scope: tenant
    match: {}
    algorithm: sliding_window_counter
    limit: 9
    window: 2s
    precision: 4
  - id: ip
    scope: ip
    match: {}
    algorithm: fixed_window
    limit: 8
    window: 1s
  - id: global
    scope: global
    match: {}
    algorithm: sliding_window_log
    limit: 20
    window: 1s
`

// TestCluster runs the store on a real 3-primary Redis Cluster, one
// cluster for its subtests.
func TestCluster(t *testing.T) {
	cl := redistest.StartClusterTB(t, 3)
	client := guardtest.RedisClient(t, redisstore.Config{Mode: redisstore.ModeCluster, Addrs: cl.Addrs(), Timeout: 2 * time.Second})
	store := redisstore.New(client, redisstore.WithTimeout(2*time.Second), redisstore.WithTTLMargin(time.Hour))
	t.Cleanup(func() { store.Close() })
	if err := store.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Run("model", func(t *testing.T) { testClusterModel(t, store) })
	t.Run("return when another slot rejects", func(t *testing.T) { testClusterReturn(t, store) })
}

// testClusterModel runs multi-rule checks on the Cluster: the key and
// tenant counters share the tenant's slot and are decided in one call; IP
// and global counters live in slots of their own and are decided first,
// refunded when a later slot rejects. Driven with one explicit clock, the
// cluster must decide exactly as the single-call reference model, checks
// and peeks (a rejected peek's figures are before its cost in every slot).
func testClusterModel(t *testing.T, store *redisstore.Store) {
	ctx := context.Background()
	rs, err := rules.Load([]byte(clusterRules))
	if err != nil {
		t.Fatal(err)
	}
	var now int64 = 1_763_000_000_000_000
	clock := func() int64 { return now }
	gr, _ := guard.New(guardtest.Clocked(store, clock), []byte("test-secret-0123456789"), rs, guard.WithClock(clock))
	gm, _ := guard.New(memstore.New(memstore.WithClock(clock)), []byte("test-secret-0123456789"), rs, guard.WithClock(clock))

	// The counters really are spread over several slots and nodes.
	slots := map[int]bool{}
	for _, r := range rs.Rules() {
		for _, name := range []string{"tg{acme}" + r.Tag, "tg{ip:10.0.0.1}" + r.Tag, "tg{g:" + r.Tag + "}" + r.Tag} {
			slots[redisstore.Slot(name)] = true
		}
	}
	if len(slots) < 3 {
		t.Fatalf("test counters in %d slots", len(slots))
	}

	rng := rand.New(rand.NewPCG(3, 3))
	keys := []string{"a1", "a2", "b1", "solo"}
	ips := []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")}
	calls := store.Calls()
	statuses := map[int]int{}
	for step := 0; step < 1200; step++ {
		now += rng.Int64N(60_000)
		req := &guard.Request{Key: keys[rng.IntN(len(keys))], IP: ips[rng.IntN(len(ips))], Path: "/", Cost: 1 + rng.Int64N(2)}
		if step%3 == 0 {
			pr, err := gr.Peek(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			pm, _ := gm.Peek(ctx, req)
			if !reflect.DeepEqual(pr, pm) {
				t.Fatalf("peek step %d: %+v\ncluster %+v\nmodel   %+v", step, req, pr, pm)
			}
		}
		dr, err := gr.Check(ctx, req)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		dm, _ := gm.Check(ctx, req)
		if !reflect.DeepEqual(dr, dm) {
			t.Fatalf("step %d: %+v\ncluster %+v\nmodel   %+v", step, req, dr, dm)
		}
		statuses[dr.Status]++
	}
	if statuses[200] < 200 || statuses[429] < 200 {
		t.Fatalf("sequence too one-sided: %v", statuses)
	}
	t.Log(fmt.Sprintf("statuses %v, %.2f script calls per decision (1200 checks, 400 peeks)", statuses, float64(store.Calls()-calls)/1600))
}

// testClusterReturn: a check gives back the lease units it returns
// (Counter.Return) whatever it decides, also when a slot decided before the
// counter's own rejects it and the own slot is only read. A key counter
// leases 10 units; the next check returns them while the global counter
// (another slot, decided first) rejects: the key counter must count the
// one unit admitted, not 11.
func testClusterReturn(t *testing.T, store *redisstore.Store) {
	ctx := context.Background()
	const now = 1_763_000_000_000_000
	hour := rules.Params{Limit: 100, Window: 3_600_000_000}
	key := guard.Counter{Name: "tr{acme}k", Algorithm: rules.FixedWindow, Params: hour, Cost: 1}
	global := guard.Counter{Name: "tr{g:x}x", Algorithm: rules.FixedWindow, Params: rules.Params{Limit: 1, Window: 3_600_000_000}, Cost: 1}
	if redisstore.Slot(key.Name) == redisstore.Slot(global.Name) {
		t.Fatal("the test's counters share a slot")
	}
	res := make([]guard.CounterResult, 2)
	leased := key
	leased.Lease = 10
	if _, err := store.Do(ctx, guard.OpCheck, now, []guard.Counter{leased, global}, res); err != nil {
		t.Fatal(err)
	}
	if !res[0].Allowed || !res[0].Charged || res[0].Leased != 10 || !res[1].Allowed {
		t.Fatalf("first check: %+v", res)
	}
	returning := key
	returning.Token, returning.Return = res[0].Token, 10
	if _, err := store.Do(ctx, guard.OpCheck, now, []guard.Counter{returning, global}, res); err != nil {
		t.Fatal(err)
	}
	if res[0].Charged || res[1].Allowed {
		t.Fatalf("second check: want the global counter to reject it, got %+v", res)
	}
	one := make([]guard.CounterResult, 1)
	if _, err := store.Do(ctx, guard.OpState, now, []guard.Counter{key}, one); err != nil {
		t.Fatal(err)
	}
	if one[0].Remaining != 99 {
		t.Fatalf("the key counter has %d units left, want 99: the lease's 10 units were not given back", one[0].Remaining)
	}
}

// onNode returns a counter name with hash tag prefix+N whose slot the
// cluster's node-th primary serves.
func onNode(t *testing.T, cl *redisserver.Cluster, prefix string, node int) string {
	t.Helper()
	return "sd{" + guardtest.TagOn(t, cl.NodeOf, prefix, node) + "}c"
}

// TestClusterShardDownChargesNothingElsewhere: with one primary down, a
// check whose own slot is there fails (the guard decides it degraded), and
// what the slots decided before it charged is taken back — the request's
// cost and the lease units granted with it — so the requests of the dead
// shard's keys do not drain the global and ip counters every other key
// shares (degraded decisions are not charged). Once the dead
// primary's breaker is open such a check fails before any call. A check
// that fails before reaching its own slot gives back the lease units its
// counters there return, and says so (Returned), so they are not dropped.
func TestClusterShardDownChargesNothingElsewhere(t *testing.T) {
	t.Parallel()
	cl := redistest.StartClusterTB(t, 3)
	newStore := func(cfg breaker.Config) *redisstore.Store {
		client := guardtest.RedisClient(t, redisstore.Config{Mode: redisstore.ModeCluster, Addrs: cl.Addrs(), Timeout: time.Second})
		s := redisstore.New(client, redisstore.WithTimeout(time.Second), redisstore.WithTTLMargin(time.Hour), redisstore.WithBreaker(cfg))
		t.Cleanup(func() { s.Close() })
		if err := s.Load(context.Background()); err != nil {
			t.Fatal(err)
		}
		return s
	}
	// One store whose breakers never open (every failure is a failed
	// call), one with the default breakers.
	failing := newStore(breaker.Config{MinRequests: 1 << 30, ConsecutiveFailures: 1 << 30})
	breaking := newStore(breaker.Config{})
	ctx := context.Background()
	const now = 1_763_000_000_000_000
	hour := rules.Params{Limit: 100, Window: 3_600_000_000}
	counter := func(name string) guard.Counter {
		return guard.Counter{Name: name, Algorithm: rules.FixedWindow, Params: hour, Cost: 1}
	}
	deadKey := counter(onNode(t, cl, "dead", 2))
	deadIP := counter(onNode(t, cl, "ip:dead", 2))
	global := counter(onNode(t, cl, "g:live", 0))
	liveKey := counter(onNode(t, cl, "live", 1))
	used := func(c guard.Counter) int64 {
		t.Helper()
		one := make([]guard.CounterResult, 1)
		if _, err := failing.Do(ctx, guard.OpState, now, []guard.Counter{c}, one); err != nil {
			t.Fatal(err)
		}
		return hour.Limit - one[0].Remaining
	}
	// A lease on liveKey, to be returned by a check that fails.
	res := make([]guard.CounterResult, 3)
	leased := liveKey
	leased.Lease = 10
	if _, err := failing.Do(ctx, guard.OpCheck, now, []guard.Counter{leased}, res[:1]); err != nil || res[0].Leased != 10 {
		t.Fatalf("lease: %v %+v", err, res[0])
	}
	token := res[0].Token
	if err := cl.Nodes()[2].Kill(); err != nil {
		t.Fatal(err)
	}

	leasedGlobal := global
	leasedGlobal.Lease = 5
	for i := range 10 {
		if _, err := failing.Do(ctx, guard.OpCheck, now, []guard.Counter{leasedGlobal, deadKey}, res[:2]); err == nil {
			t.Fatalf("check %d with its own slot on the dead primary: no error", i)
		}
	}
	if got := used(global); got != 0 {
		t.Errorf("the global counter counts %d units after 10 checks that failed on the dead shard, want 0", got)
	}

	returning := liveKey
	returning.Token, returning.Return = token, 10
	clear(res)
	if _, err := failing.Do(ctx, guard.OpCheck, now, []guard.Counter{deadIP, global, returning}, res); err == nil {
		t.Fatal("check with an ip counter on the dead primary: no error")
	}
	if !res[2].Returned {
		t.Errorf("the lease return of a slot never reached is not marked Returned: %+v", res[2])
	}
	if got := used(liveKey); got != 1 {
		t.Errorf("the live key counts %d units, want 1: its lease's 10 units were not given back", got)
	}
	if got := used(global); got != 0 {
		t.Errorf("the global counter counts %d units, want 0", got)
	}

	// The default breaker opens; from then on such a check makes no call.
	testwait.Eventually(t, 5*time.Second, func() error {
		_, err := breaking.Do(ctx, guard.OpCheck, now, []guard.Counter{global, deadKey}, res[:2])
		if !errors.Is(err, redisstore.ErrBreakerOpen) {
			return fmt.Errorf("check: %v, want the open breaker's error", err)
		}
		return nil
	})
	calls := breaking.Calls()
	for range 20 {
		if _, err := breaking.Do(ctx, guard.OpCheck, now, []guard.Counter{global, deadKey}, res[:2]); !errors.Is(err, redisstore.ErrBreakerOpen) {
			t.Fatalf("check with the breaker open: %v", err)
		}
	}
	if n := breaking.Calls() - calls; n != 0 {
		t.Errorf("%d Redis calls for 20 checks failed by an open breaker, want 0", n)
	}
	if got := used(global); got != 0 {
		t.Errorf("the global counter counts %d units, want 0", got)
	}
}
