//go:build linux

package spawn

import "syscall"

// SysProcAttr puts the child in its own process group, so that a
// terminal's Ctrl-C reaches only the Go process, which then stops it
// cleanly, and asks the kernel to SIGKILL it when the spawning thread (see
// Start) dies.
func SysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
