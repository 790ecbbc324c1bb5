// Package redistest starts redis-server processes for tests through package
// redisserver and stops them with tb.Cleanup. It is the only part that
// imports "testing", so production binaries that use redisserver (make run)
// do not link it.
//
// A missing redis-server fails the test, never skips it: a skipped Redis
// test passes CI while testing nothing. The failure names the command that
// installs it (make deps does it for you).
package redistest

import (
	"bytes"
	"errors"
	"os"
	"testing"

	"github.com/tollgate/tollgate/compose/redisserver"
)

// logTailBytes is how much of a server's log a failed test prints.
const logTailBytes = 2048

// StartTB starts a redis-server (see redisserver.Start) for the test and
// registers its Stop with tb.Cleanup. If the test has failed by then, the
// tail of the server's log is logged first. The start is bounded by
// tb.Context and the start timeout. Any error fails the test at once.
func StartTB(tb testing.TB, opts ...redisserver.Option) *redisserver.Server {
	tb.Helper()
	s, err := redisserver.Start(tb.Context(), opts...)
	if err != nil {
		fatal(tb, err)
	}
	tb.Cleanup(func() { stop(tb, s) })
	return s
}

// StartClusterTB starts a Redis Cluster of n primaries (see
// redisserver.StartCluster, about 2–3s) and registers its Stop with
// tb.Cleanup. Any error fails the test at once.
func StartClusterTB(tb testing.TB, n int, opts ...redisserver.Option) *redisserver.Cluster {
	tb.Helper()
	c, err := redisserver.StartCluster(tb.Context(), n, opts...)
	if err != nil {
		fatal(tb, err)
	}
	tb.Cleanup(func() {
		for _, node := range c.Nodes() {
			logTail(tb, node)
		}
		if err := c.Stop(); err != nil {
			tb.Errorf("stop redis cluster: %v", err)
		}
	})
	return c
}

// StartSentinelTB starts a primary, a replica and three sentinels (see
// redisserver.StartSentinel, a few seconds) and registers their Stop with
// tb.Cleanup. Any error fails the test at once.
func StartSentinelTB(tb testing.TB, opts ...redisserver.Option) *redisserver.Sentinel {
	tb.Helper()
	st, err := redisserver.StartSentinel(tb.Context(), opts...)
	if err != nil {
		fatal(tb, err)
	}
	tb.Cleanup(func() {
		for _, s := range append([]*redisserver.Server{st.Primary(), st.Replica()}, st.Sentinels()...) {
			logTail(tb, s)
		}
		if err := st.Stop(); err != nil {
			tb.Errorf("stop redis sentinel: %v", err)
		}
	})
	return st
}

// fatal fails the test, with the install command when redis-server is missing.
func fatal(tb testing.TB, err error) {
	tb.Helper()
	if errors.Is(err, redisserver.ErrNotFound) {
		tb.Fatalf("%v\nredis-server is required by this test and is not installed; install it with:\n"+
			"    %s            (as root)\n    sudo %s       (otherwise)\nor run `make deps`, "+
			"or point %s at a redis-server binary.",
			err, redisserver.InstallCommand, redisserver.InstallCommand, redisserver.EnvServer)
	}
	tb.Fatalf("start redis: %v", err)
}

func stop(tb testing.TB, s *redisserver.Server) {
	logTail(tb, s)
	if err := s.Stop(); err != nil {
		tb.Errorf("stop redis: %v", err)
	}
}

// logTail logs the end of s's log if the test failed, before Stop deletes it.
func logTail(tb testing.TB, s *redisserver.Server) {
	if !tb.Failed() {
		return
	}
	b, err := os.ReadFile(s.LogPath())
	if err != nil {
		return
	}
	if len(b) > logTailBytes {
		b = b[len(b)-logTailBytes:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	tb.Logf("redis-server %s log tail (%s):\n%s", s.Addr(), s.LogPath(), b)
}
