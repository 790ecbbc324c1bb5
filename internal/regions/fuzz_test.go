package regions

import (
	"context"
	"encoding/binary"
	"testing"
	"time"
)

// fuzzCallLimit is how long one Ledger call may take on any input: far
// above what a call takes, far below a spin over the slots of a loan.
const fuzzCallLimit = 2 * time.Second

// fuzzReader hands out the fuzzer's bytes as fields, zeros once they run
// out.
type fuzzReader struct{ b []byte }

func (r *fuzzReader) byte() byte {
	if len(r.b) == 0 {
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *fuzzReader) int64() int64 {
	var buf [8]byte
	n := copy(buf[:], r.b)
	r.b = r.b[n:]
	return int64(binary.LittleEndian.Uint64(buf[:]))
}

// slot is a slot near now or, one time in four, any int64.
func (r *fuzzReader) slot(now, slotLen int64) int64 {
	v := r.int64()
	if r.byte()%4 == 0 {
		return v
	}
	return now/slotLen + v%2048
}

// Orders, transfers and admissions decoded from arbitrary bytes: a Ledger
// answers each with a result, a refusal or an error, never a panic, and
// in bounded time whatever slots they name.
func FuzzLedgerMessages(f *testing.F) {
	// A transfer of windows 10^12 ahead, then a rejected admission.
	le := binary.LittleEndian
	farSeed := le.AppendUint64([]byte{2, 0, 0}, uint64(far))
	farSeed = le.AppendUint64(append(farSeed, 0), 1)
	farSeed = le.AppendUint64(append(farSeed, 1, 0, 0), 50)
	farSeed = le.AppendUint64(append(farSeed, 3, 0, 1), 0)
	farSeed = le.AppendUint64(append(farSeed, 1), 0)
	farSeed = le.AppendUint64(append(farSeed, 1, 0, 0), 0)
	f.Add(append(farSeed, 200))
	f.Add([]byte{0, 1, 10, 0, 0, 0, 0, 0, 0, 0, 1})
	f.Add([]byte{2, 1, 0, 0x10, 0xa5, 0xd4, 0xe8, 0, 0, 0, 0, 3, 200})
	f.Add([]byte{0, 2, 10, 0, 0, 0, 0, 0, 0, 0, 1, 1, 2, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x3f, 0, 3, 200})
	limits := []Limit{
		{Kind: FixedWindow, Units: 300, Window: sec},
		{Kind: FixedWindow, Units: 30, Window: 400_000},
		{Kind: SlidingWindow, Units: 300, Window: sec},
		{Kind: SlidingWindow, Units: 7, Window: 10 * sec},
		{Kind: Bucket, Units: 300, Window: sec},
		{Kind: Bucket, Units: 1, Window: 3 * sec},
	}
	cfg := Config{}.WithDefaults()
	fleet := EqualFleet("r1", "r2", "r3")
	f.Fuzz(func(t *testing.T, data []byte) {
		ledgers := map[string]*Ledger{}
		for _, name := range []string{"r1", "r2"} {
			ledgers[name] = newLedger(t, cfg, fleet, name)
		}
		ctx := context.Background()
		r := &fuzzReader{b: data}
		now := int64(10 * sec)
		for calls := 0; len(r.b) > 0 && calls < 64; calls++ {
			op := r.byte()
			lim := limits[int(r.byte())%len(limits)]
			now += int64(r.byte()) * 50_000
			from, to := "r1", "r2"
			if op&0x80 != 0 {
				from, to = to, from
			}
			first := r.slot(now, lim.slotLen(cfg))
			last := first + r.int64()%(maxLoanSlots+2)
			if r.byte()%4 == 0 {
				last = r.int64()
			}
			loan := Loan{
				ID:      LoanID{Epoch: NewEpoch(1, 0), Seq: uint64(r.byte() % 4)},
				Counter: "c" + string(rune('a'+int(r.byte()%3))),
				Limit:   lim, From: from, To: to,
				Units: r.int64() % (lim.Units + 2), First: first, Last: last,
			}
			start := time.Now()
			switch op % 4 {
			case 0, 1:
				_, _, _ = ledgers[from].Give(ctx, &Order{Epoch: loan.ID.Epoch, Loan: loan, Extend: op%4 == 1}, r.int64()%(lim.Units+1), now)
			case 2:
				_, _, _ = ledgers[to].Receive(ctx, &Transfer{Loan: loan}, now)
			default:
				_, _ = ledgers[to].Admit(loan.Counter, lim, int64(r.byte()), now)
				_, _ = ledgers[from].State(ctx, loan.Counter, lim, now)
				_, _ = ledgers[to].Active(ctx, now)
			}
			if d := time.Since(start); d > fuzzCallLimit {
				t.Fatalf("call %d (op %d, slots %d to %d) took %v", calls, op%4, loan.First, loan.Last, d)
			}
		}
	})
}
