package linkproxy

import (
	"net/netip"
	"os"
	"testing"

	"github.com/tollgate/tollgate/internal/testnet"
)

func TestOwnerFindsThisProcess(t *testing.T) {
	ln := testnet.Listen(t)
	c := dialFrom(t, "127.0.0.1", ln.Addr().String())
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	peer := netip.MustParseAddrPort(s.RemoteAddr().String())
	local := netip.MustParseAddrPort(s.LocalAddr().String())
	o := NewOwners()
	for i := range 2 { // the second from the cache
		pid, err := o.Owner(peer, local, []int{1, os.Getpid()})
		if err != nil || pid != os.Getpid() {
			t.Fatalf("lookup %d: Owner(%v) = %d, %v; want %d", i, peer, pid, err, os.Getpid())
		}
	}
	if pid, err := o.Owner(peer, local, []int{1}); pid != 0 || err != nil {
		t.Fatalf("Owner among other processes = %d, %v", pid, err)
	}
	inode, err := diagInode(peer, local)
	if err != nil {
		t.Fatal(err)
	}
	if slow, err := procInode(peer); err != nil || slow != inode {
		t.Fatalf("sock_diag says inode %s, /proc/net/tcp %s (%v)", inode, slow, err)
	}
	_ = c
	if pid, err := o.Owner(netip.MustParseAddrPort("127.0.0.1:1"), local, []int{os.Getpid()}); pid != 0 {
		t.Fatalf("Owner of no socket = %d, %v", pid, err)
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
