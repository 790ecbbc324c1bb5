package redisserver_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/compose/redisserver"
	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/internal/spawn/spawntest"
	"github.com/tollgate/tollgate/internal/testnet"
	"github.com/tollgate/tollgate/internal/testwait"
)

func TestStartServesPing(t *testing.T) {
	t.Parallel()
	s := redistest.StartTB(t)

	host, port, err := net.SplitHostPort(s.Addr())
	if err != nil || host != "127.0.0.1" || port != strconv.Itoa(s.Port()) {
		t.Fatalf("Addr() = %q, Port() = %d", s.Addr(), s.Port())
	}
	cl := s.Client()
	defer cl.Close()
	if err := cl.Ping(t.Context()).Err(); err != nil {
		t.Fatalf("ping: %v", err)
	}
	if s.Pid() == 0 {
		t.Fatal("Pid() = 0 for a running server")
	}
	b, err := os.ReadFile(s.LogPath())
	if err != nil || !strings.Contains(string(b), "Ready to accept connections") {
		t.Fatalf("log %s: err %v, content:\n%s", s.LogPath(), err, b)
	}
}

func TestDefaultsAndArgs(t *testing.T) {
	t.Parallel()
	s := redistest.StartTB(t, redisserver.WithArgs("--maxmemory", "1mb"))
	cl := s.Client()
	defer cl.Close()

	for _, tc := range []struct{ param, want string }{
		{"save", ""},
		{"appendonly", "no"},
		{"protected-mode", "yes"},
		{"bind", "127.0.0.1"},
		{"repl-diskless-sync-delay", "0"},
		{"dir", s.Dir()},
		{"maxmemory", "1048576"},
	} {
		t.Run(tc.param, func(t *testing.T) {
			got, err := cl.ConfigGet(t.Context(), tc.param).Result()
			if err != nil {
				t.Fatalf("CONFIG GET: %v", err)
			}
			if got[tc.param] != tc.want {
				t.Fatalf("%s = %q, want %q", tc.param, got[tc.param], tc.want)
			}
		})
	}
}

func TestKillAndRestart(t *testing.T) {
	t.Parallel()
	s := redistest.StartTB(t)
	ctx := t.Context()
	cl := s.Client()
	defer cl.Close()
	if err := cl.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("set: %v", err)
	}
	port, pid := s.Port(), s.Pid()

	if err := s.Kill(); err != nil {
		t.Fatalf("kill: %v", err)
	}
	if s.Pid() != 0 {
		t.Fatal("Pid() != 0 after Kill")
	}
	if err := cl.Ping(ctx).Err(); err == nil {
		t.Fatal("ping succeeded after Kill")
	}
	if err := s.Kill(); err != nil {
		t.Fatalf("second kill: %v", err)
	}
	if err := s.Pause(); !errors.Is(err, redisserver.ErrNotRunning) {
		t.Fatalf("pause of a killed server: %v, want ErrNotRunning", err)
	}

	start := time.Now()
	if err := s.Restart(ctx); err != nil {
		t.Fatalf("restart: %v", err)
	}
	t.Logf("restart took %v", time.Since(start))
	if s.Port() != port || s.Pid() == pid || s.Pid() == 0 {
		t.Fatalf("after restart port %d pid %d, before port %d pid %d", s.Port(), s.Pid(), port, pid)
	}
	// The pooled connection died with the old process; the next call redials.
	testwait.Eventually(t, 5*time.Second, func() error { return cl.Ping(ctx).Err() })
	if err := cl.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("get after restart: %v, want redis.Nil (empty data)", err)
	}

	// Restart of a running server kills it first.
	pid = s.Pid()
	if err := s.Restart(ctx); err != nil {
		t.Fatalf("restart of a running server: %v", err)
	}
	if s.Pid() == pid {
		t.Fatal("restart of a running server kept the old process")
	}
}

