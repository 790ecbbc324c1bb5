//go:build !linux

package deploy

import "syscall"

// sysProcAttr: no parent-death signal outside Linux; t.Cleanup stops the
// processes the tests start.
func sysProcAttr() *syscall.SysProcAttr { return nil }
