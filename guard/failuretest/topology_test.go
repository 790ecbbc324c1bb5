package failuretest

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/breaker"
	"github.com/tollgate/tollgate/guard/redisstore"
	"github.com/tollgate/tollgate/internal/testwait"
)

// TestSentinelPrimaryKilled: a Sentinel setup on loopback (one primary,
// one replica, three sentinels, down-after 1000 ms) loses its primary
// (SIGKILL) under load. Every check is answered within its deadline and
// normal limiting resumes by itself on the promoted replica (target:
// ≤ 3 s, measured; asserted ≤ 10 s).
func TestSentinelPrimaryKilled(t *testing.T) {
	st := redistest.StartSentinelTB(t)
	r := newRig(t, redisstore.Config{Mode: redisstore.ModeSentinel, Addrs: st.SentinelAddrs(), MasterName: st.MasterName()})
	l := startLoad(t, r, loadReq, nil)
	warm(t, l)

	// The sentinels' part: when the first and the last of them name the
	// replica as the primary (the client asks one of them).
	var scs []*redis.SentinelClient
	for _, a := range st.SentinelAddrs() {
		sc := redis.NewSentinelClient(&redis.Options{Addr: a, DialTimeout: time.Second, ReadTimeout: time.Second})
		defer sc.Close()
		scs = append(scs, sc)
	}
	replica := fmt.Sprint(st.Replica().Port())
	var firstSwitch, lastSwitch atomic.Int64
	done := make(chan struct{})
	defer func() { <-done }()
	if err := st.Primary().Kill(); err != nil {
		t.Fatal(err)
	}
	killed := l.next(1)
	go func() {
		defer close(done)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		named := make([]bool, len(scs))
		for n := 0; n < len(scs) && time.Since(killed) < failoverBound; <-tick.C {
			for i, sc := range scs {
				if a, err := sc.GetMasterAddrByName(context.Background(), st.MasterName()).Result(); !named[i] && err == nil && len(a) == 2 && a[1] == replica {
					named[i] = true
					n++
					firstSwitch.CompareAndSwap(0, int64(time.Since(killed)))
					lastSwitch.Store(int64(time.Since(killed)))
				}
			}
		}
	}()
	recovery := l.untilNormal(t, failoverBound, "normal limiting after the failover", 1, killed)
	stats := l.assertAnswered(t, 1)
	if recovery > failoverBound {
		t.Errorf("normal limiting %v after the primary's SIGKILL, bound %v", recovery, failoverBound)
	}
	// The promoted replica answers as the primary.
	rc := st.Replica().Client()
	defer rc.Close()
	role, err := rc.Do(context.Background(), "ROLE").Slice()
	if err != nil || len(role) == 0 || role[0] != "master" {
		t.Errorf("replica's role after the failover: %v (%v)", role, err)
	}
	t.Logf("figure: Sentinel primary SIGKILLed under load (%d workers, down-after 1000 ms, call deadline %v): normal limiting %v after the kill; %d breaker openings",
		workers, callDeadline, recovery.Round(time.Millisecond), r.opens.Load())
	<-done
	t.Logf("figure: Sentinel failover: the first sentinel named the new primary %v after the kill, the last %v; checks meanwhile %v",
		time.Duration(firstSwitch.Load()).Round(time.Millisecond), time.Duration(lastSwitch.Load()).Round(time.Millisecond), stats[0])
}

