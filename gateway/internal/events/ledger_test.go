//go:build linux

package events

import (
	"encoding/binary"
	"os"
	"reflect"
	"testing"
)

func nativePut(b []byte, v uint64) { binary.NativeEndian.PutUint64(b, v) }

// TestLedger runs a ledger through a life: created, started for an epoch,
// counted into, left by a killed process, read back by the next one; a
// second opener of the same ledger and a directory that is not tmpfs are
// refused; a graceful stop deletes it.
func TestLedger(t *testing.T) {
	t.Parallel()
	dir := DefaultLedgerDir
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("%s: %v (the sequence ledger needs a tmpfs there)", dir, err)
	}
	spoolDir := t.TempDir()
	l, err := openLedger(dir, spoolDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(ledgerPath(dir, spoolDir)) })
	if l.prevOK {
		t.Fatalf("a new ledger holds %+v", l.prev)
	}
	if _, err := openLedger(dir, spoolDir); err == nil {
		t.Fatal("a second producer opened the same ledger")
	}
	next, err := l.counters(3)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(l.path); err != nil {
		t.Fatal(err)
	} else if st, ok := decodeLedger(b); ok {
		t.Fatalf("a ledger mapped but not begun names %+v", st)
	}
	next[0], next[1], next[2] = 101, 1, 7 // numbers 1..100 and 1..6 used
	l.begin(42)
	// A killed process leaves the file as it was: another open reads it.
	b, err := os.ReadFile(l.path)
	if err != nil {
		t.Fatal(err)
	}
	st, ok := decodeLedger(b)
	if !ok || st.epoch != 42 || !reflect.DeepEqual(st.used, []uint64{100, 0, 6}) {
		t.Fatalf("ledger reads %+v %v", st, ok)
	}
	closing := []epochState{{Epoch: 41, Reserved: []uint64{5, 5, 5}}, {Epoch: 42, Reserved: []uint64{20_100, 10_000, 10_006}}}
	if !exactClose(closing, st) || !reflect.DeepEqual(closing[1].Reserved, []uint64{100, 0, 6}) ||
		!reflect.DeepEqual(closing[0].Reserved, []uint64{5, 5, 5}) {
		t.Fatalf("closing %+v", closing)
	}
	if exactClose([]epochState{{Epoch: 42, Reserved: []uint64{1, 2}}}, st) {
		t.Fatal("a ledger of 3 partitions closed an epoch of 2")
	}
	l.close(false)
	l, err = openLedger(dir, spoolDir)
	if err != nil || !l.prevOK || l.prev.epoch != 42 {
		t.Fatalf("reopened: %+v %v", l, err)
	}
	l.close(true)
	if _, err := os.Stat(l.path); !os.IsNotExist(err) {
		t.Fatalf("a graceful stop left the ledger: %v", err)
	}
	if _, err := openLedger(t.TempDir(), spoolDir); err == nil {
		t.Fatal("a ledger opened on a directory that is not tmpfs")
	}
}

func TestDecodeLedgerRefusesPartialFiles(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		words []uint64
	}{
		{"empty", nil},
		{"no magic", []uint64{1, 42, 1, 5}},
		{"no epoch yet", []uint64{ledgerMagic, 0, 1, 5}},
		{"cut short", []uint64{ledgerMagic, 42, 3, 5}},
		{"a zero counter", []uint64{ledgerMagic, 42, 2, 5, 0}},
	} {
		b := make([]byte, 8*len(tc.words))
		for i, w := range tc.words {
			nativePut(b[8*i:], w)
		}
		if st, ok := decodeLedger(b); ok {
			t.Errorf("%s: decoded %+v", tc.name, st)
		}
	}
}
