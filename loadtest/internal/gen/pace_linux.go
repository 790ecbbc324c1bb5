package gen

import (
	"syscall"
	"time"
)

// fineSleeper returns nanosleep, which wakes within the thread's timer
// slack (50 µs by default) of its time.
func fineSleeper() func(time.Duration) {
	return func(d time.Duration) {
		ts := syscall.NsecToTimespec(int64(d))
		_ = syscall.Nanosleep(&ts, nil) // woken early (EINTR): the caller loops
	}
}
