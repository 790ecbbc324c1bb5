//go:build linux

package redisserver

import (
	"bytes"
	"os"
	"strconv"
	"time"
)

// waitStopped waits, for at most one second, until /proc shows the process
// stopped (state T) after SIGSTOP, or it exits, so that Pause means paused.
func waitStopped(pid int, exited <-chan struct{}) {
	path := "/proc/" + strconv.Itoa(pid) + "/stat"
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(path)
		if err != nil {
			return
		}
		// The state follows the command name, which is in parentheses.
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && (b[i+2] == 'T' || b[i+2] == 't') {
			return
		}
		select {
		case <-exited:
			return
		case <-time.After(time.Millisecond):
		}
	}
}
