//go:build linux

package chaos

// supported reports whether the soak runs here: it finds the process of
// each connection through /proc.
func supported() error { return nil }
