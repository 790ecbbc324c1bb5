package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

var errTestStopped = errors.New("test: stopped")

type testConfig struct {
	Common
	name string
}

func TestApply(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		opts        []Option[testConfig]
		wantName    string
		wantTimeout time.Duration
	}{
		{"defaults", nil, "default", DefaultStartTimeout},
		{"nil options skipped", []Option[testConfig]{nil, OptionFunc(func(c *testConfig) { c.name = "x" }), nil}, "x", DefaultStartTimeout},
		{"in order", []Option[testConfig]{OptionFunc(func(c *testConfig) { c.name = "a" }), OptionFunc(func(c *testConfig) { c.name = "b" })}, "b", DefaultStartTimeout},
		{"start timeout", []Option[testConfig]{WithStartTimeout[testConfig](time.Second)}, "default", time.Second},
		{"start timeout 0 ignored", []Option[testConfig]{WithStartTimeout[testConfig](time.Second), WithStartTimeout[testConfig](0)}, "default", time.Second},
		{"nil logger discards", []Option[testConfig]{WithLogger[testConfig](nil)}, "default", DefaultStartTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Apply(testConfig{name: "default"}, tc.opts)
			if c.name != tc.wantName || c.StartTimeout != tc.wantTimeout || c.Log == nil {
				t.Errorf("Apply = name %q, timeout %v, log %v; want %q, %v, a logger", c.name, c.StartTimeout, c.Log, tc.wantName, tc.wantTimeout)
			}
		})
	}
}

func TestGuard(t *testing.T) {
	t.Parallel()
	g := &Guard{Name: "test", ErrStopped: errTestStopped}
	boom := errors.New("boom")
	if err := g.Do("op", func() error { return boom }); err != boom {
		t.Fatalf("Do before Stop = %v, want fn's error", err)
	}
	var stops int
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() {
			errs[i] = g.Stop(func() error { stops++; return boom })
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != boom {
			t.Errorf("Stop #%d = %v, want the first call's result", i, err)
		}
	}
	if stops != 1 {
		t.Errorf("Stop ran its function %d times, want 1", stops)
	}
	called := false
	err := g.Do("down", func() error { called = true; return nil })
	if !errors.Is(err, errTestStopped) || err.Error() != "test: down: test: stopped" || called {
		t.Errorf("Do after Stop = %v (fn called: %v), want %q without the call", err, called, "test: down: test: stopped")
	}
}

func TestDir(t *testing.T) {
	t.Parallel()
	given := t.TempDir()
	d, err := MakeDir(given, "x-")
	if err != nil || d.Path != given {
		t.Fatalf("MakeDir(given) = %v, %v", d, err)
	}
	if err := d.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(given); err != nil {
		t.Errorf("Remove deleted the caller's directory: %v", err)
	}
	own, err := MakeDir("", "tollgate-lifecycle-test-")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(own.Path, "tollgate-lifecycle-test-") {
		t.Errorf("temp dir %q not named after the pattern", own.Path)
	}
	if err := own.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(own.Path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Remove left the owned directory: %v", err)
	}
}

// recordingTB records what StartTB does with the test.
type recordingTB struct {
	testing.TB
	ctx      context.Context
	cleanups []func()
	lines    []string
}

func (r *recordingTB) Helper()                  {}
func (r *recordingTB) Context() context.Context { return r.ctx }
func (r *recordingTB) Cleanup(f func())         { r.cleanups = append(r.cleanups, f) }
func (r *recordingTB) Errorf(format string, args ...any) {
	r.lines = append(r.lines, "error: "+fmt.Sprintf(format, args...))
}
func (r *recordingTB) Fatalf(format string, args ...any) {
	r.lines = append(r.lines, "fatal: "+fmt.Sprintf(format, args...))
}

type stopper struct{ err error }

func (s *stopper) Stop() error { return s.err }

func TestStartTB(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	for _, tc := range []struct {
		name     string
		startErr error
		stopErr  error
		want     []string
		cleanups int
	}{
		{"started and stopped", nil, nil, nil, 1},
		{"stop fails", nil, boom, []string{"error: stop thing: boom"}, 1},
		{"start fails", boom, nil, []string{"fatal: start thing: boom"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := &recordingTB{ctx: t.Context()}
			StartTB(tb, "thing", func(ctx context.Context) (*stopper, error) {
				if ctx != t.Context() {
					t.Error("start not given tb.Context")
				}
				if tc.startErr != nil {
					return nil, tc.startErr
				}
				return &stopper{tc.stopErr}, nil
			})
			if len(tb.cleanups) != tc.cleanups {
				t.Fatalf("%d cleanups registered, want %d", len(tb.cleanups), tc.cleanups)
			}
			for _, f := range tb.cleanups {
				f()
			}
			if strings.Join(tb.lines, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("test saw %q, want %q", tb.lines, tc.want)
			}
		})
	}
}
