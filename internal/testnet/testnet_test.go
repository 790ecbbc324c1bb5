package testnet_test

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/tollgate/tollgate/internal/testnet"
)

func TestFreeAddrIsFreeLoopback(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		addr func(testing.TB) string
	}{
		{"FreeAddr", testnet.FreeAddr},
		{"FreePort", func(t testing.TB) string { return "127.0.0.1:" + strconv.Itoa(testnet.FreePort(t)) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			addr := tt.addr(t)
			host, port, err := net.SplitHostPort(addr)
			if err != nil || host != "127.0.0.1" || port == "0" {
				t.Fatalf("address %q (%v): want 127.0.0.1 and a port", addr, err)
			}
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				t.Fatalf("listen on %s: %v", addr, err)
			}
			_ = ln.Close()
		})
	}
}

func TestBufferConcurrentWriters(t *testing.T) {
	t.Parallel()
	var b testnet.Buffer
	var wg sync.WaitGroup
	const writers, lines = 4, 50
	for w := range writers {
		wg.Go(func() {
			for i := range lines {
				fmt.Fprintf(&b, "w%d %d\n", w, i)
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if got := strings.Count(b.String(), "\n"); got != writers*lines {
		t.Fatalf("%d lines, want %d", got, writers*lines)
	}
}
