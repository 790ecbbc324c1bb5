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

// sysProcAttr puts redis-server in its own process group. Outside Linux
// there is no Pdeathsig: a Go process that crashes leaves its servers behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// waitStopped returns at once: only Linux lets us observe the stopped state.
func waitStopped(int, <-chan struct{}) {}
