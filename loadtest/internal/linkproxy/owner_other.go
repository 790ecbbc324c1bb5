//go:build !linux

package linkproxy

import (
	"errors"
	"net/netip"
)

// SocketOwner needs /proc: on this system it always answers an error, and
// every client is Unknown.
func SocketOwner(netip.AddrPort, []int) (int, error) {
	return 0, errors.New("linkproxy: socket owners are found on Linux only")
}
