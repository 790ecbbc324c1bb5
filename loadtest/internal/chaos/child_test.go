package chaos

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testnet"
	"github.com/tollgate/tollgate/internal/testwait"
)

func TestRunChild(t *testing.T) {
	for _, kind := range []string{"kafka", "nats"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(t.Context())
			var out testnet.Buffer
			code := make(chan int, 1)
			go func() { code <- RunChild(ctx, []string{kind, "-dir", t.TempDir()}, &out, io.Discard) }()
			testwait.Eventually(t, 15*time.Second, func() error {
				if !strings.HasPrefix(out.String(), childReady+" 127.0.0.1:") {
					return io.ErrNoProgress
				}
				return nil
			})
			cancel()
			select {
			case c := <-code:
				if c != 0 {
					t.Fatalf("exit %d", c)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the child did not stop")
			}
		})
	}
}

func TestRunChildRefusesBadArguments(t *testing.T) {
	for _, args := range [][]string{nil, {"zookeeper", "-dir", "x"}, {"kafka"}, {"nats", "-nope"}} {
		if code := RunChild(t.Context(), args, io.Discard, io.Discard); code != 2 {
			t.Errorf("RunChild(%q) = %d, want 2", args, code)
		}
	}
}
