package lease_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/compose/redisserver"
	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/internal/guardtest"
	"github.com/tollgate/tollgate/guard/lease"
	"github.com/tollgate/tollgate/guard/redisstore"
	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/internal/testwait"
)

// shared is the package's Redis Cluster: started by the first test that
// needs it (about 2–3 s), used by every cluster subtest (each rig with a
// key prefix of its own), stopped by TestMain. One cluster instead of one
// per subtest keeps the package's run time near the standalone one's.
var shared struct {
	once sync.Once
	cl   *redisserver.Cluster
	err  error
}

// sharedCluster returns the shared 3-primary Cluster, starting it on first
// use. A missing redis-server fails the test, as redistest does: a skipped
// Redis test passes CI while testing nothing.
func sharedCluster(t *testing.T) *redisserver.Cluster {
	t.Helper()
	shared.once.Do(func() {
		shared.cl, shared.err = redisserver.StartCluster(context.Background(), 3)
	})
	if shared.err != nil {
		t.Fatalf("start redis cluster: %v", shared.err)
	}
	return shared.cl
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.cl != nil {
		if err := shared.cl.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	os.Exit(code)
}

// consumed returns the units Redis counts as consumed by the counter of
// rule id that req counts against, read without charging through a
// ruleset of that rule alone (rs1; its counter is the same: a rule's tag
// depends on its identity, not on the other rules).
func (r *rig) consumed(t *testing.T, rs, rs1 *rules.Ruleset, req *guard.Request) int64 {
	t.Helper()
	if len(rs1.Rules()) != 1 {
		t.Fatalf("consumed: %d rules, want 1", len(rs1.Rules()))
	}
	one := rs1.Rules()[0]
	for _, r := range rs.Rules() {
		if r.ID == one.ID && r.Tag != one.Tag {
			t.Fatalf("rule %s: tag %s alone, %s in the ruleset", r.ID, one.Tag, r.Tag)
		}
	}
	g, err := guard.New(guardtest.Clocked(r.redis, r.clock.now), secret, rs1, guard.WithClock(r.clock.now))
	if err != nil {
		t.Fatal(err)
	}
	peek := *req
	d, err := g.Peek(context.Background(), &peek)
	if err != nil {
		t.Fatal(err)
	}
	rem := d.Rules[0].Remaining
	if d.Allowed {
		rem++ // a peek's figures are after its cost of 1
	}
	return d.Rules[0].Limit - rem
}

// TestMultiSlotFleet: three gateways, six goroutines each, send requests
// that count against three rules at once — per key (limit 80), per client
// IP (not binding) and one global counter (limit 400) — over six keys of
// skewed popularity, so that some keys reach their own limit while the
// global counter still has room, and then the global counter runs out.
// On Cluster the three counters of a request live in three slots (on
// several primaries): the store decides the IP and global slots first and
// the key's slot last, refunding earlier slots when a later one rejects.
// Whatever the path, each request is atomic: once the gateways give back
// their leases (Close), every counter in Redis counts exactly the units of
// the requests admitted against it, no limit is exceeded, and leases and
// the negative cache answered part of the load.
func TestMultiSlotFleet(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b backend) {
		const keyLimit, ipLimit, globalLimit = 80, 2_000, 400
		c := newClock(start)
		c.step = 3
		r := b.newRig(t, c)
		ruleKey := fmt.Sprintf("{id: per-key, match: {}, algorithm: fixed_window, limit: %d, window: 1h}", keyLimit)
		ruleIP := fmt.Sprintf("{id: per-ip, scope: ip, match: {}, algorithm: fixed_window, limit: %d, window: 1h}", ipLimit)
		ruleGlobal := fmt.Sprintf("{id: all, scope: global, match: {}, algorithm: fixed_window, limit: %d, window: 1h}", globalLimit)
		rs := mustRules(t, "rules:\n  - "+ruleKey+"\n  - "+ruleIP+"\n  - "+ruleGlobal+"\n")
		keys := []string{"sk_m0", "sk_m1", "sk_m2", "sk_m3", "sk_m4", "sk_m5"}
		ips := []netip.Addr{netip.MustParseAddr("10.1.0.1"), netip.MustParseAddr("10.1.0.2")}
		var gws []*gateway
		for i := range 3 {
			gws = append(gws, r.gateway(t, rs, int64(i)*1_000_000, 0))
		}

		var (
			admitted          atomic.Int64
			byKey             [6]atomic.Int64
			byIP              [2]atomic.Int64
			keyRej, globalRej atomic.Int64
			wg                sync.WaitGroup
		)
		for gi, gw := range gws {
			for w := range 6 {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(gi), uint64(w)))
					var d guard.Decision
					for n, rejected := 0, 0; n < 5000 && rejected < 20; n++ {
						// Key k with weight 1/(k+1): the first keys reach
						// their limit before the global counter does.
						k := 0
						for x := rng.Float64() * 2.45; k < len(keys)-1 && x >= 1/float64(k+1); k++ {
							x -= 1 / float64(k+1)
						}
						ip := rng.IntN(len(ips))
						req := &guard.Request{Key: keys[k], IP: ips[ip], Path: "/"}
						if err := gw.guard.CheckInto(context.Background(), req, &d); err != nil {
							t.Error(err)
							return
						}
						if d.Allowed {
							admitted.Add(1)
							byKey[k].Add(1)
							byIP[ip].Add(1)
							continue
						}
						if !d.Rules[0].Allowed {
							keyRej.Add(1)
						}
						if !d.Rules[2].Allowed {
							globalRej.Add(1)
							rejected++
						}
					}
				})
			}
		}
		wg.Wait()
		var st lease.Stats
		calls := 0
		slots, nodes := map[int]bool{}, map[int]bool{}
		for _, gw := range gws {
			s := gw.lease.Stats()
			st.Lease, st.Negative, st.Granted, st.Returned = st.Lease+s.Lease, st.Negative+s.Negative, st.Granted+s.Granted, st.Returned+s.Returned
			calls += gw.calls.count(guard.OpCheck)
			for name := range gw.calls.seen() {
				slots[redisstore.Slot(name)] = true
				nodes[min(redisstore.Slot(name)/(16384/3), 2)] = true
			}
			gw.lease.Close()
		}
		t.Logf("admitted %d (global limit %d), per key %v; rejections by a key's limit %d, by the global limit %d; %d check calls reached Redis; from leases %d, from the negative cache %d; units leased %d; counters in %d slots on %d primaries",
			admitted.Load(), globalLimit, loads(byKey[:]), keyRej.Load(), globalRej.Load(), calls, st.Lease, st.Negative, st.Granted, len(slots), len(nodes))
		if b.cluster && (len(slots) < 3 || len(nodes) < 2) {
			t.Fatalf("the counters are in %d slots on %d primaries: not a multi-slot test", len(slots), len(nodes))
		}
		if admitted.Load() > globalLimit {
			t.Fatalf("the fleet admitted %d, the global limit is %d", admitted.Load(), globalLimit)
		}
		for k := range keys {
			if n := byKey[k].Load(); n > keyLimit {
				t.Fatalf("key %s: admitted %d, its limit is %d", keys[k], n, keyLimit)
			}
		}
		if keyRej.Load() == 0 || globalRej.Load() == 0 || st.Lease == 0 || st.Negative == 0 {
			t.Fatalf("a path was not taken: %d rejections by a key's limit, %d by the global one; %+v", keyRej.Load(), globalRej.Load(), st)
		}

		// Every counter counts exactly what was admitted against it.
		rsKey, rsIP, rsGlobal := mustRules(t, "rules:\n  - "+ruleKey+"\n"), mustRules(t, "rules:\n  - "+ruleIP+"\n"), mustRules(t, "rules:\n  - "+ruleGlobal+"\n")
		if got := r.consumed(t, rs, rsGlobal, &guard.Request{Key: keys[0], IP: ips[0], Path: "/"}); got != admitted.Load() {
			t.Errorf("global counter: Redis counts %d units consumed, %d requests were admitted", got, admitted.Load())
		}
		for k, key := range keys {
			if got := r.consumed(t, rs, rsKey, &guard.Request{Key: key, IP: ips[0], Path: "/"}); got != byKey[k].Load() {
				t.Errorf("key %s: Redis counts %d units consumed, %d requests were admitted", key, got, byKey[k].Load())
			}
		}
		for i, ip := range ips {
			if got := r.consumed(t, rs, rsIP, &guard.Request{Key: keys[0], IP: ip, Path: "/"}); got != byIP[i].Load() {
				t.Errorf("ip %s: Redis counts %d units consumed, %d requests were admitted", ip, got, byIP[i].Load())
			}
		}
	})
}

