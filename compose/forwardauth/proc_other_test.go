//go:build unix && !linux

package forwardauth_test

import "syscall"

// sysProcAttr: outside Linux there is no Pdeathsig; a crashed test binary
// may leave its servers behind.
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