func TestRestartWaitsForPort(t *testing.T) {
	t.Parallel()
	s := redistest.StartTB(t)
	if err := s.Kill(); err != nil {
		t.Fatalf("kill: %v", err)
	}
	l, err := net.Listen("tcp", s.Addr())
	if err != nil {
		t.Fatalf("occupy port: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	err = s.Restart(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(strings.ToLower(err.Error()), "address already in use") {
		t.Fatalf("restart on a taken port: %v, want deadline exceeded naming the taken address", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Restart(t.Context()); err != nil {
		t.Fatalf("restart once the port is free: %v", err)
	}
}

func TestPauseMakesClientsTimeOutAndResumeRecovers(t *testing.T) {
	t.Parallel()
	s := redistest.StartTB(t)
	opts := s.ClientOptions()
	opts.DialTimeout, opts.ReadTimeout, opts.WriteTimeout = 100*time.Millisecond, 100*time.Millisecond, 100*time.Millisecond
	cl := redis.NewClient(opts)
	defer cl.Close()
	ctx := t.Context()
	if err := cl.Ping(ctx).Err(); err != nil {
		t.Fatalf("ping: %v", err)
	}

	if err := s.Pause(); err != nil {
		t.Fatalf("pause: %v", err)
	}
	start := time.Now()
	err := cl.Ping(ctx).Err()
	elapsed := time.Since(start)
	if err == nil {
		t.Fatal("ping of a paused server succeeded")
	}
	if elapsed > time.Second {
		t.Fatalf("ping of a paused server took %v, want about 100ms", elapsed)
	}
	t.Logf("paused server: ping failed after %v: %v", elapsed, err)

	if err := s.Resume(); err != nil {
		t.Fatalf("resume: %v", err)
	}
	took := testwait.Eventually(t, 5*time.Second, func() error { return cl.Ping(ctx).Err() })
	t.Logf("resumed server answered after %v", took)
}

// processesRunning returns the live processes whose command line mentions s.
func processesRunning(s string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && strings.Contains(string(b), s) && spawntest.Alive(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// fakeServer writes a script that records its pid and never answers.
func fakeServer(t *testing.T) (bin, pidFile string) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("uses /bin/sh and /proc")
	}
	dir := t.TempDir()
	pidFile = filepath.Join(dir, "pid")
	bin = filepath.Join(dir, "redis-server")
	script := fmt.Sprintf("#!/bin/sh\necho $$ > %s.tmp && mv %s.tmp %s\nexec sleep 60\n", pidFile, pidFile, pidFile)
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin, pidFile
}

func TestStartKillsProcessWhenNotReady(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		opts    []redisserver.Option
		timeout time.Duration // context timeout
		want    error
	}{
		{"context deadline", nil, time.Second, context.DeadlineExceeded},
		{"start timeout", []redisserver.Option{redisserver.WithStartTimeout(time.Second)}, time.Minute, context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			bin, pidFile := fakeServer(t)
			ctx, cancel := context.WithTimeout(t.Context(), tc.timeout)
			defer cancel()
			s, err := redisserver.Start(ctx, append(tc.opts, redisserver.WithBinary(bin))...)
			if s != nil || !errors.Is(err, tc.want) {
				t.Fatalf("Start = %v, %v; want nil, %v", s, err, tc.want)
			}
			b, err := os.ReadFile(pidFile)
			if err != nil {
				// Killed before it wrote its pid (a loaded machine): look
				// for any process still running the script instead.
				t.Logf("fake server wrote no pid (%v); scanning /proc", err)
				if pids := processesRunning(bin); len(pids) > 0 {
					t.Fatalf("processes %v left running %s", pids, bin)
				}
				return
			}
			pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			if spawntest.Alive(pid) {
				t.Fatalf("process %d left running", pid)
			}
		})
	}
}

func TestStartCanceledContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if s, err := redisserver.Start(ctx); s != nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("Start with a canceled context = %v, %v; want nil, context.Canceled", s, err)
	}
}

func TestStartReportsStartupFailure(t *testing.T) {
	t.Parallel()
	_, err := redisserver.Start(t.Context(), redisserver.WithArgs("--no-such-directive", "yes"))
	if err == nil || !strings.Contains(err.Error(), "no-such-directive") {
		t.Fatalf("Start with a bad directive: %v, want the log naming it", err)
	}
}

func TestLookPathHonoursEnvironment(t *testing.T) {
	t.Setenv(redisserver.EnvServer, filepath.Join(t.TempDir(), "missing-redis-server"))
	if _, err := redisserver.LookPath(); !errors.Is(err, redisserver.ErrNotFound) {
		t.Fatalf("LookPath with a missing $%s: %v, want ErrNotFound", redisserver.EnvServer, err)
	}
	if _, err := redisserver.Start(t.Context()); !errors.Is(err, redisserver.ErrNotFound) {
		t.Fatalf("Start with a missing $%s: %v, want ErrNotFound", redisserver.EnvServer, err)
	}
}

