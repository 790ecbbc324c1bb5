//go:build linux

package chaos

import "syscall"

// sysProcAttr puts a child in its own process group, so a terminal's
// Ctrl-C reaches only the harness, which stops the fleet in order, and
// asks the kernel to SIGKILL it when the thread that started it ends
// (with the harness).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// supported reports whether the soak runs here: it finds the process of
// each connection through /proc.
func supported() error { return nil }
