//go:build !linux

package chaos

import (
	"errors"
	"syscall"
)

func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// supported reports whether the soak runs here: it finds the process of
// each connection through /proc, which only Linux has.
func supported() error { return errors.New("chaos: the soak needs Linux (/proc)") }
