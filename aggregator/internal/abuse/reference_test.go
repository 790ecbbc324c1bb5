package abuse

import (
	"slices"
	"time"
)

// mapTable is the table as it was before its states moved into a flat
// table: a map of *State per key_id. It is the exact reference the
// property test holds the table to.
type mapTable struct {
	cfg       Config
	partition int32
	keys      map[string]*State
	// lastKeys is how many keys the last committed transaction changed:
	// the next one's maps start at that size instead of growing to it by
	// rehashing, which a backlog of new keys would pay on every
	// transaction.
	lastKeys int
}

// NewTable returns the table of partition p, holding states (restored from
// the changelog).
func newMapTable(cfg Config, p int32, states map[string]State) *mapTable {
	cfg.SetDefaults()
	t := &mapTable{cfg: cfg, partition: p, keys: make(map[string]*State, len(states))}
	for id, s := range states {
		s := s
		t.keys[id] = &s
	}
	return t
}

// Len is the number of keys held.
func (t *mapTable) Len() int { return len(t.keys) }

// Get returns a key's state.
func (t *mapTable) Get(keyID string) (State, bool) {
	s, ok := t.keys[keyID]
	if !ok {
		return State{}, false
	}
	return *s, true
}

// Levels counts the keys at each level whose level is enforced at now.
func (t *mapTable) Levels(now time.Time) [MaxLevel + 1]int {
	var n [MaxLevel + 1]int
	us := now.UnixMicro()
	for _, s := range t.keys {
		if s.Enforced(us) {
			n[s.Level]++
		}
	}
	return n
}

// VolumeKeys counts the keys volume_ceiling fired on within the last
// window before now.
func (t *mapTable) VolumeKeys(now time.Time) int {
	cut := now.Add(-t.cfg.Window).UnixMicro()
	n := 0
	for _, s := range t.keys {
		if s.VolumeAt > cut {
			n++
		}
	}
	return n
}

// Begin starts a transaction on the table.
func (t *mapTable) Begin() *mapTxn {
	return &mapTxn{t: t, keys: make(map[string]*State, t.lastKeys), touched: make(map[string]bool, t.lastKeys), firings: map[string]int{}}
}

// Txn is a set of changes to a Table, invisible to it until Commit.
type mapTxn struct {
	t       *mapTable
	keys    map[string]*State
	deleted map[string]bool
	touched map[string]bool
	steps   []Step
	firings map[string]int
}

// state returns the transaction's copy of a key's state; nil when the key
// has none and create is false.
func (x *mapTxn) state(keyID string, create bool) *State {
	if s, ok := x.keys[keyID]; ok {
		return s
	}
	if b, ok := x.t.keys[keyID]; ok && !x.deleted[keyID] {
		c := *b
		x.keys[keyID] = &c
		return &c
	}
	if !create {
		return nil
	}
	delete(x.deleted, keyID)
	c := &State{}
	x.keys[keyID] = c
	return c
}

// Observe counts a decision observed at now (wall clock). Call it only for
// decisions counted once (not duplicates), in the partition's order.
func (x *mapTxn) Observe(d *Decision, now time.Time) {
	if d.KeyID == "" {
		return // anonymous: penalties act on keys
	}
	us := now.UnixMicro()
	if d.Reason == ReasonAllowlisted {
		// Allowlisted keys are never penalised: one penalised since
		// (gateways answer allowlisted before a penalty) is lifted.
		if s := x.state(d.KeyID, false); s != nil && s.Level > LevelNone && d.TimeMicros > s.LiftedAt {
			x.lift(d.KeyID, s, Lift{KeyID: d.KeyID, TimeMicros: d.TimeMicros, Actor: "allowlist",
				Reason: "the key is allowlisted: allowlisted keys are never penalised"}, now)
		}
		return
	}
	if x.t.cfg.Off {
		return
	}
	s := x.state(d.KeyID, true)
	if x.t.cfg.observe(s, d, us) {
		x.touched[d.KeyID] = true
	}
}

