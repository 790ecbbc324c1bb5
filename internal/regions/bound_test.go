package regions

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testwait"
)

// far is a slot 10^12 slots ahead of the tests' clock.
const far = int64(1_000_000_000_000)

// Work per message is bounded: a transfer or order naming slots far in the
// future is answered (applied or refused) promptly, and so is every call
// after it, never by walking every slot up to the loan's end.
func TestLedgerBoundsWorkForFarLoans(t *testing.T) {
	fixed := Limit{Kind: FixedWindow, Units: 300, Window: sec}
	sliding := Limit{Kind: SlidingWindow, Units: 300, Window: sec}
	bucket := Limit{Kind: Bucket, Units: 300, Window: sec}
	id := LoanID{Epoch: NewEpoch(1, 0), Seq: 1}
	loan := func(lim Limit, first, last int64) Loan {
		return Loan{ID: id, Counter: "c", Limit: lim, From: "r1", To: "r2", Units: 50, First: first, Last: last}
	}
	// farTransferAndExtension: the receiver takes a far transfer, the
	// giver gives a loan and extends it far ahead, then both admit.
	farTransferAndExtension := func(lim Limit) func(ctx context.Context, giver, receiver *Ledger) error {
		return func(ctx context.Context, giver, receiver *Ledger) error {
			if _, _, err := receiver.Receive(ctx, &Transfer{Loan: loan(lim, far, far+1)}, 10*sec); err != nil {
				return err
			}
			if _, _, err := giver.Give(ctx, &Order{Epoch: id.Epoch, Loan: loan(lim, 10, 11)}, 0, 10*sec); err != nil {
				return err
			}
			if _, _, err := giver.Give(ctx, &Order{Epoch: id.Epoch, Extend: true, Loan: loan(lim, far, far+1)}, 0, 10*sec); err != nil {
				return err
			}
			if _, err := receiver.Admit("c", lim, 200, 10*sec+sec/2); err != nil {
				return err
			}
			_, err := giver.Admit("c", lim, 200, 10*sec+sec/2)
			return err
		}
	}
	tests := []struct {
		name string
		run  func(ctx context.Context, giver, receiver *Ledger) error
	}{
		{"fixed window: a far transfer, then a rejection's Retry-After", func(ctx context.Context, _, receiver *Ledger) error {
			if _, _, err := receiver.Receive(ctx, &Transfer{Loan: loan(fixed, far, far+1)}, 10*sec); err != nil {
				return err
			}
			_, err := receiver.Admit("c", fixed, 200, 10*sec+sec/2)
			return err
		}},
		{"fixed window: an order extending a loan far ahead", func(ctx context.Context, giver, _ *Ledger) error {
			if _, _, err := giver.Give(ctx, &Order{Epoch: id.Epoch, Loan: loan(fixed, 10, 11)}, 0, 10*sec); err != nil {
				return err
			}
			if _, _, err := giver.Give(ctx, &Order{Epoch: id.Epoch, Extend: true, Loan: loan(fixed, far, far+1)}, 0, 10*sec); err != nil {
				return err
			}
			_, err := giver.Admit("c", fixed, 200, 10*sec+sec/2)
			return err
		}},
		{"fixed window: a far order, then a rejection's Retry-After", func(ctx context.Context, giver, _ *Ledger) error {
			if _, _, err := giver.Give(ctx, &Order{Epoch: id.Epoch, Loan: loan(fixed, far, far+maxLoanSlots)}, 0, 10*sec); err != nil {
				return err
			}
			_, err := giver.Admit("c", fixed, 200, 10*sec+sec/2)
			return err
		}},
		{"sliding window: a far transfer and a far extension", farTransferAndExtension(sliding)},
		{"bucket: a far transfer and a far extension", farTransferAndExtension(bucket)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{}.WithDefaults()
			fleet := EqualFleet("r1", "r2", "r3")
			giver, receiver := newLedger(t, cfg, fleet, "r1"), newLedger(t, cfg, fleet, "r2")
			// A ledger that spins cannot be stopped: if the deadline
			// passes the test fails and the goroutine ends with the
			// test binary.
			done := make(chan error, 1)
			go func() { done <- tt.run(context.Background(), giver, receiver) }()
			var runErr error
			testwait.Eventually(t, 2*time.Second, func() error {
				select {
				case runErr = <-done:
					return nil
				default:
					return errors.New("the ledger is still working on the messages")
				}
			})
			if runErr != nil {
				t.Fatal(runErr)
			}
		})
	}
}
