package linkproxy

import (
	"net"
	"net/netip"
	"os"
	"testing"
)

func TestSocketOwnerFindsThisProcess(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c := dialFrom(t, "127.0.0.1", ln.Addr().String())
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	peer := netip.MustParseAddrPort(s.RemoteAddr().String())
	pid, err := SocketOwner(peer, []int{1, os.Getpid()})
	if err != nil || pid != os.Getpid() {
		t.Fatalf("SocketOwner(%v) = %d, %v; want %d", peer, pid, err, os.Getpid())
	}
	_ = c
	if pid, err := SocketOwner(netip.MustParseAddrPort("127.0.0.1:1"), []int{os.Getpid()}); pid != 0 || err != nil {
		t.Fatalf("SocketOwner of no socket = %d, %v", pid, err)
	}
}

func TestProcAddr(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"127.0.0.1:8080", "0100007F:1F90"},
		{"10.1.2.3:1", "0302010A:0001"},
	} {
		if got := procAddr(netip.MustParseAddrPort(tc.in)); got != tc.want {
			t.Errorf("procAddr(%s) = %s, want %s", tc.in, got, tc.want)
		}
	}
}
