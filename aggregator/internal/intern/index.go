package intern

// cell is one entry of an index: a hash and the first id with it (0:
// empty).
type cell struct {
	hash uint64
	id   uint32
}

// index maps a string's hash to the first id with that hash: an open
// addressing table with linear probing over pointer-free cells, so that a
// lookup usually reads one cache line where a Go map reads its control
// word and then its slot, and the collector never scans it. Its size is a
// power of two, at most 7/8 full.
type index struct {
	cells []cell
	n     int // cells in use
}

// get is the id stored for h, or 0.
func (x *index) get(h uint64) uint32 {
	if len(x.cells) == 0 {
		return 0
	}
	m := uint64(len(x.cells) - 1)
	for i := h & m; ; i = (i + 1) & m {
		c := &x.cells[i]
		if c.id == 0 {
			return 0
		}
		if c.hash == h {
			return c.id
		}
	}
}

// set stores id (not 0) for h, replacing what h had.
func (x *index) set(h uint64, id uint32) {
	if (x.n+1)*8 > len(x.cells)*7 {
		x.grow()
	}
	m := uint64(len(x.cells) - 1)
	for i := h & m; ; i = (i + 1) & m {
		c := &x.cells[i]
		if c.id == 0 {
			c.hash, c.id = h, id
			x.n++
			return
		}
		if c.hash == h {
			c.id = id
			return
		}
	}
}

// del removes h, shifting back the cells after it that probed past it,
// so that no lookup stops early at the hole.
func (x *index) del(h uint64) {
	if len(x.cells) == 0 {
		return
	}
	m := uint64(len(x.cells) - 1)
	i := h & m
	for {
		c := &x.cells[i]
		if c.id == 0 {
			return
		}
		if c.hash == h {
			break
		}
		i = (i + 1) & m
	}
	for j := (i + 1) & m; x.cells[j].id != 0; j = (j + 1) & m {
		// A cell whose home is cyclically within (i, j] stays; one
		// whose home is at or before the hole moves into it.
		home := x.cells[j].hash & m
		if (i < j && i < home && home <= j) || (i > j && (home > i || home <= j)) {
			continue
		}
		x.cells[i] = x.cells[j]
		i = j
	}
	x.cells[i] = cell{}
	x.n--
}

// grow doubles the table (64 cells at first).
func (x *index) grow() {
	old := x.cells
	x.cells, x.n = make([]cell, max(64, 2*len(old))), 0
	for _, c := range old {
		if c.id != 0 {
			x.set(c.hash, c.id)
		}
	}
}
