// Package httptoken tells HTTP tokens (RFC 9110, section 5.6.2) from
// other text: the methods, header names and media types that the rules,
// the identity options, the check API and the gateway's configuration
// accept.
package httptoken

import "strings"

// Is reports whether s is a token: one or more bytes Char accepts.
func Is(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !Char(s[i]) {
			return false
		}
	}
	return true
}

// Char reports whether b is a tchar: an ASCII letter or digit, or one of
// !#$%&'*+-.^_`|~.
func Char(b byte) bool {
	return 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' ||
		strings.IndexByte("!#$%&'*+-.^_`|~", b) >= 0
}
