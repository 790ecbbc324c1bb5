package windows

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/memtest"
	"github.com/tollgate/tollgate/internal/testnet"
)

// memLoader is the "disk" of the model test: rows evicted from the table.
type memLoader map[RowKey]Row

func (m memLoader) Row(k RowKey) (Row, bool, error) {
	r, ok := m[k]
	return r, ok, nil
}

type totals struct{ allowed, rejected, cost int64 }

// TestTableMatchesModel feeds random sources — in-order deliveries with
// repeated prefixes (spool replays), lost events, epoch markers, late
// events — through transactions of which some abort, and compares every
// row with the exact count of the events that were delivered at least once.
func TestTableMatchesModel(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			cfg := Config{Lateness: 5 * time.Second}
			disk := memLoader{}
			tab := NewTable(cfg, 3, disk, nil, nil)
			want := map[RowKey]totals{}
			var wantMissing uint64
			now := int64(1_700_000_000)

			type stream struct {
				src       Source
				next      uint64 // next sequence number to issue
				delivered uint64 // highest delivered
				closed    bool
			}
			var streams []*stream
			for g := range 3 {
				for e := range 2 {
					streams = append(streams, &stream{src: Source{Gateway: fmt.Sprint("gw", g), Epoch: uint64(e + 1), Partition: 3}, next: 1})
				}
			}
			// Every event ever issued, by source and seq, so replays resend
			// the same content.
			issued := map[Source][]Event{}
			var queue []Event
			issue := func(s *stream) {
				ev := Event{Source: s.src, Seq: s.next, Kind: KindDecision,
					Tenant: fmt.Sprint("t", rng.IntN(3)), KeyID: fmt.Sprint("k", rng.IntN(4)),
					Endpoint: fmt.Sprint("/e", rng.IntN(2)), Rule: fmt.Sprint("r", rng.IntN(3)),
					Allowed: rng.IntN(3) > 0, Cost: int64(1 + rng.IntN(5)),
					TimeMicros: (now-int64(rng.IntN(30)))*1_000_000 + int64(rng.IntN(1_000_000))}
				if rng.IntN(10) == 0 {
					ev.Kind = KindReport
				}
				s.next++
				issued[s.src] = append(issued[s.src], ev)
			}
			count := func(ev Event) {
				sec := FloorDiv(ev.TimeMicros, 1_000_000)
				for _, g := range All {
					k := RowKey{Partition: 3, Tenant: ev.Tenant, KeyID: ev.KeyID, Endpoint: ev.Endpoint, Gran: g, Start: sec - Mod(sec, g.Seconds())}
					w := want[k]
					switch {
					case ev.Kind == KindReport:
						w.cost += ev.Cost
					case ev.Allowed:
						w.allowed++
						w.cost += ev.Cost
					default:
						w.rejected++
					}
					want[k] = w
				}
			}
			var materialized, written int64
			for step := 0; step < 300; step++ {
				now += int64(rng.IntN(3))
				// Issue and queue deliveries.
				for range rng.IntN(20) {
					s := streams[rng.IntN(len(streams))]
					if s.closed {
						continue
					}
					issue(s)
					evs := issued[s.src]
					switch r := rng.IntN(20); {
					case r == 0 && s.delivered > 0:
						// Replay a prefix from some earlier point.
						from := 1 + rng.Uint64N(s.delivered)
						for q := from; q <= uint64(len(evs)); q++ {
							queue = append(queue, evs[q-1])
						}
						s.delivered = uint64(len(evs))
					case r == 1:
						// Lost: skip it (the next delivery jumps).
					default:
						for q := s.delivered + 1; q <= uint64(len(evs)); q++ {
							if q < uint64(len(evs)) && rng.IntN(15) == 0 {
								continue // lost in between
							}
							queue = append(queue, evs[q-1])
							s.delivered = q
						}
					}
				}
				if rng.IntN(40) == 0 {
					s := streams[rng.IntN(len(streams))]
					if !s.closed {
						s.closed = true
						queue = append(queue, Event{Source: s.src, Seq: s.next, Kind: KindEpochClosed, LastSeq: s.next + uint64(rng.IntN(5))})
					}
				}
				// One transaction over a prefix of the queue; some abort.
				n := rng.IntN(len(queue) + 1)
				x := tab.Begin()
				for i := range n {
					if _, err := x.Apply(&queue[i], now); err != nil {
						t.Fatal(err)
					}
				}
				if err := x.CloseDue(now); err != nil {
					t.Fatal(err)
				}
				if rng.IntN(5) == 0 {
					continue // aborted: the queue is delivered again
				}
				changes := x.Changes()
				for _, c := range changes {
					if c.Row != nil && c.Publish && !c.Value.Closed {
						t.Fatalf("published row not closed: %+v", c)
					}
				}
				// The reference: what this committed prefix adds. An event
				// that was lost and comes back in a replay after a later one
				// counts if it falls in the last gap of its source.
				marks := tab.Marks()
				for i := range n {
					ev := queue[i]
					m := marks[ev.Source]
					switch {
					case ev.Kind == KindEpochClosed:
						if m.Closed {
							continue
						}
						if ev.LastSeq > m.HWM {
							wantMissing += ev.LastSeq - m.HWM
						}
						m.Closed = true
					case ev.Seq <= m.HWM:
						if m.GapNext == 0 || ev.Seq < m.GapNext || ev.Seq > m.GapLast {
							continue
						}
						m.GapNext = ev.Seq + 1
						wantMissing--
						count(ev)
					default:
						if ev.Seq > m.HWM+1 {
							wantMissing += ev.Seq - m.HWM - 1
							m.GapNext, m.GapLast = m.HWM+1, ev.Seq-1
						}
						m.HWM = ev.Seq
						count(ev)
					}
					if m.GapNext > m.GapLast {
						m.GapNext, m.GapLast = 0, 0
					}
					marks[ev.Source] = m
				}
				written++
				for _, c := range changes {
					if c.Row != nil && !c.Deleted {
						disk[*c.Row] = c.Value
					}
				}
				if rng.IntN(4) == 0 {
					// Evicting while a transaction is open: its commit
					// finds again the rows it read. Every earlier commit is
					// on the disk.
					tab.Evict(written - 1)
				}
				x.Commit(written)
				queue = queue[n:]
				if rng.IntN(3) == 0 {
					materialized = written - int64(rng.IntN(2))
					tab.Evict(materialized)
				}
			}
			// Compare every row: the table's view (memory, then disk).
			got := map[RowKey]totals{}
			for k := range want {
				r, ok, _ := disk.Row(k)
				if h, held := tab.held(k); held {
					r, ok = h, true
				}
				if ok {
					got[k] = totals{r.Allowed, r.Rejected, r.Cost}
				}
			}
			for k, w := range want {
				if got[k] != w {
					t.Errorf("row %+v: got %+v, want %+v", k, got[k], w)
				}
			}
			var missing uint64
			for _, m := range tab.Marks() {
				missing += m.Missing
			}
			if missing != wantMissing {
				t.Errorf("missing = %d, want %d", missing, wantMissing)
			}
			if len(want) == 0 {
				t.Fatal("the model counted nothing: the test tests nothing")
			}
		})
	}
}

