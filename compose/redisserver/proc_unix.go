//go:build unix && !linux

package redisserver

import (
	"os"
	"syscall"
)

var (
	sigStop os.Signal = syscall.SIGSTOP
	sigCont os.Signal = syscall.SIGCONT
	sigTerm os.Signal = syscall.SIGTERM
)

// waitStopped returns at once: only Linux lets us observe the stopped state.
func waitStopped(int, <-chan struct{}) {}
