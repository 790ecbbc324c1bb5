package intern

import (
	"math/rand/v2"
	"testing"
)

// TestIndexMatchesMap sets, reads and deletes random hashes against a Go
// map. The hashes share few low bits (their homes crowd a few cells, and
// the table wraps around its end), so probes run long and deletions shift
// cells back across each other and across the end.
func TestIndexMatchesMap(t *testing.T) {
	t.Parallel()
	for seed := range uint64(2) {
		rng := rand.New(rand.NewPCG(seed, 3))
		var x index
		model := map[uint64]uint32{}
		hash := func() uint64 {
			h := uint64(rng.IntN(800)) << 20 // many share low bits
			switch rng.IntN(3) {
			case 0:
				h |= 1<<20 - 1 // home: the table's last cell; probes wrap
			case 1:
				h |= uint64(rng.IntN(1 << 20)) // anywhere
			}
			return h
		}
		for step := range 20_000 {
			h := hash()
			switch op := rng.IntN(10); {
			case op < 5:
				id := uint32(1 + rng.IntN(1<<20))
				x.set(h, id)
				model[h] = id
			case op < 8:
				x.del(h)
				delete(model, h)
			default:
				if got := x.get(h); got != model[h] {
					t.Fatalf("seed %d step %d: get(%#x) = %d, want %d", seed, step, h, got, model[h])
				}
			}
			if x.n != len(model) {
				t.Fatalf("seed %d step %d: %d cells in use, want %d", seed, step, x.n, len(model))
			}
		}
		for h, id := range model {
			if got := x.get(h); got != id {
				t.Fatalf("seed %d: get(%#x) = %d at the end, want %d", seed, h, got, id)
			}
		}
		if len(x.cells)*7 < x.n*8 {
			t.Errorf("seed %d: %d of %d cells in use: fuller than 7/8", seed, x.n, len(x.cells))
		}
	}
}
