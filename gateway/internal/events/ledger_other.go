//go:build !linux

package events

import "errors"

// ledger is not kept on this platform: a SIGKILLed epoch is closed with
// its reservations.
type ledger struct {
	prev   ledgerState
	prevOK bool
}

func openLedger(dir, spoolDir string) (*ledger, error) {
	return nil, errors.New("events: sequence ledger: not supported on this platform")
}

func (l *ledger) counters(parts int32) ([]uint64, error) {
	return nil, errors.New("events: sequence ledger: not supported on this platform")
}

func (l *ledger) begin(epoch uint64) {}

func (l *ledger) close(remove bool) {}