func TestCloseAndLate(t *testing.T) {
	tab := NewTable(Config{Lateness: 10 * time.Second}, 0, nil, nil, nil)
	src := Source{Gateway: "g", Epoch: 1}
	ev := func(seq uint64, sec int64) *Event {
		return &Event{Source: src, Seq: seq, Kind: KindDecision, Tenant: "t", KeyID: "k", Endpoint: "/x", Allowed: true, Cost: 1, TimeMicros: sec * 1e6}
	}
	x := tab.Begin()
	if _, err := x.Apply(ev(1, 120), 121); err != nil {
		t.Fatal(err)
	}
	x.Commit(1)
	// 179 + 10 lateness: the minute [120,180) closes at 190.
	x = tab.Begin()
	_ = x.CloseDue(189)
	if !x.Empty() {
		t.Fatalf("closed before end + lateness: %+v", x.Changes())
	}
	x = tab.Begin()
	_ = x.CloseDue(190)
	var published []RowKey
	for _, c := range x.Changes() {
		if c.Publish {
			published = append(published, *c.Row)
			if c.Value.Revision != 1 {
				t.Errorf("revision %d, want 1", c.Value.Revision)
			}
		}
	}
	if len(published) != 1 || published[0].Gran != Minute {
		t.Fatalf("published %+v, want the minute row", published)
	}
	x.Commit(2)
	// A late event republishes with revision 2.
	x = tab.Begin()
	_, _ = x.Apply(ev(2, 150), 200)
	if x.Stats().Late != 1 {
		t.Errorf("late = %d, want 1", x.Stats().Late)
	}
	for _, c := range x.Changes() {
		if c.Row != nil && c.Row.Gran == Minute {
			if !c.Publish || c.Value.Revision != 2 || c.Value.Allowed != 2 {
				t.Errorf("late minute row %+v, want republished with 2 allowed, revision 2", c)
			}
		}
	}
}

