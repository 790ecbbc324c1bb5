//go:build !linux

package linkproxy

import (
	"errors"
	"net/netip"
)

// Owners finds which process holds the client end of a TCP connection;
// it needs Linux's /proc and sock_diag.
type Owners struct{}

// NewOwners returns an empty lookup.
func NewOwners() *Owners { return &Owners{} }

// Owner always fails on this system: every client is Unknown.
func (*Owners) Owner(local, remote netip.AddrPort, pids []int) (int, error) {
	return 0, errors.New("linkproxy: socket owners are found on Linux only")
}
