package lease

import (
	"testing"
	"time"

	"github.com/tollgate/tollgate/guard/memstore"
)

// TestIdleSweepScansNothing: a store without leases does not scan its
// table at each sweep (200 gateways in one process spent 6 % of the CPU
// scanning empty tables); once a lease is installed the sweep scans until
// no lease is left, and closes the expired one (TestUnusedLeasesGivenBack
// checks the same through real checks: its leases are given back).
func TestIdleSweepScansNothing(t *testing.T) {
	t.Parallel()
	now := int64(1_000_000)
	s := New(memstore.New(), WithSweepInterval(time.Hour), WithClock(func() int64 { return now }))
	defer s.Close()
	for range 3 {
		s.sweep(false)
	}
	if n := s.scans.Load(); n != 0 {
		t.Fatalf("an idle store scanned its table %d times in 3 sweeps, want 0", n)
	}

	e, _ := s.tab.getOrCreate("c", now)
	l := &lease{until: now + 1000, epoch: s.epoch.Load()}
	l.units.Store(0)
	e.lease.Store(l)
	s.leased.Store(true) // as install does
	s.sweep(false)       // the lease is live: kept, and the next sweep scans again
	now += 2000
	s.sweep(false) // expired: closed
	s.sweep(false) // nothing left: no scan
	if n := s.scans.Load(); n != 2 {
		t.Errorf("%d scans, want 2 (the live lease's, the expired one's)", n)
	}
	if e.lease.Load() != nil {
		t.Error("the expired lease was not closed")
	}
}
