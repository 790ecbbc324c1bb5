package intern

import "testing"

// TestPagesKeepWhatTheyHold: growing adds pages without moving the
// elements held (a pointer taken before still reads them), new elements
// are zero, and Len counts whole pages.
func TestPagesKeepWhatTheyHold(t *testing.T) {
	t.Parallel()
	var p Pages[[2]int64]
	if p.Len() != 0 {
		t.Fatalf("empty: Len %d", p.Len())
	}
	p.Grow(1)
	first := p.At(0)
	first[0] = 7
	for n := 2; n <= 5*PageLen+3; n++ {
		p.Grow(n)
		*p.At(uint32(n - 1)) = [2]int64{int64(n), -int64(n)}
	}
	if want := 6 * PageLen; p.Len() != want {
		t.Errorf("Len %d, want %d (whole pages)", p.Len(), want)
	}
	if first != p.At(0) || first[0] != 7 {
		t.Errorf("element 0 moved or changed: %v", *p.At(0))
	}
	for i := 1; i < 5*PageLen+3; i++ {
		if got := *p.At(uint32(i)); got != [2]int64{int64(i + 1), -int64(i + 1)} {
			t.Fatalf("element %d = %v", i, got)
		}
	}
	if got := *p.At(uint32(p.Len() - 1)); got != [2]int64{} {
		t.Errorf("an element never written is %v, want zero", got)
	}
}
