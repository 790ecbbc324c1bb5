package intern

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestReusesAndCompacts adds and releases strings in a random
// order against a model map: ids stay unique among live strings, strings
// read back exactly after compactions, and released ids are reused.
func TestReusesAndCompacts(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	in := New()
	refs := map[string]int{}
	ids := map[string]uint32{}
	peak := 0 // most strings live at once
	for step := range 50_000 {
		s := fmt.Sprintf("s-%d-%s", rng.IntN(5000), string(make([]byte, rng.IntN(40))))
		if refs[s] > 0 && rng.IntN(2) == 0 {
			in.Unref(ids[s])
			if refs[s]--; refs[s] == 0 {
				delete(refs, s)
				delete(ids, s)
			}
		} else {
			id := in.Ref([]byte(s))
			if old, ok := ids[s]; ok && old != id {
				t.Fatalf("step %d: %q got id %d, held as %d", step, s, id, old)
			}
			ids[s] = id
			refs[s]++
		}
		peak = max(peak, len(ids))
	}
	if in.Live() != len(ids) {
		t.Errorf("%d strings live, want %d", in.Live(), len(ids))
	}
	seen := map[uint32]bool{}
	for s, id := range ids {
		if in.Str(id) != s || in.Find([]byte(s)) != id || seen[id] {
			t.Fatalf("%q: id %d reads %q, finds %d (seen %v)", s, id, in.Str(id), in.Find([]byte(s)), seen[id])
		}
		seen[id] = true
	}
	if n := in.IDs() - 1; n != peak {
		t.Errorf("%d ids made for at most %d strings live at once: released ids are not reused", n, peak)
	}
}
