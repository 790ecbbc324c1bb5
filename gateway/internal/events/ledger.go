package events

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"path/filepath"
)

// The sequence ledger: the decision path's counters of the next sequence
// number per partition, kept in a file of shared memory (tmpfs, /dev/shm by
// default) mapped into the process, so that each number is "written" by
// the store that takes it, at no cost, and the file holds the last number
// used when the process is SIGKILLed: the kernel keeps the pages of a
// shared mapping after the process died. The next start reads it and closes
// the killed epoch with the last number used rather than the last one
// reserved, so the aggregator counts as missing exactly what was lost (not
// up to a reservation more per partition). tmpfs does not survive a reboot:
// after a machine crash the file is gone and the markers fall back to the
// reservations in the spool's META, an upper bound.
//
// Layout, 64-bit words in the machine's byte order: ledgerMagic, the epoch, the partition
// count, then the next number of each partition. The epoch is written last
// when a new epoch starts, so a file left half-written names no epoch that
// META knows.

// ledgerMagic is the first word of a ledger file ("TGSEQ" and version 1).
const ledgerMagic = 0x01_0000_5145_5347_54

// ledgerHeader is the header's size in words.
const ledgerHeader = 3

// DefaultLedgerDir is where the sequence ledger lives unless
// Config.LedgerDir says otherwise.
const DefaultLedgerDir = "/dev/shm"

// ledgerPath is the ledger file of a spool directory: one per spool, so
// one per producer (the spool's lock makes it so).
func ledgerPath(dir, spoolDir string) string {
	abs, err := filepath.Abs(spoolDir)
	if err != nil {
		abs = spoolDir
	}
	sum := sha256.Sum256([]byte(abs))
	return filepath.Join(dir, fmt.Sprintf("tollgate-events-%x.seq", sum[:12]))
}

// ledgerState is what a ledger file says about an earlier run.
type ledgerState struct {
	epoch uint64
	used  []uint64 // the last number used on each partition
}

// decodeLedger reads the state a ledger's words hold; ok is false when the
// words are not a complete ledger.
func decodeLedger(b []byte) (st ledgerState, ok bool) {
	if len(b) < 8*ledgerHeader || binary.NativeEndian.Uint64(b) != ledgerMagic {
		return st, false
	}
	st.epoch = binary.NativeEndian.Uint64(b[8:])
	n := binary.NativeEndian.Uint64(b[16:])
	if st.epoch == 0 || n == 0 || n > uint64(len(b)/8-ledgerHeader) {
		return st, false
	}
	st.used = make([]uint64, n)
	for q := range st.used {
		next := binary.NativeEndian.Uint64(b[8*(ledgerHeader+q):])
		if next == 0 {
			return ledgerState{}, false
		}
		st.used[q] = next - 1
	}
	return st, true
}

// exactClose replaces, in the epochs to close, the reservations of the
// epoch the ledger names with the numbers it says were used, when the
// partition counts agree. It reports whether it did.
func exactClose(closing []epochState, st ledgerState) bool {
	for i := range closing {
		e := &closing[i]
		if e.Epoch != st.epoch || len(e.Reserved) != len(st.used) {
			continue
		}
		e.Reserved = append([]uint64(nil), st.used...)
		return true
	}
	return false
}
