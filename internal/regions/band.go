package regions

// A fixed window's guard band, counted finely.
//
// A region's clock is off true time by some offset within the skew bound
// K, and keeps that offset (it runs at true time's rate). True window j
// is then, on the region's clock, [jW+δ, (j+1)W+δ) for an offset δ the
// region does not know, |δ| ≤ K. The region keeps, for every δ, what it
// admitted in that interval within window j's share. It counts the time
// around each boundary j, [jW−K, jW+K) (the band of boundary j), in
// 2×BandSlots slots, and the rest of window j, [jW+K, (j+1)W−K) (its
// body), as one: the interval of offset δ covers window j's body, the
// slots of band j from the one holding jW+δ on, and the slots of band j+1
// up to the one holding (j+1)W+δ. A slot it covers only in part is
// counted whole, so steady traffic uses at most one slot (K/BandSlots) of
// time more than a window's, where counting both bands whole would use
// 2K more.

// BandSlots is how many slots each half of a boundary's band (K on each
// side) is counted in.
const BandSlots = 4

// bandLen is the number of slots of a band.
const bandLen = 2 * BandSlots

// cell is where an admission is counted: the body of window j (q < 0), or
// slot q of the band of boundary j.
type cell struct {
	j int64
	q int
}

// cellAt is the cell of an admission at now, for windows of w µs and the
// skew bound k µs (w ≥ 4k).
func cellAt(w, k, now int64) cell {
	j := fdiv(now, w)
	off := now - j*w
	switch {
	case k > 0 && off < k:
		return cell{j: j, q: int((off + k) * BandSlots / k)}
	case k > 0 && off >= w-k:
		return cell{j: j + 1, q: int((off - (w - k)) * BandSlots / k)}
	}
	return cell{j: j, q: -1}
}

// windowsOf are the windows a cell counts in: the one holding now first,
// then its neighbour across the band's boundary.
func windowsOf(x cell, w, now int64) []int64 {
	switch {
	case x.q < 0:
		return []int64{x.j}
	case now < x.j*w:
		return []int64{x.j - 1, x.j}
	}
	return []int64{x.j, x.j - 1}
}

// shifts is the range of window j's intervals (by the slot q0 of band j
// they start in) that cover cell x.
func shifts(j int64, x cell) (lo, hi int) {
	switch {
	case x.q < 0 || x.j != j && x.j != j+1:
		return 0, bandLen - 1
	case x.j == j:
		return 0, x.q
	}
	return x.q, bandLen - 1
}

// windowUse is the most window j's intervals from q0 = lo to hi hold:
// window j's body n, band j's slots from q0 on (head) and band j+1's up to
// q0 (tail).
func windowUse(n int64, head, tail []int64, lo, hi int) int64 {
	if head == nil && tail == nil {
		return n
	}
	var suf [bandLen + 1]int64
	for q := bandLen - 1; q >= 0; q-- {
		suf[q] = suf[q+1] + at(head, q)
	}
	var most, pre int64
	for q := 0; q < bandLen; q++ {
		pre += at(tail, q)
		if q >= lo && q <= hi {
			most = max(most, suf[q]+n+pre)
		}
	}
	return most
}

func at(xs []int64, q int) int64 {
	if xs == nil {
		return 0
	}
	return xs[q]
}
