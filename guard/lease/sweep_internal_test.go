package lease

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/memstore"
	"github.com/tollgate/tollgate/guard/rules"
)

// TestSweepVisitsOnlyEndedLeases: the sweep never scans the table while
// the rules stay (200 gateways in one process spent 6 % of the CPU
// scanning empty tables, and a gateway holding 10 000 leases a tenth of
// a decision's CPU scanning full ones); it closes each lease once its end
// has passed, not before, keeps a counter's renewed lease, and after the
// rules change (a new epoch) scans once and closes every older lease.
func TestSweepVisitsOnlyEndedLeases(t *testing.T) {
	t.Parallel()
	now := int64(1_000_000)
	s := New(memstore.New(), WithSweepInterval(time.Hour), WithClock(func() int64 { return now }))
	defer s.Close()
	const n = 100
	give := func(e *entry, until int64) *lease {
		l := &lease{until: until, epoch: s.epoch.Load()}
		l.units.Store(0)
		e.lease.Store(l)
		s.schedule(e, until) // as install does
		return l
	}
	var es []*entry
	for i := range n {
		e, _ := s.tab.getOrCreate("c"+string(rune('A'+i%26))+string(rune('a'+i/26)), now)
		es = append(es, e)
		give(e, now+int64(i+1)*1000)
	}
	for range 3 {
		s.sweep(false)
	}
	if got := s.scans.Load(); got != 0 {
		t.Fatalf("%d scans of the table with the rules unchanged, want 0", got)
	}
	for i, e := range es {
		if e.lease.Load() == nil {
			t.Fatalf("lease %d closed before its end", i)
		}
	}
	// The sweep's ticks are an hour: past the hour every lease has ended,
	// but for the first counter's, renewed until two hours on.
	renewed := give(es[0], now+2*time.Hour.Microseconds())
	now += time.Hour.Microseconds() + 1
	s.sweep(false)
	for i, e := range es {
		if l := e.lease.Load(); i == 0 && l != renewed {
			t.Error("the renewed lease was closed with the one it replaced")
		} else if i > 0 && l != nil {
			t.Errorf("lease %d not closed after its end", i)
		}
	}
	if got := s.scans.Load(); got != 0 {
		t.Fatalf("%d scans of the table with the rules unchanged, want 0", got)
	}
	// New rules: the next sweep scans once and closes the renewed lease.
	s.Invalidate()
	s.sweep(false)
	s.sweep(false)
	if es[0].lease.Load() != nil {
		t.Error("a lease of the old rules survived their change")
	}
	if got := s.scans.Load(); got != 1 {
		t.Errorf("%d scans after one change of rules, want 1", got)
	}
}

// TestSweptLeaseCountsTowardsTheRate: a counter whose lease the sweep
// closed at its end gets a new lease at its next miss, sized on what the
// closed lease served. Counting only the calls that missed, its rate
// looked like one call per lifetime, no lease was granted, and every
// lease that ended by time cost the counter two Redis calls instead of
// one (at 10 000 keys, a third of the calls).
func TestSweptLeaseCountsTowardsTheRate(t *testing.T) {
	t.Parallel()
	rs, err := rules.Load([]byte("rules:\n  - {id: fw, match: {}, algorithm: fixed_window, limit: 1000000000, window: 366d}\n"))
	if err != nil {
		t.Fatal(err)
	}
	var now atomic.Int64
	now.Store(time.Now().UnixMicro())
	s := New(memstore.New(), WithWindowTTL(time.Minute), WithSweepInterval(time.Hour), WithClock(now.Load))
	defer s.Close()
	g, err := guard.New(s, []byte("swept-test-secret-0123456789abcd"), rs)
	if err != nil {
		t.Fatal(err)
	}
	var d guard.Decision
	req := guard.Request{Key: "sk_swept", Path: "/"}
	check := func() {
		t.Helper()
		if err := g.CheckInto(context.Background(), &req, &d); err != nil || !d.Allowed {
			t.Fatalf("check: allowed %v, %v", d.Allowed, err)
		}
	}
	var e *entry
	for range 100 { // one call a second
		check()
		now.Add(time.Second.Microseconds())
	}
	s.tab.each(func(x *entry) { e = x })
	if e == nil || e.lease.Load() == nil {
		t.Fatal("no lease after 100 calls at one a second")
	}
	// The calls go on until the lease held is within a second of its end,
	// so that it served its lifetime at the counter's rate (a lease
	// renewed just before the calls stopped would have served one or two:
	// too few for another, rightly).
	var l *lease
	for {
		if l = e.lease.Load(); l == nil {
			t.Fatal("no lease while the calls go on")
		}
		if now.Load()+time.Second.Microseconds() >= l.until {
			break
		}
		check()
		now.Add(time.Second.Microseconds())
	}
	// The lease ends; the sweep closes it (its tick, an hour here, is
	// advanced to the lease's end) before the counter's next call.
	now.Store(l.until + 1)
	s.mu.Lock()
	var ending []*entry
	for _, es := range s.due {
		ending = append(ending, es...)
	}
	s.due = map[int64][]*entry{now.Load(): ending}
	s.mu.Unlock()
	s.sweep(false)
	if e.lease.Load() != nil {
		t.Fatal("the sweep did not close the ended lease")
	}
	misses := s.Stats().Miss
	check()
	if e.lease.Load() == nil {
		t.Fatal("no lease granted at the first miss after the sweep closed the last one")
	}
	if got := s.Stats().Miss - misses; got != 1 {
		t.Errorf("%d misses, want 1", got)
	}
}
