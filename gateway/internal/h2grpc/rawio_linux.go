package h2grpc

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"
)

// rawIO returns nc, a TCP connection, reading and writing with raw system
// calls on its non-blocking socket, still through the network poller when
// it must wait: a read or write then costs the system call alone. Made
// through the runtime's syscall entry, every one of them would, on a
// server idle between calls, also wake the runtime's monitor thread with
// a futex, which at moderate load cost about a tenth of a call's CPU.
// Other connections are returned as they are.
func rawIO(nc net.Conn) net.Conn {
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
// Reads are made one at a time, and so are writes (by the connection's
// reading goroutine, and under its write lock or TLS's): each side keeps
// its call's buffer and result here, for its callback bound once.
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
