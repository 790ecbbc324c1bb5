package guard

// shareTable is this region's shares of global rules' counters that
// differ from the static share (SetShares): counter name (Counter.Name)
// to units. It is never modified once published; a nil table is empty.
type shareTable struct {
	m map[string]int64
}

func (t *shareTable) get(name string) (int64, bool) {
	if t == nil {
		return 0, false
	}
	u, ok := t.m[name]
	return u, ok
}

// SetShares replaces the region's share table: for each named counter of
// a `regions: global` rule (Counter.Name, as CounterNames gives them), the
// units this region may admit against instead of its static share of the
// rule's limit (never more than the limit; a bucket's rate follows its
// capacity). Counters not named run at their static share. A counter
// decided against the region's share ledger (Counter.Ledger: the rules
// list more than one region) ignores the table: its share is the
// ledger's, which moves with the loans the region gives and receives. The guard takes
// shares over: the caller must not modify it afterwards. Decisions see the
// new table whole, from the next request on, without a lock: the table is
// published copy-on-write, and cached resolutions made under another
// table are not used again.
//
// A counter whose share changed is decided against the new share by the
// next request: the local fast path's negative cache and leases hold only
// for the parameters they were taken under (guard/lease), and the share is
// the counter's limit, so a client rejected against a smaller share is not
// kept waiting for its Retry-After once the share grew. It does not block.
func (g *Guard) SetShares(shares map[string]int64) {
	g.shares.Store(&shareTable{m: shares})
}

// Shares returns the region's share table (SetShares); it must not be
// modified.
func (g *Guard) Shares() map[string]int64 {
	if t := g.shares.Load(); t != nil {
		return t.m
	}
	return nil
}
