// Package procstat reads the CPU time a process has used from Linux's
// /proc/<pid>/stat: utime plus stime, every thread of the process counted.
//
// Those fields are in clock ticks of USER_HZ, which the kernel fixes at 100
// per second on every architecture Go supports on Linux (sysconf(_SC_CLK_TCK)
// returns 100), so the resolution is 10 ms: measure runs of seconds, not
// milliseconds. On other systems there is no /proc and CPUTime returns an
// error.
package procstat

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"
)

// ClockTicks is USER_HZ, the unit of utime and stime: 100 per second.
const ClockTicks = 100

// ErrFormat is returned, wrapped, when a stat file cannot be parsed.
var ErrFormat = errors.New("procstat: unexpected /proc/<pid>/stat format")

// CPUTime returns the user plus system CPU time process pid has used so far.
func CPUTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("procstat: %w", err)
	}
	utime, stime, err := Parse(b)
	if err != nil {
		return 0, err
	}
	return TicksToDuration(utime + stime), nil
}

// TicksToDuration converts clock ticks to a duration.
func TicksToDuration(ticks uint64) time.Duration {
	return time.Duration(ticks) * (time.Second / ClockTicks)
}

// Parse returns the utime and stime fields (14 and 15, in clock ticks) of
// the contents of a /proc/<pid>/stat file. The second field, the command
// name in parentheses, may hold spaces and parentheses itself, so fields are
// counted from the last ')'.
func Parse(stat []byte) (utime, stime uint64, err error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("%w: no command name", ErrFormat)
	}
	// After ')': field 3 (state) onwards; utime is field 14, stime 15.
	fields := bytes.Fields(stat[i+1:])
	const utimeAt, stimeAt = 14 - 3, 15 - 3
	if len(fields) <= stimeAt {
		return 0, 0, fmt.Errorf("%w: %d fields after the command name", ErrFormat, len(fields))
	}
	if utime, err = strconv.ParseUint(string(fields[utimeAt]), 10, 64); err != nil {
		return 0, 0, fmt.Errorf("%w: utime: %v", ErrFormat, err)
	}
	if stime, err = strconv.ParseUint(string(fields[stimeAt]), 10, 64); err != nil {
		return 0, 0, fmt.Errorf("%w: stime: %v", ErrFormat, err)
	}
	return utime, stime, nil
}
