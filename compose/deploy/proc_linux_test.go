//go:build linux

package deploy

import "syscall"

// sysProcAttr asks the kernel to SIGKILL a process the test starts when the
// thread that started it dies, so a test binary killed by its timeout
// leaves no prometheus behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
