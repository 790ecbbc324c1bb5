//go:build linux

package forwardauth_test

import "syscall"

// sysProcAttr puts a server in its own process group (a terminal's Ctrl-C
// reaches only the test binary, which stops it) and asks the kernel to
// SIGKILL it when the spawning thread dies, so a crashed test leaves no
// orphan. The spawning goroutine is locked to its thread (see start).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
