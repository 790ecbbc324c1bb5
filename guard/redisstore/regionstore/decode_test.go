package regionstore

import (
	"errors"
	"testing"

	"github.com/tollgate/tollgate/internal/regions"
)

// FuzzParseLimit: a stored limit either parses to a limit that formats
// back to the same text, or is refused with ErrReply; never a panic.
func FuzzParseLimit(f *testing.F) {
	for _, s := range []string{"1:10:1000000", "3:1:1", "0:1:1", "1:-1:5", "1:1", "", "1:1:1:1", "9:99999999999999999999:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := parseLimit(s)
		if err != nil {
			if !errors.Is(err, ErrReply) {
				t.Fatalf("parseLimit(%q): %v, not ErrReply", s, err)
			}
			return
		}
		if back, err := parseLimit(formatLimit(l)); err != nil || back != l {
			t.Fatalf("parseLimit(%q) = %+v, which formats to %q and parses to %+v, %v", s, l, formatLimit(l), back, err)
		}
	})
}

// FuzzParseLoanID: a loan id either parses to the id that writes the same
// text, or is refused with ErrReply; never a panic.
func FuzzParseLoanID(f *testing.F) {
	for _, s := range []string{"1.0/1", "7.254/18446744073709551615", "1.-1/3", "0.0/0", "1.255/1", "01.0/1", "1.0", "/", "x.y/z"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := parseLoanID(s)
		if err != nil {
			if !errors.Is(err, ErrReply) {
				t.Fatalf("parseLoanID(%q): %v, not ErrReply", s, err)
			}
			return
		}
		if id.String() != s {
			t.Fatalf("parseLoanID(%q) = %v", s, id)
		}
	})
}

// FuzzDecodeState: a state reply of any shape is decoded or refused with
// ErrReply; never a panic.
func FuzzDecodeState(f *testing.F) {
	f.Add(int64(5), int64(2), "1.0/3", "r2", int64(4), int64(10), int64(11), uint8(8))
	f.Add(int64(0), int64(0), "", "", int64(0), int64(0), int64(0), uint8(3))
	f.Fuzz(func(t *testing.T, share, used int64, id, to string, units, first, last int64, n uint8) {
		full := []any{"ok", share, used, id, to, units, first, last}
		r := full[:min(int(n), len(full))]
		st, err := decodeState(r)
		if err != nil {
			if !errors.Is(err, ErrReply) {
				t.Fatalf("decodeState(%v): %v, not ErrReply", r, err)
			}
			return
		}
		if st.Share != share || st.Used != used {
			t.Fatalf("decodeState(%v) = %+v", r, st)
		}
		if len(st.Out) == 1 && (st.Out[0] != regions.LoanState{ID: st.Out[0].ID, To: to, Units: units, First: first, Last: last} || st.Out[0].ID.String() != id) {
			t.Fatalf("decodeState(%v) = %+v", r, st)
		}
	})
}
