package lease

import (
	"context"
	"flag"
	"runtime"
	"strconv"
	"testing"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/memstore"
	"github.com/tollgate/tollgate/guard/rules"
)

var boundDefault = flag.Bool("bound-default", false, "TestMemoryBoundedUnderManyKeys: 200 000 keys at the default table sizes")

// boundBytesPerKey is the documented bound (docs/gateway.md, "Memory per
// tracked key") of the heap one tracked API key takes in a gateway: its
// fast-path counter state (lease, negative cache) and its cached
// resolution, both in bounded tables that evict. Measured ≈ 1 060 B at
// the default sizes (-bound-default runs this test at them).
const boundBytesPerKey = 1200

// fixedBytes is what the test's guard takes besides its tables (memstore's
// 1 000 counters, the compiled rules, the sweep).
const fixedBytes = 2 << 20

// heapInUse returns the bytes of live heap objects after a full
// collection. HeapAlloc, not HeapInuse: HeapInuse counts whole spans, and
// which spans a collection leaves partly filled moves it by hundreds of
// kilobytes from one reading to the next.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestMemoryBoundedUnderManyKeys sends one check of each of 60 000
// distinct keys through a guard over the fast path whose tables hold 2 048
// counters and 2 048 resolutions (200 000 keys at the default sizes with
// -bound-default): the fast path tracks at most its table's size,
// the heap stops growing with the number of keys once the tables are full
// (further keys add less than 16 B each; at the default sizes the tables
// are still filling then), and it stays within
// boundBytesPerKey per tracked key. The wrapped memstore is bounded to
// 1 000 counters so that what is measured is the gateway's own state.
func TestMemoryBoundedUnderManyKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("60 000 checks")
	}
	keys, counters, resolutions := 60_000, 2048, 2048
	if *boundDefault {
		keys, counters, resolutions = 200_000, DefaultCounters, guard.DefaultResolutionCache
	}
	half := keys / 2
	rs, err := rules.Load([]byte("rules:\n  - {id: key, match: {}, algorithm: token_bucket, capacity: 100, rate: 100/1h}\n"))
	if err != nil {
		t.Fatal(err)
	}
	base := heapInUse()
	mem := memstore.New(memstore.WithMaxCounters(1000))
	s := New(mem, WithCounters(counters))
	defer s.Close()
	g, err := guard.New(s, []byte("bound-test-secret-0123456789abcd"), rs, guard.WithResolutionCache(resolutions))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var d guard.Decision
	send := func(from, to int) {
		for i := from; i < to; i++ {
			req := guard.Request{Key: "sk_bound_" + strconv.Itoa(i), Path: "/v1/x"}
			if err := g.CheckInto(ctx, &req, &d); err != nil {
				t.Fatalf("check %d: %v", i, err)
			}
		}
	}
	send(0, half)
	atHalf := heapInUse()
	send(half, keys)
	atFull := heapInUse()
	// The growth check reads the heap over up to three more batches of
	// half the keys and keeps the smallest growth: state kept per key
	// grows the heap in every batch, while a reading disturbed by some
	// other goroutine's garbage (CI saw +311 kB once over 30 000 keys)
	// does not repeat. A map entry per key would cost ≥ 40 B/key.
	grew := int64(atFull) - int64(atHalf)
	for round, last := 0, atFull; round < 3 && grew > int64(16*half); round++ {
		from := keys + round*half
		send(from, from+half)
		now := heapInUse()
		grew = min(grew, int64(now)-int64(last))
		last = now
	}

	tracked := 0
	s.tab.each(func(*entry) { tracked++ })
	if tracked > counters || len(s.tab.slots) != counters {
		t.Errorf("the fast path tracks %d counters in %d slots, want at most %d", tracked, len(s.tab.slots), counters)
	}
	if mem.Len() > 1000 {
		t.Errorf("memstore holds %d counters, want at most 1000", mem.Len())
	}
	used := int64(atFull) - int64(base)
	t.Logf("heap in use after GC: +%d B at %d keys, +%d B at %d keys; %d counters tracked; %d B per tracked key (counter + resolution)",
		int64(atHalf)-int64(base), half, used, keys, tracked, used/int64(max(counters, resolutions)))
	if grew > int64(16*half) && counters < half/10 {
		t.Errorf("the heap grew by %d B over %d more keys (%d B/key) in each of four batches, want < 16 B/key: something holds state per key beyond the bounded tables",
			grew, half, grew/int64(half))
	}
	if bound := int64(boundBytesPerKey*max(counters, resolutions) + fixedBytes); used > bound {
		t.Errorf("heap in use grew by %d B, want ≤ %d B (%d B per tracked key)", used, bound, boundBytesPerKey)
	}
	runtime.KeepAlive(g)
}
