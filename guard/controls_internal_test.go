package guard

import (
	"math"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/guard/rules"
)

// controlsForReads returns Controls holding n entries of every kind.
func controlsForReads(n int) (*Controls, *rules.Rule) {
	c := NewControls()
	c.Update(func(s *ControlSet) {
		for i := range n {
			k := "kid" + strconv.Itoa(i)
			s.Blocked[k] = Entry{Expiry: math.MaxInt64}
			s.Allowed[k] = Entry{}
			s.Penalties[k] = Penalty{Level: 2, Until: math.MaxInt64}
			s.KeyOverrides[k] = Override{Override: rules.Override{Factor: 2}}
			s.TenantOverrides[k] = Override{Override: rules.Override{Limit: 9}}
		}
	})
	return c, &rules.Rule{ID: "r", Scope: rules.ScopeKey}
}

// TestControlsReadsDoNotAllocate: a decision's reads of the controls take
// no lock and allocate nothing.
func TestControlsReadsDoNotAllocate(t *testing.T) {
	c, r := controlsForReads(100)
	allocs := testing.AllocsPerRun(1000, func() {
		s := c.Snapshot()
		_ = s.status("kid7", 1)
		_, _ = s.penalty("kid7", 1)
		_, _ = s.override(r, "kid7", "kid7", 1)
		_ = s.status("absent", 1)
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per read", allocs)
	}
}

// BenchmarkControlsRead measures a decision's reads of the controls while
// a writer publishes a change every millisecond (far more often than a
// control plane does).
func BenchmarkControlsRead(b *testing.B) {
	c, r := controlsForReads(10_000)
	if c.Snapshot().Len() != 50_000 {
		b.Fatalf("setup: %d entries", c.Snapshot().Len())
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-t.C:
				c.SetPenalty("writer", Penalty{Until: int64(i)})
			}
		}
	})
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		n := 0
		for pb.Next() {
			s := c.Snapshot()
			if s.status("kid42", 1) != rules.Blocklisted {
				n++
			}
			_, _ = s.penalty("kid42", 1)
			_, _ = s.override(r, "kid42", "t", 1)
		}
		if n != 0 {
			b.Errorf("%d reads missed the blocklist", n)
		}
	})
	b.StopTimer()
	close(stop)
	wg.Wait()
}
