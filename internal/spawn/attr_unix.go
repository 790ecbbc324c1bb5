//go:build unix && !linux

package spawn

import "syscall"

// SysProcAttr puts the child in its own process group. Outside Linux there
// is no Pdeathsig: a Go process that crashes leaves its children behind.
func SysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
