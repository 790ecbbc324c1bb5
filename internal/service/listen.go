package service

import (
	"errors"
	"fmt"
	"net"
	"syscall"
)

// ErrAddrInUse means a listener's address is taken; the error is an
// *AddrInUseError naming the variable that moves it.
var ErrAddrInUse = errors.New("address in use")

// AddrInUseError is the error of a listener whose address is taken. It
// matches ErrAddrInUse, and syscall.EADDRINUSE through the error of the
// bind it wraps.
type AddrInUseError struct {
	Addr string // the address, host:port
	Var  string // the variable that moves it, e.g. TOLLGATE_LISTEN
	Err  error  // the bind's error; may be nil
}

func (e *AddrInUseError) Error() string {
	return fmt.Sprintf("%s is already in use (%s): stop what listens there, or set %s to another address (port 0 picks a free one)",
		e.Addr, e.Var, e.Var)
}

// Is reports whether target is ErrAddrInUse.
func (e *AddrInUseError) Is(target error) bool { return target == ErrAddrInUse }

// Unwrap returns the bind's error.
func (e *AddrInUseError) Unwrap() error { return e.Err }

// Listener is an address to listen on and the variable that sets it.
type Listener struct {
	Name string // what listens there, for errors: "proxy", "metrics"…
	Addr string // host:port; port 0 picks a free one
	Var  string // the variable that sets Addr, e.g. TOLLGATE_LISTEN
}

// ListenError is the error of a bind that failed for another reason than
// a busy address. It wraps the bind's error.
type ListenError struct {
	Listener
	Err error
}

func (e *ListenError) Error() string {
	return fmt.Sprintf("%s listener: cannot listen on %s (%s): %v", e.Name, e.Addr, e.Var, e.Err)
}

// Unwrap returns the bind's error.
func (e *ListenError) Unwrap() error { return e.Err }

// ListenAll binds every listener, in order, on TCP. When one or more
// fail, it closes those it bound and returns every failure, joined (one
// line each): an *AddrInUseError for a busy address, naming the variable
// that moves it, else a *ListenError. So a process that cannot start says
// at once which of its ports are taken, not only the first.
func ListenAll(ls []Listener) ([]net.Listener, error) {
	out := make([]net.Listener, len(ls))
	var errs []error
	for i, l := range ls {
		ln, err := net.Listen("tcp", l.Addr)
		switch {
		case err == nil:
			out[i] = ln
		case errors.Is(err, syscall.EADDRINUSE):
			errs = append(errs, &AddrInUseError{Addr: l.Addr, Var: l.Var, Err: err})
		default:
			errs = append(errs, &ListenError{Listener: l, Err: err})
		}
	}
	if len(errs) > 0 {
		for _, ln := range out {
			if ln != nil {
				_ = ln.Close()
			}
		}
		return nil, errors.Join(errs...)
	}
	return out, nil
}
