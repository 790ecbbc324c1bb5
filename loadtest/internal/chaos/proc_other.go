//go:build !linux

package chaos

import "errors"

// supported reports whether the soak runs here: it finds the process of
// each connection through /proc, which only Linux has.
func supported() error { return errors.New("chaos: the soak needs Linux (/proc)") }
