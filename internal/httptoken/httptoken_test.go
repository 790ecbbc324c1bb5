package httptoken_test

import (
	"testing"

	"github.com/tollgate/tollgate/internal/httptoken"
)

func TestIs(t *testing.T) {
	for _, tc := range []struct {
		s    string
		want bool
	}{
		{"GET", true},
		{"X-Api-Key", true},
		{"application", true},
		{"!#$%&'*+-.^_`|~09azAZ", true},
		{"", false},
		{"two words", false},
		{"tab\there", false},
		{"colon:", false},
		{"slash/", false},
		{"quote\"", false},
		{"paren(", false},
		{"brace{", false},
		{"at@", false},
		{"nul\x00", false},
		{"del\x7f", false},
		{"é", false},
	} {
		if got := httptoken.Is(tc.s); got != tc.want {
			t.Errorf("Is(%q) = %v, want %v", tc.s, got, tc.want)
		}
	}
}

// TestChar holds Char to RFC 9110's tchar over every byte.
func TestChar(t *testing.T) {
	const extra = "!#$%&'*+-.^_`|~"
	for b := 0; b < 256; b++ {
		c := byte(b)
		want := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
		for i := 0; i < len(extra); i++ {
			want = want || c == extra[i]
		}
		if got := httptoken.Char(c); got != want {
			t.Errorf("Char(%q) = %v, want %v", c, got, want)
		}
	}
}