func TestStartTBFailsWithInstallCommand(t *testing.T) {
	t.Parallel()
	msg := testnet.RecordFatal(t, func(tb testing.TB) {
		redistest.StartTB(tb, redisserver.WithBinary(filepath.Join(t.TempDir(), "absent")))
	})
	for _, want := range []string{"apt-get install -y redis-server", "sudo apt-get install -y redis-server"} {
		if !strings.Contains(msg, want) {
			t.Errorf("failure message does not contain %q:\n%s", want, msg)
		}
	}
}

func TestCluster(t *testing.T) {
	t.Parallel()
	start := time.Now()
	c := redistest.StartClusterTB(t, 3)
	t.Logf("3-node cluster ready in %v", time.Since(start))
	ctx := t.Context()
	if len(c.Nodes()) != 3 || len(c.Addrs()) != 3 {
		t.Fatalf("Nodes() %d, Addrs() %d, want 3", len(c.Nodes()), len(c.Addrs()))
	}

	cl := c.Client()
	defer cl.Close()
	const keys = 64
	for i := range keys {
		if err := cl.Set(ctx, "key:"+strconv.Itoa(i), i, 0).Err(); err != nil {
			t.Fatalf("set: %v", err)
		}
	}
	for i := range keys {
		got, err := cl.Get(ctx, "key:"+strconv.Itoa(i)).Int()
		if err != nil || got != i {
			t.Fatalf("get key:%d = %d, %v", i, got, err)
		}
	}
	// The keys spread over every shard.
	for _, node := range c.Nodes() {
		ncl := node.Client()
		n, err := ncl.DBSize(ctx).Result()
		ncl.Close()
		if err != nil || n == 0 {
			t.Fatalf("node %s holds %d keys (%v), want some", node.Addr(), n, err)
		}
	}

	t.Run("restarted node keeps its slots and loses its keys", func(t *testing.T) {
		node := c.Nodes()[0]
		ncl := node.Client()
		defer ncl.Close()
		var key string
		for i := range keys {
			k := "key:" + strconv.Itoa(i)
			if slot, err := ncl.ClusterKeySlot(ctx, k).Result(); err == nil && slot < 16384/3 {
				key = k
				break
			}
		}
		if key == "" {
			t.Fatal("no key on node 0")
		}
		if err := node.Restart(ctx); err != nil {
			t.Fatalf("restart: %v", err)
		}
		took := testwait.Eventually(t, 15*time.Second, func() error {
			info, err := ncl.ClusterInfo(ctx).Result()
			if err != nil {
				return err
			}
			if !strings.Contains(info, "cluster_state:ok") {
				return errors.New("cluster_state not ok")
			}
			return nil
		})
		t.Logf("node back to cluster_state:ok %v after restart", took)
		testwait.Eventually(t, 5*time.Second, func() error {
			err := cl.Get(ctx, key).Err()
			if errors.Is(err, redis.Nil) {
				return nil
			}
			return fmt.Errorf("get %s: %v, want redis.Nil", key, err)
		})
	})
}

func TestStartClusterRejectsFewerThanThreeNodes(t *testing.T) {
	t.Parallel()
	if _, err := redisserver.StartCluster(t.Context(), 2); err == nil {
		t.Fatal("StartCluster(2) succeeded")
	}
}

func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	start := time.Now()
	st := redistest.StartSentinelTB(t)
	t.Logf("sentinel setup ready in %v", time.Since(start))
	if st.MasterName() != redisserver.MasterName || len(st.SentinelAddrs()) != 3 {
		t.Fatalf("MasterName() %q, SentinelAddrs() %v", st.MasterName(), st.SentinelAddrs())
	}
	ctx := t.Context()
	cl := st.Client()
	defer cl.Close()
	if err := cl.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("set through sentinel: %v", err)
	}

	if err := st.Primary().Kill(); err != nil {
		t.Fatalf("kill primary: %v", err)
	}
	killed := time.Now()
	testwait.Eventually(t, 20*time.Second, func() error { return cl.Set(ctx, "k2", "v2", 0).Err() })
	t.Logf("writes succeed again %v after SIGKILL of the primary", time.Since(killed))

	rcl := st.Replica().Client()
	defer rcl.Close()
	info, err := rcl.Info(ctx, "replication").Result()
	if err != nil || !strings.Contains(info, "role:master") {
		t.Fatalf("replica after failover: %v\n%s", err, info)
	}
}
