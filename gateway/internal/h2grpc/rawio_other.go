//go:build !linux

package h2grpc

import "net"

// rawIO returns nc: raw system calls are used on Linux only.
func rawIO(nc net.Conn) net.Conn { return nc }