// TestClusterNodeKilled: one primary of a 3-primary Cluster
// (cluster-require-full-coverage no) is SIGKILLed under load. Checks for
// tenants whose hash tag lives on the other primaries are never degraded;
// checks for the dead primary's slots degrade, and once its breaker is
// open they are answered without waiting on it.
func TestClusterNodeKilled(t *testing.T) {
	cl := redistest.StartClusterTB(t, 3)
	r := newRig(t, redisstore.Config{Mode: redisstore.ModeCluster, Addrs: cl.Addrs()})
	ctx := context.Background()
	// Loading the script on every primary goes through the test's 50 ms
	// read deadline, which a loaded machine can miss (CI did): try again.
	testwait.Eventually(t, 10*time.Second, func() error { return r.store.Load(ctx) })
	dead := cl.Nodes()[1].Addr()
	cc := r.client.(*redis.ClusterClient)
	// Tenants by the primary of their hash tag (the key-scope counter of a
	// key with a tenant is named tg{<tenant>}<tag><key_id>).
	var tenants []string
	onDead := map[string]bool{}
	nodeOf := map[string]string{}
	nDead := 0
	for i := 0; len(tenants) < 12 || nDead < 4; i++ {
		tn := fmt.Sprintf("tenant-%d", i)
		c, err := cc.MasterForKey(ctx, "tg{"+tn+"}")
		if err != nil {
			t.Fatal(err)
		}
		nodeOf[tn] = c.Options().Addr
		onDead[tn] = c.Options().Addr == dead
		if onDead[tn] {
			nDead++
		}
		tenants = append(tenants, tn)
	}
	if nDead == len(tenants) {
		t.Fatal("every tenant on one node")
	}
	// A live primary's check may still time out when the machine stalls
	// the client for a whole deadline (-race on two loaded cores); one
	// that degrades faster than the deadline was refused without waiting:
	// a breaker or pipeline shared with the dead primary.
	// The live primaries' checks are counted per node: a live node's own
	// breaker may open too when the machine stalls the client past five
	// deadlines in a row (-race -cpu 1 at load 16 did), and its checks
	// then degrade at once, rightly. What must never happen is a live
	// node's checks degrading at once while its breaker stays closed.
	type liveCounts struct{ degraded, fast, normal atomic.Int64 }
	live := map[string]*liveCounts{}
	for _, tn := range tenants {
		if !onDead[tn] && live[nodeOf[tn]] == nil {
			live[nodeOf[tn]] = &liveCounts{}
		}
	}
	var deadNormalWhileOpen, deadDegraded atomic.Int64
	req := func(w, i int) guard.Request {
		tn := tenants[(w+i*workers)%len(tenants)]
		return guard.Request{Key: "key-" + tn, Tenant: tn, Path: "/load"}
	}
	observe := func(phase int, req *guard.Request, d *guard.Decision, took time.Duration) {
		if phase == 0 {
			return
		}
		switch {
		case !onDead[req.Tenant] && d.Degraded:
			lc := live[nodeOf[req.Tenant]]
			lc.degraded.Add(1)
			if took < callDeadline {
				lc.fast.Add(1)
			}
		case !onDead[req.Tenant]:
			live[nodeOf[req.Tenant]].normal.Add(1)
		case d.Degraded:
			deadDegraded.Add(1)
		case phase == 2:
			deadNormalWhileOpen.Add(1)
		}
	}
	l := startLoad(t, r, req, observe)
	warm(t, l)

	if err := cl.Nodes()[1].Kill(); err != nil {
		t.Fatal(err)
	}
	l.next(1)
	toOpen := until(t, 5*time.Second, "the dead primary's breaker open", func() bool { return r.breakerState(dead) == breaker.Open })
	l.next(2)
	// Through the cluster's own failure detection (node timeout 1 s).
	until(t, 10*time.Second, "load on both sides while open", func() bool {
		return l.degraded[2].Load() >= 2000 && l.normal[2].Load() >= 2000 && r.halfOpens.Load() >= 3
	})
	stats := l.assertAnswered(t, 1, 2)
	var liveNormal, liveDegraded int64
	judged := 0
	for node, lc := range live {
		liveNormal += lc.normal.Load()
		liveDegraded += lc.degraded.Load()
		if r.everOpened(node) {
			t.Logf("live primary %s: its own breaker opened (the machine stalled its calls past their deadline): %d checks degraded, %d fast, %d normal; not judged",
				node, lc.degraded.Load(), lc.fast.Load(), lc.normal.Load())
			continue
		}
		judged++
		if n := lc.fast.Load(); n != 0 {
			t.Errorf("%d checks for tenants on live primary %s degraded without waiting for their deadline while its breaker stayed closed; the degraded decisions' errors: %v; breakers (dead: %s): %v",
				n, node, r.degradedCauses(), dead, r.breakerChanges())
		}
		if n := lc.degraded.Load(); n*100 > lc.normal.Load() {
			t.Errorf("%d checks degraded for tenants on live primary %s, %d normal", n, node, lc.normal.Load())
		}
	}
	if judged == 0 {
		t.Logf("every live primary's breaker opened: the machine stalled the load; breakers: %v", r.breakerChanges())
	}
	if n := deadNormalWhileOpen.Load(); n != 0 {
		t.Errorf("%d non-degraded checks for the dead primary's slots", n)
	}
	for _, s := range r.store.BreakerStates() {
		if s.Node != dead && s.State != breaker.Closed && !r.everOpened(s.Node) {
			t.Errorf("breaker of live node %s: %v", s.Node, s.State)
		}
	}
	t.Logf("figure: Cluster primary SIGKILLed under load (%d workers): its breaker open %v after; %d checks on live primaries, %d degraded (timed out); %d degraded on the dead one's slots",
		workers, toOpen.Round(time.Millisecond), liveNormal+liveDegraded, liveDegraded, deadDegraded.Load())
	t.Logf("figure: Cluster: checks until the breaker opened: %v; while open: %v", stats[0], stats[1])
}