func TestExpire(t *testing.T) {
	cfg := Config{Retention: map[Granularity]time.Duration{Minute: time.Hour}}
	tab := NewTable(cfg, 0, nil, nil, nil)
	x := tab.Begin()
	_, _ = x.Apply(&Event{Source: Source{Gateway: "g"}, Seq: 1, Kind: KindDecision, Tenant: "t", Allowed: true, TimeMicros: 0}, 0)
	x.Commit(1)
	x = tab.Begin()
	x.Expire(60 + 3600)
	if x.Stats().Expired != 0 {
		t.Fatal("expired at the boundary")
	}
	x.Expire(60 + 3601)
	var deleted int
	for _, c := range x.Changes() {
		if c.Deleted {
			deleted++
			if c.Row.Gran != Minute {
				t.Errorf("deleted %+v, only the minute row has passed", c.Row)
			}
		}
	}
	if deleted != 1 {
		t.Fatalf("deleted %d rows, want 1", deleted)
	}
}

// TestExpiredRowCountedAfresh: an event for a window its transaction read
// and then expired starts the row again (its old counts are gone), and
// the row is written, not deleted.
func TestExpiredRowCountedAfresh(t *testing.T) {
	t.Parallel()
	cfg := Config{Retention: map[Granularity]time.Duration{Minute: time.Hour}}
	tab := NewTable(cfg, 0, nil, nil, nil)
	x := tab.Begin()
	ev := Event{Source: Source{Gateway: "g"}, Seq: 1, Kind: KindDecision, Tenant: "t", KeyID: "k", Allowed: true, Cost: 1}
	for range 3 {
		if _, err := x.Apply(&ev, 0); err != nil {
			t.Fatal(err)
		}
		ev.Seq++
	}
	x.Commit(1)
	x = tab.Begin()
	for i := range 2 { // read and expired, then counted again
		if _, err := x.Apply(&ev, 60+3601); err != nil {
			t.Fatal(err)
		}
		ev.Seq++
		if i == 0 {
			x.Expire(60 + 3601)
		}
	}
	var got []Change
	for _, c := range x.Changes() {
		if c.Row != nil && c.Row.Gran == Minute {
			got = append(got, c)
		}
	}
	if len(got) != 1 || got[0].Deleted || got[0].Value.Allowed != 1 {
		t.Fatalf("minute row read, expired, then counted: %+v, want one write of 1 allowed", got)
	}
}

