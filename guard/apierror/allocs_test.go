//go:build !race

package apierror

import "testing"

// TestAllocs: the appenders allocate nothing when the buffer has room (the
// race detector changes allocation counts, hence the build tag).
func TestAllocs(t *testing.T) {
	buf := make([]byte, 0, 1024)
	msg := []byte("Rate limit \"search\" exceeded \u2028 <x> \xff.")
	tests := []struct {
		name string
		fn   func()
	}{
		{"AppendString string", func() { buf = AppendString(buf[:0], string(oddStrings[4]), EscapeHTML) }},
		{"AppendString bytes", func() { buf = AppendString(buf[:0], msg, EscapeJSON) }},
		{"AppendBody", func() { buf = AppendBody(buf[:0], RateLimitExceeded, msg, EscapeJSON) }},
		{"AppendFields", func() { buf = AppendFields(buf[:0], KeyBlocked, "This API key is blocked.", EscapeHTML) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if n := testing.AllocsPerRun(100, tt.fn); n != 0 {
				t.Errorf("%v allocations, want 0", n)
			}
		})
	}
}
