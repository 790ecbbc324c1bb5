package lease

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/memstore"
	"github.com/tollgate/tollgate/guard/rules"
)

// TestLeasesGrantedTogetherEndApart: window leases granted at about the
// same moment end at different times, each within the last quarter of its
// lifetime, so that their renewals do not reach Redis in one wave (a
// sweep's warm-up showed the wave: 0.02 Redis calls per decision for two
// rounds, 0.6 in the third).
func TestLeasesGrantedTogetherEndApart(t *testing.T) {
	rs, err := rules.Load([]byte("rules:\n  - {id: fw, match: {}, algorithm: fixed_window, limit: 1000000000, window: 366d}\n"))
	if err != nil {
		t.Fatal(err)
	}
	s := New(memstore.New(), WithWindowTTL(time.Minute))
	defer s.Close()
	g, err := guard.New(s, []byte("jitter-test-secret-0123456789abc"), rs)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var d guard.Decision
	const keys = 64
	// Each key's second and later misses ask for a lease sized to its rate.
	for round := range 20 {
		for k := range keys {
			req := guard.Request{Key: "sk_jitter_" + strconv.Itoa(k), Path: "/"}
			if err := g.CheckInto(ctx, &req, &d); err != nil {
				t.Fatalf("round %d key %d: %v", round, k, err)
			}
		}
	}
	life := time.Minute.Microseconds()
	ends := map[int64]bool{}
	leases := 0
	s.tab.each(func(e *entry) {
		l := e.lease.Load()
		if l == nil {
			return
		}
		leases++
		if got := l.until - l.recv; got > life || got < life-life/4 {
			t.Errorf("lease of %s lives %d µs, want within [%d, %d]", e.name, got, life-life/4, life)
		}
		ends[l.until-l.recv] = true
	})
	if leases < keys/2 {
		t.Fatalf("%d leases for %d keys: the test made too few to judge", leases, keys)
	}
	if len(ends) < leases/2 {
		t.Errorf("%d leases granted together have %d distinct lifetimes, want them spread", leases, len(ends))
	}
}
