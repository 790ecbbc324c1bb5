// Package rawconn reads and writes TCP connections with raw system calls
// on their non-blocking sockets, still waiting through Go's network poller
// when a socket has nothing to read or no room to write.
//
// Why: a read or write made through the runtime's usual system-call entry
// marks its thread as in a system call, and the first such call after the
// runtime's monitor thread (sysmon) went to deep sleep wakes it and sets it
// polling every 20 µs for at least a millisecond. A server idle between
// calls — the gateway at moderate load — paid that wake-up and its
// context switches after nearly every call: about a tenth of a decision's
// CPU on the RLS connection, and for the Redis connection tens of
// microseconds per call. A raw call costs the system call alone.
//
// Reads and writes never block a thread: a raw call on a non-blocking
// socket returns EAGAIN at once, and the wait goes through the poller.
package rawconn

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"
)

// Wrap returns nc, a TCP connection, reading and writing with raw system
// calls on its non-blocking socket; deadlines, Close, CloseWrite and the
// rest behave as nc's. Other connections (TLS, Unix sockets) are returned
// as they are.
func Wrap(nc net.Conn) net.Conn {
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		return nc
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nc
	}
	c := &rawConn{TCPConn: tc, rc: rc}
	c.readFn, c.writeFn = c.read, c.write
	return c
}

// rawConn is a TCP connection read and written with raw system calls.
// Like a net.Conn's, its reads must not run concurrently with each other,
// nor its writes with each other (a reader and a writer may run at
// once): each side keeps its call's buffer and result here, for its
// callback bound once, so that a call allocates nothing.
type rawConn struct {
	*net.TCPConn
	rc syscall.RawConn

	rbuf    []byte
	rn      int
	rerrno  syscall.Errno
	readFn  func(fd uintptr) bool
	wbuf    []byte
	wn      int
	werrno  syscall.Errno
	writeFn func(fd uintptr) bool
}

func (c *rawConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.rbuf, c.rn, c.rerrno = p, 0, 0
	err := c.rc.Read(c.readFn)
	n, errno := c.rn, c.rerrno
	c.rbuf = nil
	switch {
	case err != nil:
		return 0, c.opError("read", err)
	case errno != 0:
		return 0, c.opError("read", os.NewSyscallError("read", errno))
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// read reads into c.rbuf; false: nothing to read yet.
func (c *rawConn) read(fd uintptr) bool {
	for {
		r, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&c.rbuf[0])), uintptr(len(c.rbuf)))
		switch e {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		}
		c.rn, c.rerrno = int(r), e
		return true
	}
}

func (c *rawConn) Write(p []byte) (int, error) {
	c.wbuf, c.wn, c.werrno = p, 0, 0
	var err error
	for c.wn < len(p) && c.werrno == 0 && err == nil {
		err = c.rc.Write(c.writeFn)
	}
	n, errno := c.wn, c.werrno
	c.wbuf = nil
	switch {
	case err != nil:
		return n, c.opError("write", err)
	case errno != 0:
		return n, c.opError("write", os.NewSyscallError("write", errno))
	}
	return n, nil
}

// write writes what is left of c.wbuf; false: no room in the socket yet.
func (c *rawConn) write(fd uintptr) bool {
	for {
		rest := c.wbuf[c.wn:]
		r, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&rest[0])), uintptr(len(rest)))
		switch e {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		case 0:
			c.wn += int(r)
		default:
			c.werrno = e
		}
		return true
	}
}

func (c *rawConn) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}
