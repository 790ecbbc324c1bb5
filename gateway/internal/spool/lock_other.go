//go:build !(linux || darwin || dragonfly || freebsd || netbsd || openbsd)

package spool

import (
	"fmt"
	"io"
	"runtime"
)

// lockFile fails where flock(2) does not exist: a spool without a lock could
// be shared by two gateways and replay each other's records.
func lockFile(name string) (io.Closer, error) {
	return nil, fmt.Errorf("lock %s: file locks are not supported on %s", name, runtime.GOOS)
}
