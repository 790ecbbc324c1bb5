// Package loopback checks the listen addresses of the embedded servers
// (kafkabroker, natsserver), which have no authentication and so must bind
// a loopback address only.
package loopback

import (
	"errors"
	"fmt"
	"net"
	"strconv"
)

// ErrNotLoopback is returned by Split for an address whose host is not a
// loopback IP or "localhost".
var ErrNotLoopback = errors.New("listen address must be on loopback")

// Split parses addr, "host:port", and checks that host is a loopback IP or
// "localhost", which it returns as "127.0.0.1". Port 0 means a free port.
func Split(addr string) (host string, port int, err error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("listen address %q: %w", addr, err)
	}
	port, err = strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("listen address %q: bad port", addr)
	}
	if host == "localhost" {
		return "127.0.0.1", port, nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return "", 0, fmt.Errorf("%w: %q", ErrNotLoopback, addr)
	}
	return host, port, nil
}