func loads(xs []atomic.Int64) []int64 {
	out := make([]int64, len(xs))
	for i := range xs {
		out[i] = xs[i].Load()
	}
	return out
}

// TestReturnsWhileAShardIsDown: leases of counters on several primaries
// expire while one primary is down. The background sweep gives back their
// unused units in batches that span slots and primaries; the live
// primaries' counters get theirs back exactly once, and promptly — neither
// again at every sweep while the dead shard's return keeps failing (each
// time would give the same units back again: over-admission), nor only once
// the dead shard is back.
func TestReturnsWhileAShardIsDown(t *testing.T) {
	t.Parallel()
	cl := redistest.StartClusterTB(t, 3)
	c := newClock(start)
	r := clusterRig(t, c, cl)
	// Four keys on the two live primaries, one on the primary to be killed.
	type key struct {
		name string
		node int
	}
	keys := []key{{"sk_d0", 2}, {"sk_l0", 0}, {"sk_l1", 1}, {"sk_l2", 0}, {"sk_l3", 1}}
	src := "keys:\n"
	for i, k := range keys {
		src += fmt.Sprintf("  %s: {tenant: %s}\n", k.name, guardtest.TagOn(t, cl.NodeOf, fmt.Sprintf("t%d_", i), k.node))
	}
	rule := "{id: fw, match: {}, algorithm: fixed_window, limit: 100000, window: 1h}"
	rs := mustRules(t, src+"rules:\n  - "+rule+"\n")
	rs1 := mustRules(t, src+"rules:\n  - "+rule+"\n")
	gw := r.gateway(t, rs, 0, 0, lease.WithWindowTTL(time.Second))
	const admitted = 50
	for range admitted {
		for _, k := range keys {
			d, err := gw.guard.Check(context.Background(), &guard.Request{Key: k.name, Path: "/"})
			if err != nil || !d.Allowed {
				t.Fatalf("check %s: %v %+v", k.name, err, d)
			}
		}
		c.advance(1000)
	}
	for _, k := range keys {
		if got := r.consumed(t, rs, rs1, &guard.Request{Key: k.name, Path: "/"}); got <= admitted {
			t.Fatalf("key %s: Redis counts %d units, want the %d admitted and a lease", k.name, got, admitted)
		}
	}
	if err := cl.Nodes()[2].Kill(); err != nil {
		t.Fatal(err)
	}
	// The leases expire; the sweep (every 5 ms) gives them back.
	c.advance(2_000_000)
	live := func() error {
		for _, k := range keys {
			if k.node == 2 {
				continue
			}
			if got := r.consumed(t, rs, rs1, &guard.Request{Key: k.name, Path: "/"}); got != admitted {
				return fmt.Errorf("key %s: Redis counts %d units, %d were admitted", k.name, got, admitted)
			}
		}
		return nil
	}
	testwait.Eventually(t, 3*time.Second, live)
	// Sweeps later, still exactly once: a new lease of sk_l0, expired and
	// given back by a later sweep, shows the sweeps went on meanwhile.
	for range admitted {
		if d, err := gw.guard.Check(context.Background(), &guard.Request{Key: "sk_l0", Path: "/"}); err != nil || !d.Allowed {
			t.Fatalf("check sk_l0: %v %+v", err, d)
		}
		c.advance(1000)
	}
	c.advance(2_000_000)
	l0 := &guard.Request{Key: "sk_l0", Path: "/"}
	testwait.Eventually(t, 3*time.Second, func() error {
		if got := r.consumed(t, rs, rs1, l0); got != 2*admitted {
			return fmt.Errorf("key sk_l0: Redis counts %d units, %d were admitted", got, 2*admitted)
		}
		return nil
	})
	for _, k := range keys[2:] {
		if got := r.consumed(t, rs, rs1, &guard.Request{Key: k.name, Path: "/"}); got != admitted {
			t.Fatalf("after more sweeps with returns for the dead shard failing: key %s: Redis counts %d units, %d were admitted", k.name, got, admitted)
		}
	}
}

