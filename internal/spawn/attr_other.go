//go:build !unix

package spawn

import "syscall"

// SysProcAttr is nil where there are no process groups.
func SysProcAttr() *syscall.SysProcAttr { return nil }
