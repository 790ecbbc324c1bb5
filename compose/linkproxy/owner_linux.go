package linkproxy

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// Owners finds which process holds the client end of a TCP connection
// (Linux): it asks the kernel for that socket's inode with one sock_diag
// netlink query (falling back to /proc/net/tcp), then looks the inode up
// among the candidates' open files, /proc/<pid>/fd, remembering what it
// saw so that most lookups read no directory. Safe for concurrent use.
type Owners struct {
	mu     sync.Mutex
	inodes map[string]int // guarded by mu; socket inode → pid, as last seen
}

// NewOwners returns an empty lookup.
func NewOwners() *Owners { return &Owners{inodes: map[string]int{}} }

// Owner returns which of pids holds the TCP socket local → remote (the
// client's end of a connection a proxy accepted: local is the proxy's
// peer, remote the proxy's own address), or 0 when none does. The
// connection must still be open.
func (o *Owners) Owner(local, remote netip.AddrPort, pids []int) (int, error) {
	inode, err := diagInode(local, remote)
	if err != nil {
		if inode, err = procInode(local); err != nil {
			return 0, err
		}
	}
	if inode == "" || inode == "0" {
		return 0, nil
	}
	o.mu.Lock()
	pid, ok := o.inodes[inode]
	o.mu.Unlock()
	if ok {
		for _, p := range pids {
			if p == pid {
				return pid, nil
			}
		}
	}
	// Not seen yet: read the candidates' descriptors.
	want := "socket:[" + inode + "]"
	found := 0
	seen := map[string]int{}
	for _, p := range pids {
		if p <= 0 {
			continue
		}
		dir := "/proc/" + strconv.Itoa(p) + "/fd"
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue // gone, or not ours to read
		}
		for _, e := range ents {
			t, err := os.Readlink(dir + "/" + e.Name())
			if err != nil || !strings.HasPrefix(t, "socket:[") {
				continue
			}
			seen[t[len("socket:["):len(t)-1]] = p
			if t == want && found == 0 {
				found = p
			}
		}
	}
	o.mu.Lock()
	o.inodes = seen // forget sockets that closed
	o.mu.Unlock()
	return found, nil
}

// sock_diag constants (linux/sock_diag.h, linux/inet_diag.h).
const (
	sockDiagByFamily = 20
	inetDiagReqLen   = 56
	inetDiagMsgInode = 4 + 48 + 16 // in the message after its netlink header: family..retrans, id, expires..uid
)

// diagInode asks the kernel for the inode of the TCP socket local →
// remote with one exact sock_diag query.
func diagInode(local, remote netip.AddrPort) (string, error) {
	la, ra := local.Addr().Unmap(), remote.Addr().Unmap()
	family := byte(syscall.AF_INET)
	if la.Is6() {
		family = syscall.AF_INET6
	}
	fd, err := syscall.Socket(syscall.AF_NETLINK, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, syscall.NETLINK_INET_DIAG)
	if err != nil {
		return "", fmt.Errorf("linkproxy: sock_diag: %w", err)
	}
	defer syscall.Close(fd)
	tv := syscall.Timeval{Sec: 1}
	_ = syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv)
	req := make([]byte, syscall.NLMSG_HDRLEN+inetDiagReqLen)
	ne := binary.NativeEndian
	ne.PutUint32(req[0:], uint32(len(req)))
	ne.PutUint16(req[4:], sockDiagByFamily)
	ne.PutUint16(req[6:], syscall.NLM_F_REQUEST)
	ne.PutUint32(req[8:], 1)
	b := req[syscall.NLMSG_HDRLEN:]
	b[0], b[1] = family, syscall.IPPROTO_TCP
	ne.PutUint32(b[4:], 0xffffffff) // every state
	binary.BigEndian.PutUint16(b[8:], local.Port())
	binary.BigEndian.PutUint16(b[10:], remote.Port())
	if la.Is4() {
		a := la.As4()
		copy(b[12:], a[:])
		r := ra.As4()
		copy(b[28:], r[:])
	} else {
		a, r := la.As16(), ra.As16()
		copy(b[12:], a[:])
		copy(b[28:], r[:])
	}
	ne.PutUint32(b[48:], 0xffffffff) // INET_DIAG_NOCOOKIE
	ne.PutUint32(b[52:], 0xffffffff)
	if err := syscall.Sendto(fd, req, 0, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}); err != nil {
		return "", fmt.Errorf("linkproxy: sock_diag: %w", err)
	}
	buf := make([]byte, 4096)
	n, _, err := syscall.Recvfrom(fd, buf, 0)
	if err != nil {
		return "", fmt.Errorf("linkproxy: sock_diag: %w", err)
	}
	msgs, err := syscall.ParseNetlinkMessage(buf[:n])
	if err != nil {
		return "", fmt.Errorf("linkproxy: sock_diag: %w", err)
	}
	for _, m := range msgs {
		switch m.Header.Type {
		case syscall.NLMSG_ERROR:
			if len(m.Data) >= 4 {
				if code := int32(ne.Uint32(m.Data)); code != 0 {
					return "", fmt.Errorf("linkproxy: sock_diag: %w", syscall.Errno(-code))
				}
			}
		case sockDiagByFamily:
			if len(m.Data) >= inetDiagMsgInode+4 {
				return strconv.FormatUint(uint64(ne.Uint32(m.Data[inetDiagMsgInode:])), 10), nil
			}
		}
	}
	return "", errors.New("linkproxy: sock_diag: no answer")
}

// procInode finds the inode of the TCP socket bound to addr in
// /proc/net/tcp (or tcp6): slow on a machine with many sockets.
func procInode(addr netip.AddrPort) (string, error) {
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
