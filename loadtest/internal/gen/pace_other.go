//go:build !linux

package gen

import "time"

// fineSleeper has no finer sleep than the runtime's timers here.
func fineSleeper() func(time.Duration) { return nil }