// TestSequencesCannotBeForgedIntoSilence feeds sources whose records are
// not all the gateway's, or whose gateway dropped many decisions in a row,
// and checks what is counted: a forged jump never makes the gateway's own
// later events duplicates, and a real long gap is still counted.
func TestSequencesCannotBeForgedIntoSilence(t *testing.T) {
	t.Parallel()
	const bound, run = 1000, 4
	src := Source{Gateway: "gw-1", Epoch: 7, Partition: 0}
	ev := func(seq uint64) Event {
		return Event{Source: src, Seq: seq, Kind: KindDecision, Tenant: "t", KeyID: "k", Endpoint: "/x", Allowed: true, Cost: 1,
			TimeMicros: 1_700_000_000_000_000}
	}
	seqs := func(from, to uint64) []Event {
		var out []Event
		for s := from; s <= to; s++ {
			out = append(out, ev(s))
		}
		return out
	}
	marker := func(last uint64) Event {
		return Event{Source: src, Seq: last + 1, Kind: KindEpochClosed, LastSeq: last}
	}
	cat := func(parts ...[]Event) []Event { return slices.Concat(parts...) }
	for _, tc := range []struct {
		name string
		in   []Event
		// what is counted: events applied, numbers missing, and the mark
		applied int
		missing uint64
		hwm     uint64
		check   func(t *testing.T, m Mark, s Stats)
	}{
		{
			name:    "a forged jump far ahead is held and the gateway's events go on counting",
			in:      cat(seqs(1, 33), []Event{ev(1_000_000)}, seqs(34, 100)),
			applied: 100, missing: 0, hwm: 100,
			check: func(t *testing.T, m Mark, s Stats) {
				if s.Held != 1 || s.Discarded != 1 || m.HeldCount != 0 {
					t.Errorf("held %d, discarded %d, still held %d: want the forged event held, then discarded", s.Held, s.Discarded, m.HeldCount)
				}
			},
		},
		{
			name:    "a forged jump is held across many gateway events and never applied",
			in:      cat(seqs(1, 10), []Event{ev(5000)}, seqs(11, 20), []Event{ev(5001)}, seqs(21, 30)),
			applied: 30, missing: 0, hwm: 30,
		},
		{
			name:    "a gateway that dropped more than the bound in a row is counted once the run confirms it",
			in:      cat(seqs(1, 10), seqs(5000, 5009)),
			applied: 10 + (10 - run), missing: 5000 - 11 + run, hwm: 5009,
			check: func(t *testing.T, m Mark, s Stats) {
				if s.Accepted != 1 || s.Held != run {
					t.Errorf("accepted %d runs, held %d events; want 1 and %d", s.Accepted, s.Held, run)
				}
			},
		},
		{
			name:    "a replayed held event does not confirm its run",
			in:      cat(seqs(1, 10), []Event{ev(5000), ev(5000), ev(5000), ev(5000), ev(5000)}),
			applied: 10, missing: 0, hwm: 10,
			check: func(t *testing.T, m Mark, s Stats) {
				if m.HeldCount != 1 || s.Duplicates != 4 {
					t.Errorf("held %d, duplicates %d; want 1 held, 4 duplicates", m.HeldCount, s.Duplicates)
				}
			},
		},
		{
			name:    "a forged jump within the bound leaves its gap open to the gateway's events",
			in:      cat(seqs(1, 10), []Event{ev(500)}, seqs(11, 600)),
			applied: 600, missing: 0, hwm: 600, // the forged 500 counts; the gateway's own 500 is its duplicate
			check: func(t *testing.T, m Mark, s Stats) {
				if s.Filled != 489 {
					t.Errorf("filled %d, want 489", s.Filled)
				}
			},
		},
		{
			name:    "a forged marker does not close a live source",
			in:      cat(seqs(1, 10), []Event{marker(10)}, seqs(11, 20)),
			applied: 20, missing: 0, hwm: 20,
			check: func(t *testing.T, m Mark, s Stats) {
				if s.AfterClose != 10 || !m.Closed {
					t.Errorf("after close %d, closed %v; want 10 and true", s.AfterClose, m.Closed)
				}
			},
		},
		{
			name:    "a marker counts the numbers used after the last delivered",
			in:      cat(seqs(1, 10), []Event{marker(15), marker(15)}),
			applied: 10, missing: 5, hwm: 10,
		},
		{
			name:    "a marker at or past a held run confirms it",
			in:      cat(seqs(1, 10), seqs(5000, 5001), []Event{marker(5003)}),
			applied: 10, missing: 5003 - 10, hwm: 5001,
		},
		{
			name:    "a marker below a held run discards it",
			in:      cat(seqs(1, 10), seqs(5000, 5001), []Event{marker(12)}),
			applied: 10, missing: 2, hwm: 10,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tab := NewTable(Config{MaxSeqJump: bound, ConfirmRun: run}, 0, nil, nil, nil)
			// Every event in its own transaction, committed: the marks
			// carry everything from one to the next.
			var total Stats
			applied := 0
			for i := range tc.in {
				x := tab.Begin()
				ok, err := x.Apply(&tc.in[i], 100)
				if err != nil {
					t.Fatal(err)
				}
				if ok && tc.in[i].Kind != KindEpochClosed {
					applied++
				}
				s := x.Stats()
				total.Held += s.Held
				total.Discarded += s.Discarded
				total.Accepted += s.Accepted
				total.Filled += s.Filled
				total.AfterClose += s.AfterClose
				total.Duplicates += s.Duplicates
				total.Missing += s.Missing
				x.Changes()
				x.Commit(int64(i + 1))
			}
			m := tab.Marks()[src]
			var allowed int64
			for i := range tab.rows.used {
				if e := tab.rows.slots.At(i); e.live && e.id.gran == Minute {
					allowed += e.allowed
				}
			}
			if applied != tc.applied || allowed != int64(tc.applied) {
				t.Errorf("applied %d (rows say %d), want %d", applied, allowed, tc.applied)
			}
			if m.Missing != tc.missing || m.HWM != tc.hwm {
				t.Errorf("mark %+v: want missing %d, hwm %d", m, tc.missing, tc.hwm)
			}
			if tc.check != nil {
				tc.check(t, m, total)
			}
		})
	}
}

