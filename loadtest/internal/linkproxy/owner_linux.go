package linkproxy

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

// SocketOwner returns which of pids holds the TCP socket whose local
// address is addr (a proxy's peer: the client's end of the connection), or
// 0 when none does. It reads /proc/net/tcp (or tcp6) for the socket's
// inode, then each candidate's /proc/<pid>/fd for that socket. The
// connection must still be open.
func SocketOwner(addr netip.AddrPort, pids []int) (int, error) {
	inode, err := socketInode(addr)
	if err != nil || inode == "" {
		return 0, err
	}
	want := "socket:[" + inode + "]"
	for _, pid := range pids {
		if pid <= 0 {
			continue
		}
		dir := "/proc/" + strconv.Itoa(pid) + "/fd"
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue // gone, or not ours to read
		}
		for _, e := range ents {
			if target, err := os.Readlink(dir + "/" + e.Name()); err == nil && target == want {
				return pid, nil
			}
		}
	}
	return 0, nil
}

// socketInode finds the inode of the TCP socket bound to addr.
func socketInode(addr netip.AddrPort) (string, error) {
	file, key := "/proc/net/tcp", procAddr(addr)
	if addr.Addr().Is6() && !addr.Addr().Is4In6() {
		file = "/proc/net/tcp6"
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("linkproxy: socket owner: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Scan() // header
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
		if len(f) >= 10 && f[1] == key {
			return f[9], nil
		}
	}
	return "", sc.Err()
}

// procAddr writes addr as /proc/net/tcp does: the address's bytes as
// native-endian (little-endian here) 32-bit words in hex, a colon, the
// port in hex.
func procAddr(addr netip.AddrPort) string {
	a := addr.Addr().Unmap()
	var raw []byte
	if a.Is4() {
		b := a.As4()
		raw = b[:]
	} else {
		b := a.As16()
		raw = b[:]
	}
	words := make([]byte, len(raw))
	for i := 0; i < len(raw); i += 4 {
		words[i], words[i+1], words[i+2], words[i+3] = raw[i+3], raw[i+2], raw[i+1], raw[i]
	}
	return strings.ToUpper(hex.EncodeToString(words)) + fmt.Sprintf(":%04X", addr.Port())
}
