package tollgatev1_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

func TestCutLen(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		s    string
		max  int
		want int
	}{
		{"fits", "/v1/items", 9, 9},
		{"empty", "", 0, 0},
		{"ascii", "abcdefgh", 6, 3},
		{"no room for the mark", "abcdef", 2, 0},
		{"never splits a rune", "aé" + strings.Repeat("x", 10), 5, 1},
		{"keeps a whole rune", "aébc" + strings.Repeat("x", 10), 6, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := tollgatev1.CutLen(tc.s, tc.max)
			if n != tc.want {
				t.Fatalf("CutLen(%q, %d) = %d, want %d", tc.s, tc.max, n, tc.want)
			}
			out := tc.s[:n]
			if n < len(tc.s) {
				out += tollgatev1.TruncationMark
			}
			if len(out) > max(tc.max, len(tollgatev1.TruncationMark)) {
				t.Fatalf("cut %q is %d bytes, more than %d", out, len(out), tc.max)
			}
			if !utf8.ValidString(out) {
				t.Fatalf("cut %q is not valid UTF-8", out)
			}
		})
	}
}

func FuzzCutLen(f *testing.F) {
	f.Add("/v1/ünïcode/path", 7)
	f.Fuzz(func(t *testing.T, s string, max int) {
		if max < 0 || max > 1<<16 {
			return
		}
		n := tollgatev1.CutLen(s, max)
		if n > len(s) || n < 0 {
			t.Fatalf("CutLen(%q, %d) = %d", s, max, n)
		}
		if n < len(s) && n+len(tollgatev1.TruncationMark) > max && n != 0 {
			t.Fatalf("CutLen(%q, %d) = %d: the cut and its mark exceed the bound", s, max, n)
		}
		if utf8.ValidString(s) && !utf8.ValidString(s[:n]) {
			t.Fatalf("CutLen(%q, %d) = %d splits a rune", s, max, n)
		}
	})
}
