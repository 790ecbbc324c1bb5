package windows

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
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
				sec := floorDiv(ev.TimeMicros, 1_000_000)
				for _, g := range All {
					k := RowKey{Partition: 3, Tenant: ev.Tenant, KeyID: ev.KeyID, Endpoint: ev.Endpoint, Gran: g, Start: sec - mod(sec, g.Seconds())}
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
				// The reference: what this committed prefix adds.
				marks := tab.Marks()
				for i := range n {
					ev := queue[i]
					m := marks[ev.Source]
					if m.Closed || ev.Seq <= m.HWM {
						continue
					}
					if ev.Kind == KindEpochClosed {
						if ev.LastSeq > m.HWM {
							wantMissing += ev.LastSeq - m.HWM
						}
						m.Closed = true
						m.HWM = max(m.HWM, ev.LastSeq, ev.Seq)
					} else {
						wantMissing += ev.Seq - m.HWM - 1
						m.HWM = ev.Seq
						count(ev)
					}
					marks[ev.Source] = m
				}
				written++
				for _, c := range changes {
					if c.Row != nil && !c.Deleted {
						disk[*c.Row] = c.Value
					}
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
				if e, held := tab.rows[k]; held {
					r, ok = *e.row, true
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
