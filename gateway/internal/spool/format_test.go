package spool

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"slices"
	"testing"
)

func testRecords(rng *rand.Rand, n, maxLen int) []Record {
	recs := make([]Record, n)
	for i := range recs {
		p := make([]byte, rng.IntN(maxLen+1))
		for j := range p {
			p[j] = byte(rng.Uint32())
		}
		recs[i] = Record{Partition: rng.Int32N(64) - 8, Payload: p}
	}
	return recs
}

func equalRecords(a, b []Record) bool {
	return slices.EqualFunc(a, b, func(x, y Record) bool {
		return x.Partition == y.Partition && bytes.Equal(x.Payload, y.Payload)
	})
}

func mustEncode(t testing.TB, id uint64, recs []Record) []byte {
	t.Helper()
	b, err := appendSegment(nil, id, recs)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(b)) != segmentSize(recs) {
		t.Fatalf("encoded %d bytes, segmentSize says %d", len(b), segmentSize(recs))
	}
	return b
}

func TestDecodeSegment(t *testing.T) {
	t.Parallel()
	recs := []Record{{1, []byte("alpha")}, {2, nil}, {-3, []byte("gamma-gamma")}}
	enc := mustEncode(t, 7, recs)
	frame0 := headerSize
	frame1 := frame0 + frameSize + 5
	frame2 := frame1 + frameSize
	trailer := frame2 + frameSize + 11
	flip := func(off int) []byte {
		b := bytes.Clone(enc)
		b[off] ^= 0x40
		return b
	}
	withZeros := func(n, zeros int) []byte {
		return append(bytes.Clone(enc[:n]), make([]byte, zeros)...)
	}

	cases := []struct {
		name    string
		in      []byte
		want    []Record // records decoded
		wantErr error    // nil, errTorn or ErrCorrupt
	}{
		{"whole", enc, recs, nil},
		{"empty file", nil, nil, errTorn},
		{"cut in header", enc[:10], nil, errTorn},
		{"zeros only", make([]byte, 64), nil, errTorn},
		{"cut after header", enc[:frame0], nil, errTorn},
		{"cut in first frame header", enc[:frame0+5], nil, errTorn},
		{"cut in first payload", enc[:frame0+frameSize+2], nil, errTorn},
		{"cut between records", enc[:frame2], recs[:2], errTorn},
		{"cut before trailer", enc[:trailer], recs, errTorn},
		{"cut in trailer", enc[:trailer+6], recs, errTorn},
		{"last record's size reached the disk, its data did not", withZeros(frame2, trailer+frameSize-frame2), recs[:2], errTorn},
		{"cut in a frame header, zeros after", withZeros(frame1+3, 40), recs[:1], errTorn},
		{"bad trailer checksum at the end", flip(trailer + 9), recs, errTorn},
		{"bad header magic", flip(1), nil, ErrCorrupt},
		{"bad header checksum", flip(17), nil, ErrCorrupt},
		{"damaged first payload, records after", flip(frame0 + frameSize + 1), nil, ErrCorrupt},
		{"damaged partition", flip(frame1 + 4), recs[:1], ErrCorrupt},
		{"damaged last payload", flip(frame2 + frameSize), recs[:2], ErrCorrupt},
		{"bytes after trailer", append(bytes.Clone(enc), 1), recs, ErrCorrupt},
		{"zeros after trailer", append(bytes.Clone(enc), 0, 0), recs, ErrCorrupt},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, got, valid, err := decodeSegment(tc.in, nil)
			switch {
			case tc.wantErr == nil && err != nil, tc.wantErr != nil && !errors.Is(err, tc.wantErr):
				t.Fatalf("error %v, want %v", err, tc.wantErr)
			}
			if !equalRecords(got, tc.want) {
				t.Fatalf("decoded %d records, want %d: %q", len(got), len(tc.want), got)
			}
			if errors.Is(err, errTorn) && valid > 0 {
				// valid is where the intact records end: re-encoding
				// them gives the same bytes up to there.
				if !bytes.Equal(tc.in[headerSize:valid], mustEncode(t, 7, got)[headerSize:valid]) {
					t.Fatalf("valid = %d does not end the intact records", valid)
				}
			}
		})
	}

	t.Run("other version", func(t *testing.T) {
		b := bytes.Clone(enc)
		binary.LittleEndian.PutUint16(b[4:], 2)
		binary.LittleEndian.PutUint32(b[16:], crc32.Checksum(b[:16], castagnoli))
		if _, _, _, err := decodeSegment(b, nil); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("version 2: %v, want ErrCorrupt", err)
		}
	})
	t.Run("payloads do not overlap", func(t *testing.T) {
		_, got, _, err := decodeSegment(bytes.Clone(enc), nil)
		if err != nil {
			t.Fatal(err)
		}
		_ = append(got[0].Payload, "XXXXXXXXXXXXXXXX"...)
		if !equalRecords(got, recs) {
			t.Fatal("appending to one payload changed another")
		}
	})
}

