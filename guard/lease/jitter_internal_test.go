package lease

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/memstore"
	"github.com/tollgate/tollgate/guard/rules"
)

// TestLeasesGrantedTogetherEndApart: window leases first granted at
// about the same moment end at times spread over their whole lifetime
// (from a quarter of it to all of it), so that their renewals do not
// reach Redis in one wave a lifetime after a start (a sweep's warm-up
// showed the wave: 0.02 Redis calls per decision for two rounds, 0.6 in
// the third; with the first leases jittered by a quarter only, still
// 0.2 in one round of three); and a renewal lives its lifetime less at
// most a quarter.
func TestLeasesGrantedTogetherEndApart(t *testing.T) {
	rs, err := rules.Load([]byte("rules:\n  - {id: fw, match: {}, algorithm: fixed_window, limit: 1000000000, window: 366d}\n"))
	if err != nil {
		t.Fatal(err)
	}
	var now atomic.Int64 // the store's sweeper reads it too
	now.Store(time.Now().UnixMicro())
	s := New(memstore.New(), WithWindowTTL(time.Minute), WithClock(now.Load))
	defer s.Close()
	g, err := guard.New(s, []byte("jitter-test-secret-0123456789abc"), rs)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var d guard.Decision
	const keys = 256
	check := func() {
		t.Helper()
		for k := range keys {
			req := guard.Request{Key: "sk_jitter_" + strconv.Itoa(k), Path: "/"}
			if err := g.CheckInto(ctx, &req, &d); err != nil {
				t.Fatalf("key %d: %v", k, err)
			}
		}
	}
	life := time.Minute.Microseconds()
	// lives returns the lifetimes of the leases held, by quarter of life.
	lives := func() (quarters [4]int, leases int) {
		t.Helper()
		s.tab.each(func(e *entry) {
			l := e.lease.Load()
			if l == nil {
				return
			}
			leases++
			got := l.until - l.recv
			if got > life || got < life/4 {
				t.Errorf("lease of %s lives %d µs, want within [%d, %d]", e.name, got, life/4, life)
				return
			}
			quarters[min(3, (got-1)*4/life)]++
		})
		return quarters, leases
	}
	// lease checks every key 20 times, a millisecond apart (each key's
	// second and later misses ask for a lease sized to its rate), and
	// returns the lifetimes of the leases held then.
	lease := func() [4]int {
		t.Helper()
		for range 20 {
			check()
			now.Add(1000)
		}
		quarters, leases := lives()
		if leases < keys/2 {
			t.Fatalf("%d leases for %d keys: the test made too few to judge", leases, keys)
		}
		return quarters
	}
	first := lease()
	leases := first[0] + first[1] + first[2] + first[3]
	// Uniform over the last three quarters: about a third of the leases in
	// each; a first lease jittered by a quarter only has them all in the last.
	for q := 1; q < 4; q++ {
		if first[q] < leases/6 {
			t.Errorf("first leases by quarter of their lifetime %v: want about a third in each of the last three", first)
		}
	}
	// Renewals: every lease expired and asked for again.
	now.Add(life + 1)
	s.sweep(false)
	renewed := lease()
	if leases := renewed[0] + renewed[1] + renewed[2] + renewed[3]; renewed[3] != leases {
		t.Errorf("renewals by quarter of their lifetime %v: want all in the last quarter", renewed)
	}
}
