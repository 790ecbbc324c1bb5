//go:build unix

package redisstore

import (
	"errors"
	"net"
	"syscall"
)

// alive reports whether Redis has not closed nc nor sent it anything
// unasked, with one non-blocking read: nothing to read is the answer of a
// live, idle connection. Connections that give no file descriptor (TLS)
// are assumed alive.
func alive(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	ok = false
	err = rc.Read(func(fd uintptr) bool {
		var b [1]byte
		n, err := syscall.Read(int(fd), b[:])
		ok = n < 0 && (errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EWOULDBLOCK))
		return true
	})
	return err == nil && ok
}
