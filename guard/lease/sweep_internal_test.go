package lease

import (
	"testing"
	"time"

	"github.com/tollgate/tollgate/guard/memstore"
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
