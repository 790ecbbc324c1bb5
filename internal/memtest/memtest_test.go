package memtest_test

import (
	"testing"

	"github.com/tollgate/tollgate/internal/memtest"
)

// sink keeps what the allocation test makes from being optimised away.
var sink [][]byte

// TestRetainedCountsWhatIsHeld (not parallel: it reads the process's heap):
// 1 000 blocks of 4 KiB held by what build returns count; the same blocks
// dropped before build returns do not.
func TestRetainedCountsWhatIsHeld(t *testing.T) {
	const blocks, size = 1000, 4096
	fill := func() [][]byte {
		out := make([][]byte, blocks)
		for i := range out {
			out[i] = make([]byte, size)
		}
		return out
	}
	held := memtest.Retained(func() any { return fill() })
	if held < blocks*size*3/4 || held > 2*blocks*size { // the rest of the heap moves a little too
		t.Errorf("Retained of %d blocks of %d B held = %d B, want about %d", blocks, size, held, blocks*size)
	}
	dropped := memtest.Retained(func() any { fill(); return nil })
	if dropped > blocks*size/4 {
		t.Errorf("Retained of blocks dropped before it returned = %d B, want next to none", dropped)
	}
}

// TestMallocs (not parallel: it reads the process's allocation count):
// 100 allocations that escape are counted, and no fewer.
func TestMallocs(t *testing.T) {
	const n = 100
	got := memtest.Mallocs(func() {
		for range n {
			sink = append(sink, make([]byte, 64))
		}
	})
	sink = nil
	if got < n {
		t.Errorf("Mallocs of %d allocations = %d, want at least %d", n, got, n)
	}
}