// TestGlobalCounterServedByLeases: a global counter is one hot slot on
// Cluster, which leases must keep cool. Three gateways check
// 600 keys round robin, each key too rarely on one gateway to get a lease
// of its own, every request counting against its key's counter and one
// global counter. The global counter is taken from its leases: its slot
// sees a small share of the calls, not one per request; and once the
// leases are back Redis counts exactly what was admitted.
func TestGlobalCounterServedByLeases(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b backend) {
		const requests = 3000
		c := newClock(start)
		r := b.newRig(t, c)
		ruleKey := "{id: per-key, match: {}, algorithm: fixed_window, limit: 100000, window: 1h}"
		ruleGlobal := "{id: all, scope: global, match: {}, algorithm: fixed_window, limit: 10000000, window: 1h}"
		rs := mustRules(t, "rules:\n  - "+ruleKey+"\n  - "+ruleGlobal+"\n")
		var gws []*gateway
		for i := range 3 {
			gws = append(gws, r.gateway(t, rs, int64(i)*1_000_000, 0))
		}
		keys := make([]string, 600)
		for i := range keys {
			keys[i] = fmt.Sprintf("sk_cold_%03d", i)
		}
		for i := range requests {
			d, err := gws[i%len(gws)].guard.Check(context.Background(), &guard.Request{Key: keys[i%len(keys)], Path: "/"})
			if err != nil || !d.Allowed {
				t.Fatalf("check %d: %v %+v", i, err, d)
			}
			c.advance(1000)
		}
		var globalCalls, checks int
		var st lease.Stats
		for _, gw := range gws {
			for name, n := range gw.calls.seen() {
				if strings.Contains(name, "{g:") {
					globalCalls += n
				}
			}
			checks += gw.calls.count(guard.OpCheck)
			s := gw.lease.Stats()
			st.Lease, st.Granted = st.Lease+s.Lease, st.Granted+s.Granted
			gw.lease.Close()
		}
		t.Logf("%d requests: %d check calls reached Redis, %d calls held the global counter; units leased %d",
			requests, checks, globalCalls, st.Granted)
		if globalCalls > requests/10 {
			t.Errorf("%d of %d requests sent the global counter to its slot", globalCalls, requests)
		}
		rsGlobal := mustRules(t, "rules:\n  - "+ruleGlobal+"\n")
		if got := r.consumed(t, rs, rsGlobal, &guard.Request{Key: keys[0], Path: "/"}); got != requests {
			t.Errorf("global counter: Redis counts %d units consumed, %d requests were admitted", got, requests)
		}
	})
}
