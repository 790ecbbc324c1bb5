package procstat

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testwait"
)

func TestParse(t *testing.T) {
	t.Parallel()
	// Fields after the name: state ppid pgrp session tty tpgid flags minflt
	// cminflt majflt cmajflt utime stime cutime cstime ...
	const rest = " S 1 2 3 4 5 6 7 8 9 10 1234 567 11 12 20 0 9 0 100 1000 50"
	tests := []struct {
		name, stat   string
		utime, stime uint64
		err          bool
	}{
		{"plain", "4242 (gateway)" + rest, 1234, 567, false},
		{"name with spaces and parentheses", "4242 (a) b (c)) d)" + rest, 1234, 567, false},
		{"no name", "4242 gateway" + rest, 0, 0, true},
		{"truncated", "4242 (gateway) S 1 2 3", 0, 0, true},
		{"not a number", "4242 (gateway) S 1 2 3 4 5 6 7 8 9 10 x 567", 0, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			u, s, err := Parse([]byte(tt.stat))
			if tt.err {
				if !errors.Is(err, ErrFormat) {
					t.Fatalf("Parse = %d, %d, %v; want ErrFormat", u, s, err)
				}
				return
			}
			if err != nil || u != tt.utime || s != tt.stime {
				t.Fatalf("Parse = %d, %d, %v; want %d, %d", u, s, err, tt.utime, tt.stime)
			}
		})
	}
	if got := TicksToDuration(150); got != 1500*time.Millisecond {
		t.Errorf("150 ticks = %v, want 1.5s", got)
	}
}

// TestOwnProcess reads this test's own CPU time, which grows while it
// burns CPU.
func TestOwnProcess(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("needs /proc")
	}
	before, err := CPUTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(nil)
	testwait.Eventually(t, 30*time.Second, func() error {
		for range 20_000 {
			sum = sha256.Sum256(sum[:])
		}
		now, err := CPUTime(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		if now <= before {
			return fmt.Errorf("cpu time still %v", now)
		}
		return nil
	})
	if _, err := CPUTime(-1); err == nil {
		t.Error("CPUTime(-1) succeeded")
	}
}
