package intern

// PageLen is how many elements a page of Pages holds.
const PageLen = 1024

// Pages is a growable array of T held in pages of PageLen: growing adds a
// page and never copies what it holds, where a slice of millions of
// entries would copy them all at each doubling. For a T without pointers
// the collector scans nothing but the page list.
type Pages[T any] struct {
	p []*[PageLen]T
	n int // elements addressable
}

// At is element i, which must be below Len.
func (s *Pages[T]) At(i uint32) *T { return &s.p[i/PageLen][i%PageLen] }

// Len is how many elements are addressable: a multiple of PageLen.
func (s *Pages[T]) Len() int { return s.n }

// Grow makes the elements below n addressable; new ones are zero.
func (s *Pages[T]) Grow(n int) {
	for s.n < n {
		s.p = append(s.p, new([PageLen]T))
		s.n += PageLen
	}
}
