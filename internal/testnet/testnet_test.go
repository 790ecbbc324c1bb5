package testnet_test

import (
	"context"
	"errors"
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

// cleanupTB records what RunUntilCleanup asks of a test: its cleanups and
// its failures.
type cleanupTB struct {
	testing.TB
	cleanups []func()
	errs     []string
}

func (c *cleanupTB) Cleanup(f func()) { c.cleanups = append(c.cleanups, f) }

func (c *cleanupTB) Errorf(format string, args ...any) {
	c.errs = append(c.errs, fmt.Sprintf(format, args...))
}

func TestRunUntilCleanup(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		err     error // what run returns once its context ends
		wantErr string
	}{
		{"clean stop", nil, ""},
		{"failed stop", errors.New("boom"), "srv: Run: boom"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb := &cleanupTB{TB: t}
			started := make(chan context.Context, 1)
			testnet.RunUntilCleanup(tb, "srv", func(ctx context.Context) error {
				started <- ctx
				<-ctx.Done()
				return tt.err
			})
			ctx := <-started
			if ctx.Err() != nil {
				t.Fatal("run's context ended before the test did")
			}
			if len(tb.cleanups) != 1 {
				t.Fatalf("%d cleanups registered, want 1", len(tb.cleanups))
			}
			tb.cleanups[0]()
			if ctx.Err() == nil {
				t.Fatal("the cleanup did not cancel run's context")
			}
			if got := strings.Join(tb.errs, "; "); got != tt.wantErr {
				t.Fatalf("failures %q, want %q", got, tt.wantErr)
			}
		})
	}
}
