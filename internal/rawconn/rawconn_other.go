//go:build !linux

package rawconn

import "net"

// Wrap returns nc: raw system calls are used on Linux only.
func Wrap(nc net.Conn) net.Conn { return nc }