// FuzzDecodeSegment feeds arbitrary bytes to the decoder: it never panics,
// never returns more records than the bytes can hold, and a segment it
// accepts whole re-encodes to exactly the same bytes (one encoding per
// content, so nothing is silently skipped).
func FuzzDecodeSegment(f *testing.F) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 8 {
		enc, _ := appendSegment(nil, uint64(i+1), testRecords(rng, i, 40))
		f.Add(enc)
		f.Add(enc[:len(enc)/2])
	}
	f.Add([]byte{})
	f.Add([]byte("TGSP"))
	f.Fuzz(func(t *testing.T, b []byte) {
		id, recs, valid, err := decodeSegment(b, nil)
		if valid > len(b) || valid < 0 {
			t.Fatalf("valid = %d of %d bytes", valid, len(b))
		}
		if int64(len(recs))*frameSize > int64(len(b)) {
			t.Fatalf("%d records from %d bytes", len(recs), len(b))
		}
		if err != nil {
			if !errors.Is(err, errTorn) && !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v is neither torn nor corrupt", err)
			}
			return
		}
		re, err := appendSegment(nil, id, recs)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(re, b) {
			t.Fatalf("accepted %x, re-encoded as %x", b, re)
		}
	})
}

// FuzzSegmentRoundTrip builds records from the fuzzer's bytes and checks
// that decode(encode(x)) == x, and that every truncation of the encoding,
// bare or followed by zeros (what a crash leaves), decodes as torn with a
// prefix of x and never as other records.
func FuzzSegmentRoundTrip(f *testing.F) {
	f.Add(uint64(1), []byte("hello world, this is a record"), uint16(3), uint8(0))
	f.Add(uint64(42), bytes.Repeat([]byte{0}, 300), uint16(100), uint8(17))
	f.Add(uint64(1<<63), []byte{}, uint16(0), uint8(255))
	f.Fuzz(func(t *testing.T, id uint64, data []byte, cut uint16, zeros uint8) {
		// Split data into records: each byte b starts a record of b%32
		// payload bytes taken from what follows.
		var recs []Record
		for i := 0; i < len(data); {
			n := int(data[i] % 32)
			i++
			end := min(i+n, len(data))
			recs = append(recs, Record{Partition: int32(n) - 4, Payload: data[i:end]})
			i = end
		}
		enc := mustEncode(t, id, recs)
		gotID, got, valid, err := decodeSegment(enc, nil)
		if err != nil || gotID != id || valid != len(enc) || !equalRecords(got, recs) {
			t.Fatalf("round trip: id %d, %d records, valid %d, %v; want id %d, %d records", gotID, len(got), valid, err, id, len(recs))
		}
		k := int(cut) % len(enc)
		torn := append(bytes.Clone(enc[:k]), make([]byte, zeros)...)
		_, got, _, err = decodeSegment(torn, nil)
		if !errors.Is(err, errTorn) {
			t.Fatalf("cut at %d of %d, %d zeros: %v, want torn", k, len(enc), zeros, err)
		}
		if len(got) > len(recs) || !equalRecords(got, recs[:len(got)]) {
			t.Fatalf("cut at %d: decoded records that are not a prefix of the segment's", k)
		}
	})
}

// BenchmarkSegmentCodec measures the CPU cost of the format alone: encoding
// and decoding (checksums included) a segment of 1000 records of 150 bytes.
func BenchmarkSegmentCodec(b *testing.B) {
	recs := testRecords(rand.New(rand.NewPCG(1, 1)), 1000, 0)
	for i := range recs {
		recs[i].Payload = bytes.Repeat([]byte{byte(i)}, 150)
	}
	buf, _ := appendSegment(nil, 1, recs)
	out := make([]Record, 0, len(recs))
	b.Run("encode", func(b *testing.B) {
		b.SetBytes(int64(len(recs) * 150))
		b.ReportAllocs()
		for b.Loop() {
			buf, _ = appendSegment(buf[:0], 1, recs)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(recs)), "ns/record")
	})
	b.Run("decode", func(b *testing.B) {
		b.SetBytes(int64(len(recs) * 150))
		b.ReportAllocs()
		for b.Loop() {
			_, got, _, err := decodeSegment(buf, out[:0])
			if err != nil || len(got) != len(recs) {
				b.Fatalf("%d records, %v", len(got), err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(recs)), "ns/record")
	})
}
