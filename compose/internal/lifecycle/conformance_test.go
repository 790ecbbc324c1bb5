package lifecycle_test

import (
	"errors"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"

	"github.com/tollgate/tollgate/compose/kafkabroker"
	"github.com/tollgate/tollgate/compose/natsserver"
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
