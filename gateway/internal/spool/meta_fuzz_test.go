package spool

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzDecodeMeta feeds arbitrary bytes to META's decoder: it never panics,
// reports any refusal as ErrCorrupt, and a blob it accepts from a slotted
// file is what the chosen slot's header and checksum describe (encoding
// it again gives the same slot, padding aside).
func FuzzDecodeMeta(f *testing.F) {
	two := func(a, b []byte) []byte { return append(append([]byte(nil), a...), b...) }
	s1 := encodeMetaSlot([]byte(`{"epoch":1}`), metaMinSlot, 1)
	s2 := encodeMetaSlot([]byte(`{"epoch":2}`), metaMinSlot, 2)
	f.Add(two(s1, s2))
	f.Add(two(s1, make([]byte, len(s1))))
	f.Add(two(s2[:100], s1[:100]))
	f.Add(s1[:40])
	f.Add([]byte("TGMT\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		blob, st, err := decodeMeta(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v is not ErrCorrupt", err)
			}
			return
		}
		if len(blob) > len(b) {
			t.Fatalf("a blob of %d bytes from %d", len(blob), len(b))
		}
		if st.slotSize == 0 {
			return // the first format
		}
		slot := b[st.slot*st.slotSize : (st.slot+1)*st.slotSize]
		re := encodeMetaSlot(blob, st.slotSize, st.gen)
		n := metaSlotHeader + len(blob)
		if !bytes.Equal(re[:n], slot[:n]) {
			t.Fatalf("slot %d accepted as %q, generation %d, re-encodes differently", st.slot, blob, st.gen)
		}
	})
}