// Evaluate runs the detectors on every key the transaction observed a
// decision of, and climbs the ladder for those they fire on.
func (x *mapTxn) Evaluate(now time.Time) {
	if len(x.touched) == 0 {
		return
	}
	ids := make([]string, 0, len(x.touched))
	for id := range x.touched {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	clear(x.touched)
	us := now.UnixMicro()
	for _, id := range ids {
		s := x.state(id, false)
		if s == nil {
			continue
		}
		fired, newest := x.t.cfg.detect(s)
		if len(fired) == 0 {
			continue
		}
		for _, f := range fired {
			x.firings[f.Detector]++
			if f.Detector == DetectorVolumeCeiling {
				s.VolumeAt = us
			}
		}
		// The evidence is spent: the next firing needs new decisions.
		s.Ring = [Buckets]Bucket{}
		s.LastFiring = us
		x.climb(id, s, fired, newest, now)
	}
}

// climb moves a key up after a firing.
func (x *mapTxn) climb(id string, s *State, fired []Evidence, newest int64, now time.Time) {
	if st, ok := x.t.cfg.climb(id, s, fired, newest, now); ok {
		x.steps = append(x.steps, st)
	}
}

// Lift applies an operator's lift at now (wall clock); it reports whether
// it changed anything (false for a lift already applied).
func (x *mapTxn) Lift(l Lift, now time.Time) bool {
	if l.KeyID == "" {
		return false
	}
	s := x.state(l.KeyID, true)
	if l.TimeMicros <= s.LiftedAt {
		return false
	}
	if s.Tenant == "" {
		s.Tenant = l.Tenant
	}
	s.Touched = max(s.Touched, now.UnixMicro())
	x.lift(l.KeyID, s, l, now)
	return true
}

func (x *mapTxn) lift(id string, s *State, l Lift, now time.Time) {
	delete(x.touched, id)
	x.steps = append(x.steps, x.t.cfg.lift(id, s, l, now))
}

// Tick steps down the keys that were quiet for QuietPeriod and drops the
// state of level-0 keys idle for Idle, at now (wall clock).
func (x *mapTxn) Tick(now time.Time) {
	us := now.UnixMicro()
	cfg := &x.t.cfg
	quiet, idle, remember := cfg.QuietPeriod.Microseconds(), cfg.Idle.Microseconds(), cfg.Remember.Microseconds()
	var down, evict []string
	check := func(id string, s *State) {
		switch {
		case s.Level > LevelNone && us-max(s.Since, s.LastFiring) >= quiet:
			down = append(down, id)
		case s.Level == LevelNone && us-s.Touched >= idle && us-s.Floor >= idle && us >= s.RetryUntil &&
			(s.Step == 0 || us-s.Since >= remember):
			evict = append(evict, id)
		}
	}
	for id, s := range x.t.keys {
		if c, ok := x.keys[id]; ok {
			s = c
		} else if x.deleted[id] {
			continue
		}
		check(id, s)
	}
	for id, s := range x.keys {
		if _, ok := x.t.keys[id]; !ok {
			check(id, s)
		}
	}
	slices.Sort(down)
	for _, id := range down {
		x.steps = append(x.steps, cfg.stepDown(id, x.state(id, false), now))
	}
	for _, id := range evict {
		if x.deleted == nil {
			x.deleted = map[string]bool{}
		}
		x.deleted[id] = true
		delete(x.keys, id)
		delete(x.touched, id)
	}
}

// Changes returns the transaction's writes, ordered by key_id.
func (x *mapTxn) Changes() []Change {
	ids := make([]string, 0, len(x.keys)+len(x.deleted))
	for id := range x.keys {
		ids = append(ids, id)
	}
	for id := range x.deleted {
		ids = append(ids, id)
	}
	slices.Sort(ids) // the ids, not the states: a State is a few hundred bytes
	out := make([]Change, len(ids))
	for i, id := range ids {
		if s, ok := x.keys[id]; ok {
			out[i] = Change{KeyID: id, State: *s}
		} else {
			out[i] = Change{KeyID: id, Deleted: true}
		}
	}
	return out
}

// Steps returns the steps the transaction took, in order.
func (x *mapTxn) Steps() []Step { return x.steps }

// Firings returns how many times each detector fired in the transaction.
func (x *mapTxn) Firings() map[string]int { return x.firings }

// Empty reports whether the transaction changes nothing.
func (x *mapTxn) Empty() bool { return len(x.keys) == 0 && len(x.deleted) == 0 }

// Commit applies the transaction to the table. Call it only once the
// Kafka transaction carrying Changes() and Steps() committed; the Txn is
// spent afterwards.
func (x *mapTxn) Commit() {
	x.t.lastKeys = len(x.keys)
	for id, s := range x.keys {
		x.t.keys[id] = s
	}
	for id := range x.deleted {
		delete(x.t.keys, id)
	}
	*x = mapTxn{}
}
