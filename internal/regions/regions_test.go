package regions

import (
	"context"
	"errors"
	"slices"
	"testing"
)

func TestStaticShares(t *testing.T) {
	tests := []struct {
		name    string
		units   int64
		weights []int64
		want    []int64
		err     error
	}{
		{"equal thirds, the first takes the odd unit", 10, EqualFleet("a", "b", "c").weights(), []int64{4, 3, 3}, nil},
		{"fewer units than regions", 2, EqualFleet("a", "b", "c").weights(), []int64{1, 1, 0}, nil},
		{"nothing", 0, EqualFleet("a", "b").weights(), []int64{0, 0}, nil},
		{"largest remainder wins", 7, []int64{500_000, 300_000, 200_000}, []int64{4, 2, 1}, nil},
		{"weights below one keep the rest", 10, []int64{450_000, 450_000}, []int64{5, 4}, nil},
		{"negative units", -1, []int64{WeightScale}, nil, ErrInvalid},
		{"weights above one", 10, []int64{600_000, 600_000}, nil, ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := StaticShares(tt.units, tt.weights)
			if !errors.Is(err, tt.err) {
				t.Fatalf("StaticShares(%d, %v) error %v, want %v", tt.units, tt.weights, err, tt.err)
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("StaticShares(%d, %v) = %v, want %v", tt.units, tt.weights, got, tt.want)
			}
		})
	}
}

func (f Fleet) weights() []int64 {
	ws := make([]int64, len(f.Members))
	for i, m := range f.Members {
		ws[i] = m.Weight
	}
	return ws
}

const sec = 1_000_000

// newLedger is NewLedger of region name; an error fails the test at once.
func newLedger(t testing.TB, cfg Config, fleet Fleet, name string) *Ledger {
	t.Helper()
	l, err := NewLedger(cfg, fleet, name)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// newAgents is, for each region of names, a Region over a ledger of its
// own, all sending through q, started at start.
func newAgents(t testing.TB, cfg Config, fleet Fleet, q Transport, start int64, names ...string) (map[string]*Region, map[string]*Ledger) {
	t.Helper()
	regs, ledgers := map[string]*Region{}, map[string]*Ledger{}
	for _, name := range names {
		l := newLedger(t, cfg, fleet, name)
		r, err := NewRegion(cfg, fleet, name, l, q, nil, start)
		if err != nil {
			t.Fatal(err)
		}
		regs[name], ledgers[name] = r, l
	}
	return regs, ledgers
}

// lending is two regions of a fleet of three with a bucket of 300 (static
// shares 100 each), r1 having lent r2 50 units for periods 10 and 11.
func lending(t *testing.T) (cfg Config, giver, receiver *Ledger, tr *Transfer) {
	t.Helper()
	cfg = Config{}.WithDefaults()
	fleet := EqualFleet("r1", "r2", "r3")
	giver, receiver = newLedger(t, cfg, fleet, "r1"), newLedger(t, cfg, fleet, "r2")
	lim := Limit{Kind: Bucket, Units: 300, Window: 10 * sec}
	o := &Order{Epoch: NewEpoch(1, 0), Loan: Loan{ID: LoanID{Epoch: NewEpoch(1, 0), Seq: 1}, Counter: "c", Limit: lim, From: "r1", To: "r2", Units: 50, First: 10, Last: 11}}
	loan, refused, err := giver.Give(context.Background(), o, 0, 10*sec)
	if err != nil || refused != "" || loan.Units != 50 {
		t.Fatalf("give: %+v %q %v", loan, refused, err)
	}
	return cfg, giver, receiver, &Transfer{Loan: loan}
}

func share(t *testing.T, l *Ledger, now int64) int64 {
	t.Helper()
	st, err := l.State(context.Background(), "c", Limit{Kind: Bucket, Units: 300, Window: 10 * sec}, now)
	if err != nil {
		t.Fatal(err)
	}
	return st.Share
}

// A duplicated transfer must not add its units twice.
func TestLedgerAppliesATransferOnce(t *testing.T) {
	ctx := context.Background()
	_, giver, receiver, tr := lending(t)
	for i, at := range []int64{10*sec + 50_000, 10*sec + 400_000, 11 * sec} {
		applied, _, err := receiver.Receive(ctx, tr, at)
		if err != nil {
			t.Fatalf("receive %d: %v", i, err)
		}
		if applied != (i == 0) {
			t.Fatalf("receive %d applied=%v, want only the first applied", i, applied)
		}
	}
	if got := share(t, receiver, 11*sec+500_000); got != 150 {
		t.Fatalf("receiver's share %d, want 150", got)
	}
	if got := share(t, giver, 11*sec+500_000); got != 50 {
		t.Fatalf("giver's share %d, want 50", got)
	}
}

// The receiver stops using a loan the skew bound before its end; the
// giver reuses the units only the skew bound after it.
func TestLedgerLoanEndsWithTheSkewBand(t *testing.T) {
	ctx := context.Background()
	cfg, giver, receiver, tr := lending(t)
	if _, _, err := receiver.Receive(ctx, tr, 10*sec+50_000); err != nil {
		t.Fatal(err)
	}
	end := int64(12 * sec)
	tests := []struct {
		name   string
		ledger *Ledger
		at     int64
		want   int64
	}{
		{"receiver before the start band", receiver, 10*sec + cfg.Skew - 1, 100},
		{"receiver within the loan", receiver, 11 * sec, 150},
		{"receiver inside the end band", receiver, end - cfg.Skew, 100},
		{"giver at the end", giver, end, 50},
		{"giver just before end + skew", giver, end + cfg.Skew - 1, 50},
		{"giver at end + skew", giver, end + cfg.Skew, 100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := share(t, tt.ledger, tt.at); got != tt.want {
				t.Fatalf("share at %d = %d, want %d", tt.at, got, tt.want)
			}
		})
	}
}