// TestTotalsSaturate adds costs whose sum overflows int64: the row stays at
// the largest int64 instead of wrapping negative.
func TestTotalsSaturate(t *testing.T) {
	t.Parallel()
	tab := NewTable(Config{}, 0, nil, nil, nil)
	x := tab.Begin()
	for seq := range uint64(2) {
		ev := Event{Source: Source{Gateway: "g", Epoch: 1}, Seq: seq + 1, Kind: KindReport, Tenant: "t", KeyID: "k",
			Cost: 9_000_000_000_000_000_000, TimeMicros: 1_700_000_000_000_000}
		if _, err := x.Apply(&ev, 0); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range x.Changes() {
		if c.Row != nil && c.Value.Cost != math.MaxInt64 {
			t.Errorf("row %v: cost %d, want %d", c.Row.Gran, c.Value.Cost, int64(math.MaxInt64))
		}
	}
	for _, tc := range []struct{ a, b, want int64 }{
		{1, 2, 3}, {math.MaxInt64, 1, math.MaxInt64}, {math.MinInt64, -1, math.MinInt64}, {-5, 3, -2}, {math.MaxInt64, math.MinInt64, -1},
	} {
		if got := AddSat(tc.a, tc.b); got != tc.want {
			t.Errorf("AddSat(%d, %d) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

// TestTxnSizedFromTheLast (not parallel: it counts the process's
// allocations) checks that a transaction's row map and slices start at
// the size of the last committed one: a transaction of new keys allocates
// no more than its rows' rule lists, where a map grown by rehashing would
// allocate its tables again at every doubling.
func TestTxnSizedFromTheLast(t *testing.T) {
	const events = 4096
	tab := NewTable(Config{}, 0, nil, nil, nil)
	src := Source{Gateway: "gw", Epoch: 1}
	seq := uint64(0)
	keys := testnet.Numbered("key-%06d", 2*events)
	run := func(from int) (mallocs uint64) {
		x := tab.Begin()
		evs := make([]Event, events)
		for i := range evs {
			seq++
			evs[i] = Event{Source: src, Seq: seq, Kind: KindDecision, Tenant: "t", KeyID: keys[from+i], Endpoint: "/e",
				Rule: "r", Allowed: true, Cost: 1, TimeMicros: 1_700_000_000_000_000}
		}
		var err error
		mallocs = memtest.Mallocs(func() {
			for i := range evs {
				if _, err = x.Apply(&evs[i], 1_700_000_000); err != nil {
					return
				}
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		x.Changes()
		x.Commit(int64(from + 1))
		return mallocs
	}
	first := run(0) // the map grows from empty
	second := run(events)
	// Each new row allocates its rule list (3 rows per event); growing the
	// transaction's map and slices to 3 × 4096 rows is about a hundred more.
	// The count is the process's: a runtime or test-framework goroutine
	// may allocate meanwhile (a clean-clone CI run counted one past a
	// margin of 8), so the margin is 16, still far below the growth.
	rows := uint64(3 * events)
	if want := rows + 16; second > want {
		t.Errorf("second transaction of %d new rows: %d allocations, want at most %d (the first, unsized: %d)", rows, second, want, first)
	}
	if first <= second {
		t.Errorf("the first transaction (%d allocations) should pay the map's growth that the second (%d) does not", first, second)
	}
}

// held is the row the table holds for k, if it does.
func (t *Table) held(k RowKey) (Row, bool) {
	i, ok := t.rows.lookup(&k)
	if !ok {
		return Row{}, false
	}
	var r Row
	t.rows.row(i, &r)
	return r, true
}

// TestEvictedRowsReleaseTheirMemory fills the table with rows of new keys,
// closes and evicts them, again and again: what the table holds is bounded
// by the rows not yet evicted, not by the keys ever seen — the slots, the
// interned strings and their arena are reused or compacted — and the rows
// read back through the loader keep their counts.
func TestEvictedRowsReleaseTheirMemory(t *testing.T) {
	t.Parallel()
	const keysPerRound, rounds = 2000, 8
	disk := memLoader{}
	tab := NewTable(Config{Lateness: time.Second}, 0, disk, nil, nil)
	src := Source{Gateway: "gw", Epoch: 1}
	seq := uint64(0)
	now := int64(1_700_000_000)
	maxSlots := 0
	for round := range rounds {
		x := tab.Begin()
		for i := range keysPerRound {
			seq++
			ev := Event{Source: src, Seq: seq, Kind: KindDecision, Tenant: "t", KeyID: fmt.Sprintf("round-%d-key-%06d", round, i),
				KeyPrefix: fmt.Sprintf("pre-%d-%d", round, i), Endpoint: "/e", Rule: fmt.Sprint("r", round), Allowed: true, Cost: 2,
				TimeMicros: now * 1_000_000}
			if _, err := x.Apply(&ev, now); err != nil {
				t.Fatal(err)
			}
		}
		now += 2 * 86400 // every window of the round closes
		if err := x.CloseDue(now); err != nil {
			t.Fatal(err)
		}
		for _, c := range x.Changes() {
			if c.Row != nil && !c.Deleted {
				disk[*c.Row] = c.Value
			}
		}
		x.Commit(int64(round + 1))
		maxSlots = max(maxSlots, int(tab.rows.used))
		if n := tab.Evict(int64(round + 1)); n != 3*keysPerRound {
			t.Fatalf("round %d: evicted %d rows, want %d", round, n, 3*keysPerRound)
		}
		if tab.Len() != 0 || tab.rows.series.Live() != 0 || tab.rows.prefixes.Live() != 0 || tab.rows.sets.Live() != 0 {
			t.Fatalf("round %d: after evicting everything the table holds %d rows, %d series, %d prefixes, %d rule lists",
				round, tab.Len(), tab.rows.series.Live(), tab.rows.prefixes.Live(), tab.rows.sets.Live())
		}
	}
	if maxSlots != 3*keysPerRound {
		t.Errorf("the table grew to %d slots, want the %d of one round (slots are reused)", maxSlots, 3*keysPerRound)
	}
	// The series arena: one round's keys are ≈ 40 B each; without
	// compaction it would hold all rounds'.
	if n := tab.rows.series.ArenaCap(); n > 2*keysPerRound*64 {
		t.Errorf("series arena of %d B after %d rounds of %d keys: not compacted", n, rounds, keysPerRound)
	}
	// Read back through the table (loader) in a new transaction: counts
	// kept, and a late event adds to them.
	x := tab.Begin()
	seq++
	late := Event{Source: src, Seq: seq, Kind: KindDecision, Tenant: "t", KeyID: "round-3-key-000007", Endpoint: "/e",
		Allowed: true, Cost: 1, TimeMicros: (now - (rounds-3)*2*86400) * 1_000_000}
	if _, err := x.Apply(&late, now); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, c := range x.Changes() {
		if c.Row != nil && c.Row.KeyID == late.KeyID && c.Row.Gran == Day {
			found = true
			if c.Value.Allowed != 2 || c.Value.Cost != 3 || c.Value.KeyPrefix != "pre-3-7" || !slices.Equal(c.Value.Rules, []string{"r3"}) || !c.Publish {
				t.Errorf("late event's day row: %+v (publish %v), want 2 allowed, cost 3, prefix pre-3-7, rules [r3], republished", c.Value, c.Publish)
			}
		}
	}
	if !found {
		t.Error("the late event changed no day row")
	}
}

// TestHeldRowMemory (not parallel: it reads the process's heap) holds the
// rows of 20 000 keys, three each, and checks what they take: the 72-byte
// slot of each row and ≈ 80 bytes of each key's interned strings, with the
// slack of slices that grow by a quarter — at most 160 bytes per row
// (a map of *Row by string-keyed RowKey took ≈ 266).
func TestHeldRowMemory(t *testing.T) {
	const keys, perTxn = 20_000, 5_000
	names, tenants := testnet.Numbered("key-%018d", keys), testnet.Numbered("tenant-%d", 100)
	var tab *Table
	held := memtest.Retained(func() any {
		evs := make([]Event, perTxn) // scratch: not held once built
		tab = NewTable(Config{}, 0, nil, nil, nil)
		for c := 0; c < keys; c += perTxn {
			x := tab.Begin()
			for i := range evs {
				evs[i] = Event{Source: Source{Gateway: "gw", Epoch: 1}, Seq: uint64(c + i + 1), Kind: KindDecision,
					Tenant: tenants[i%len(tenants)], KeyID: names[c+i], KeyPrefix: "sk_prod_ab…", Endpoint: "/v1/orders",
					Rule: "orders", Allowed: true, Cost: 1, TimeMicros: 1_700_000_000_000_000}
				if _, err := x.Apply(&evs[i], 1_700_000_000); err != nil {
					t.Fatal(err)
				}
			}
			x.Changes()
			x.Commit(int64(c + 1))
		}
		return tab
	})
	rows := tab.Len()
	if rows != 3*keys {
		t.Fatalf("%d rows held, want %d", rows, 3*keys)
	}
	per := float64(held) / float64(rows)
	t.Logf("%d rows: %.0f B of heap each", rows, per)
	if per > 160 {
		t.Errorf("%d rows held in %.0f B each, want at most 160", rows, per)
	}
}
