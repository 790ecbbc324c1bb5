package lifecycle_test

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/compose/kafkabroker"
	"github.com/tollgate/tollgate/compose/kafkabroker/kafkatest"
	"github.com/tollgate/tollgate/compose/natsserver"
	"github.com/tollgate/tollgate/compose/natsserver/natstest"
	"github.com/tollgate/tollgate/compose/redisserver"
)

// subject is one started server as the conformance test sees it.
type subject struct {
	stop       func() error
	dir        string                  // its data directory, which Stop removes
	addr       string                  // its client address, closed after Stop
	ops        map[string]func() error // every lifecycle operation but Stop
	errStopped error                   // the starter's sentinel for them after Stop
	after      func(t *testing.T)      // the starter's own checks after Stop, or nil
}

// starters start each of the three starters with their defaults.
var starters = []struct {
	name  string
	start func(t *testing.T) subject
}{
	{"redisserver", func(t *testing.T) subject {
		s, err := redisserver.Start(t.Context())
		if err != nil {
			t.Fatalf("start: %v", err)
		}
		// Stop must also end a paused server.
		if err := s.Pause(); err != nil {
			t.Fatalf("pause: %v", err)
		}
		pid := s.Pid()
		return subject{
			stop: s.Stop, dir: s.Dir(), addr: s.Addr(), errStopped: redisserver.ErrStopped,
			ops: map[string]func() error{
				"Kill":    s.Kill,
				"Pause":   s.Pause,
				"Resume":  s.Resume,
				"Restart": func() error { return s.Restart(t.Context()) },
			},
			after: func(t *testing.T) {
				if s.Pid() != 0 {
					t.Error("Pid() != 0 after Stop")
				}
				if p, err := os.FindProcess(pid); err == nil && p.Signal(syscall.Signal(0)) == nil {
					t.Errorf("process %d still alive after Stop", pid)
				}
			},
		}
	}},
	{"natsserver", func(t *testing.T) subject {
		s, err := natsserver.Start(t.Context())
		if err != nil {
			t.Fatalf("start: %v", err)
		}
		return subject{
			stop: s.Stop, dir: s.StoreDir(), addr: s.Addr(), errStopped: natsserver.ErrStopped,
			ops: map[string]func() error{
				"Down":    s.Down,
				"Up":      func() error { return s.Up(t.Context()) },
				"Restart": func() error { return s.Restart(t.Context()) },
			},
		}
	}},
	{"kafkabroker", func(t *testing.T) subject {
		b, err := kafkabroker.Start(t.Context())
		if err != nil {
			t.Fatalf("start: %v", err)
		}
		return subject{
			stop: b.Stop, dir: b.DataDir(), addr: b.Addr(), errStopped: kafkabroker.ErrStopped,
			ops: map[string]func() error{
				"Down":    b.Down,
				"Up":      func() error { return b.Up(t.Context()) },
				"Restart": func() error { return b.Restart(t.Context()) },
			},
			after: func(t *testing.T) {
				if b.Cluster() != nil {
					t.Error("Cluster() != nil after Stop")
				}
			},
		}
	}},
}

// TestStopConformance holds every starter to one Stop: idempotent and safe
// from many goroutines (every call gets the first one's result), the
// directory it created removed, the port closed, and every other lifecycle
// operation refused afterwards with the package's ErrStopped.
func TestStopConformance(t *testing.T) {
	t.Parallel()
	for _, st := range starters {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			s := st.start(t)
			var wg sync.WaitGroup
			errs := make([]error, 8)
			for i := range errs {
				wg.Go(func() { errs[i] = s.stop() })
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatalf("concurrent Stop: %v", err)
			}
			if err := s.stop(); err != nil {
				t.Fatalf("Stop again: %v", err)
			}
			if _, err := os.Stat(s.dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("dir %s still there after Stop (%v)", s.dir, err)
			}
			if c, err := net.Dial("tcp", s.addr); err == nil {
				_ = c.Close()
				t.Errorf("%s still accepts connections after Stop", s.addr)
			}
			for name, op := range s.ops {
				if err := op(); !errors.Is(err, s.errStopped) {
					t.Errorf("%s after Stop = %v, want ErrStopped", name, err)
				}
			}
			if s.after != nil {
				s.after(t)
			}
		})
	}
}

// listening is a started server of a starter that takes a listen address.
type listening struct {
	addr string
	down func() error
	up   func(context.Context) error
}

// listeners are the starters that listen where WithListen says
// (redisserver always picks a free port).
var listeners = []struct {
	name           string
	start          func(ctx context.Context, addr string) error // Start, stopped at once
	startTB        func(t *testing.T, addr string) listening
	errNotLoopback error
}{
	{"natsserver", func(ctx context.Context, addr string) error {
		s, err := natsserver.Start(ctx, natsserver.WithListen(addr))
		if err == nil {
			err = s.Stop()
		}
		return err
	}, func(t *testing.T, addr string) listening {
		s := natstest.StartTB(t, natsserver.WithListen(addr))
		if s.ClientURL() != "nats://"+addr {
			t.Errorf("ClientURL %s, want nats://%s", s.ClientURL(), addr)
		}
		return listening{s.Addr(), s.Down, s.Up}
	}, natsserver.ErrNotLoopback},
	{"kafkabroker", func(ctx context.Context, addr string) error {
		b, err := kafkabroker.Start(ctx, kafkabroker.WithListen(addr))
		if err == nil {
			err = b.Stop()
		}
		return err
	}, func(t *testing.T, addr string) listening {
		b := kafkatest.StartTB(t, kafkabroker.WithListen(addr))
		return listening{b.Addr(), b.Down, b.Up}
	}, kafkabroker.ErrNotLoopback},
}

// TestListenConformance holds the listening starters to one WithListen: a
// taken port fails Start at once with EADDRINUSE, a free one is kept
// across Down and Up, Up waits while another process holds it, and an
// address off loopback is refused (the servers have no authentication).
func TestListenConformance(t *testing.T) {
	t.Parallel()
	for _, st := range listeners {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := l.Addr().String()
			if err := st.start(t.Context(), addr); !errors.Is(err, syscall.EADDRINUSE) {
				t.Fatalf("Start on taken %s = %v, want EADDRINUSE", addr, err)
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			s := st.startTB(t, addr)
			if s.addr != addr {
				t.Fatalf("Addr = %s, want %s", s.addr, addr)
			}

			// Up waits while another process holds the port.
			if err := s.down(); err != nil {
				t.Fatal(err)
			}
			if l, err = net.Listen("tcp", addr); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
			defer cancel()
			if err := s.up(ctx); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Up on a taken port = %v, want a deadline error", err)
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			if err := s.up(t.Context()); err != nil {
				t.Fatalf("Up once the port is free: %v", err)
			}
			if err := s.up(t.Context()); err != nil {
				t.Fatalf("Up on a running server: %v", err)
			}
			for _, bad := range []string{"0.0.0.0:0", "10.1.2.3:4222", ":4222"} {
				if err := st.start(t.Context(), bad); !errors.Is(err, st.errNotLoopback) {
					t.Errorf("Start(WithListen(%q)) = %v, want ErrNotLoopback", bad, err)
				}
			}
		})
	}
}