// A region refuses the orders of a coordinator whose epoch is below the
// highest it has seen, and tells it so.
func TestRegionFencesADeposedCoordinator(t *testing.T) {
	ctx := context.Background()
	cfg := Config{}.WithDefaults()
	fleet := EqualFleet("r1", "r2", "r3")
	ledger := newLedger(t, cfg, fleet, "r1")
	var sent []Message
	r, err := NewRegion(cfg, fleet, "r1", ledger, TransportFunc(func(_ Node, m Message) { sent = append(sent, m) }), nil, 10*sec)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Handle(ctx, &Heartbeat{Epoch: NewEpoch(2, 1)}, 10*sec); err != nil {
		t.Fatal(err)
	}
	old := NewEpoch(1, 0)
	lim := Limit{Kind: Bucket, Units: 300, Window: 10 * sec}
	o := &Order{Epoch: old, Loan: Loan{ID: LoanID{Epoch: old, Seq: 1}, Counter: "c", Limit: lim, From: "r1", To: "r2", Units: 50, First: 10, Last: 11}}
	if err := r.Handle(ctx, o, 10*sec+1000); err != nil {
		t.Fatal(err)
	}
	if len(sent) != 1 {
		t.Fatalf("sent %d messages, want one Fenced", len(sent))
	}
	if f, ok := sent[0].(*Fenced); !ok || f.Epoch != NewEpoch(2, 1) {
		t.Fatalf("sent %#v, want Fenced{2.1}", sent[0])
	}
	if got := share(t, ledger, 10*sec+2000); got != 100 {
		t.Fatalf("share after a deposed order %d, want the static 100", got)
	}
}

// TestTypeName: every message type has its own label.
func TestTypeName(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for _, m := range []Message{&Report{}, &Order{}, &GiveResult{},
		&Transfer{}, &Heartbeat{}, &Fenced{}} {
		n := TypeName(m)
		if n == "unknown" || seen[n] {
			t.Errorf("%T: label %q (seen: %v)", m, n, seen)
		}
		seen[n] = true
	}
}
