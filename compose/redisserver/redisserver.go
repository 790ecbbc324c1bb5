// Package redisserver starts real redis-server processes on OS-chosen
// loopback ports, for tests and for the local stack (make run).
//
// A [Server] is one redis-server process in its own temporary directory. It
// can be paused (SIGSTOP), killed (SIGKILL) and restarted on the same port, so
// tests can inject the faults Tollgate must survive. [StartCluster] builds a
// Redis Cluster of n primaries and [StartSentinel] a primary, a replica and
// three sentinels. Test code should use package redistest, which registers
// the cleanup and fails the test with the install command when redis-server
// is missing; this package does not link "testing" into binaries.
//
// The binary is taken from $TOLLGATE_REDIS_SERVER, else from PATH (see
// [LookPath]). Every server runs with
//
//	--bind 127.0.0.1 --port N --save "" --appendonly no --protected-mode yes
//	--dir <tempdir> --repl-diskless-sync-delay 0
//
// followed by the arguments of [WithArgs]; redis keeps the last value of a
// directive, so WithArgs can override the defaults. Nothing is persisted.
//
// On Linux each process gets SIGKILL from the kernel when the Go process that
// started it dies (Pdeathsig), so a crashed or timed-out test binary leaves no
// orphan redis-server behind. Because Linux sends that signal when the
// spawning OS thread exits, each process is started and waited for on a
// goroutine locked to its thread: every running server holds one OS thread
// (package internal/spawn, whose tests show the child dying with its
// parent).
package redisserver

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/tollgate/tollgate/compose/internal/lifecycle"
	"github.com/tollgate/tollgate/internal/service"
	"github.com/tollgate/tollgate/internal/spawn"
)

// EnvServer names the environment variable that, when set, gives the path of
// the redis-server binary to run instead of the one found on PATH.
const EnvServer = "TOLLGATE_REDIS_SERVER"

// InstallCommand is the command that installs redis-server (with redis-cli
// and redis-benchmark) on Debian and Ubuntu. Run it as root, or prefix sudo.
const InstallCommand = "apt-get install -y redis-server"

// Errors returned by this package; match them with errors.Is.
var (
	// ErrNotFound means no redis-server binary was found: $TOLLGATE_REDIS_SERVER
	// is unset and redis-server is not on PATH, or the variable names a file
	// that cannot be run.
	ErrNotFound = errors.New("redisserver: redis-server not found (set " + EnvServer +
		" or install it: " + InstallCommand + ")")
	// ErrStopped is returned by operations on a Server after Stop.
	ErrStopped = errors.New("redisserver: server stopped")
	// ErrNotRunning is returned by Pause and Resume when the process has
	// exited (after Kill, or a crash) and has not been restarted.
	ErrNotRunning = errors.New("redisserver: process not running")
)

// errAddrInUse marks a start that failed because the port was taken; Start
// retries on another port, Restart on the same one.
var errAddrInUse = errors.New("address already in use")

const (
	// stopGrace is how long Stop waits after SIGTERM before it sends SIGKILL.
	stopGrace = 5 * time.Second
	// portAttempts is how many fresh ports Start tries when redis fails to bind.
	portAttempts = 5
	// clientTimeout is the dial, read and write timeout of Client.
	clientTimeout = 500 * time.Millisecond
	// logName is the file in the server's directory that receives its output.
	logName = "redis.log"
)

// Option configures Start, StartCluster and StartSentinel.
type Option = lifecycle.Option[config]

type config struct {
	lifecycle.Common
	binary   string
	args     []string
	confName string // file written to the server's dir and passed first
	confBody string
	keep     []string // file names Restart must not delete
}

func newConfig(opts []Option) config { return lifecycle.Apply(config{}, opts) }

// WithArgs appends redis-server command-line arguments after the defaults,
// for example WithArgs("--maxmemory", "64mb"). Each directive starts with
// "--"; redis keeps the last value given, so these override the defaults.
// Several WithArgs accumulate. Default: none.
func WithArgs(args ...string) Option {
	args = append([]string(nil), args...)
	return lifecycle.OptionFunc(func(c *config) { c.args = append(c.args, args...) })
}

// WithLogger sets the logger for lifecycle events (start, restart, stop; one
// line each). The redis-server output itself goes to LogPath. Default:
// nil, which discards.
func WithLogger(log *slog.Logger) Option {
	return lifecycle.WithLogger[config](log)
}

// WithStartTimeout bounds how long Start and Restart wait for the process to
// answer, and how long StartCluster and StartSentinel wait for the topology to
// converge; the context's deadline applies too. Default: 15s.
func WithStartTimeout(d time.Duration) Option {
	return lifecycle.WithStartTimeout[config](d)
}

// WithBinary runs the redis-server at path. Default: $TOLLGATE_REDIS_SERVER,
// else redis-server from PATH.
func WithBinary(path string) Option {
	return lifecycle.OptionFunc(func(c *config) { c.binary = path })
}

// WithConfigFile writes body to name in the server's directory and passes
// it as redis-server's first argument, before the default arguments:
// sentinels need a writable config file of their own (they rewrite it),
// which is how a caller builds a Sentinel topology other than
// StartSentinel's. Restart keeps the file, and what the server wrote to
// it. Default: none.
func WithConfigFile(name, body string) Option {
	return lifecycle.OptionFunc(func(c *config) {
		c.confName, c.confBody = name, body
		c.keep = append(c.keep, name)
	})
}

// LookPath returns the redis-server binary Start would run: the path in
// $TOLLGATE_REDIS_SERVER when set, else redis-server from PATH. The error
// wraps ErrNotFound, so callers (make run, redistest) can fall back or tell
// the user to run InstallCommand.
func LookPath() (string, error) {
	return lookPath("")
}

func lookPath(explicit string) (string, error) {
	name := explicit
	if name == "" {
		name = os.Getenv(EnvServer)
	}
	name = cmp.Or(name, "redis-server")
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	return p, nil
}

// Server is one redis-server process listening on 127.0.0.1. Its methods are
// safe for concurrent use; lifecycle operations (Kill, Restart, Stop) are
// serialized. The caller owns the Server and must call Stop.
type Server struct {
	bin     string
	args    []string // user arguments, after the defaults
	dir     string
	logPath string
	port    int
	busPort int // cluster bus port, 0 unless cluster mode
	confArg string
	keep    map[string]bool
	log     *slog.Logger
	timeout time.Duration

	// life guards proc, and is held for a whole lifecycle operation so
	// that Kill, Restart and Stop never interleave.
	life lifecycle.Guard
	proc *spawn.Process // the current run of redis-server
}

// Start runs redis-server on a free 127.0.0.1 port and returns once it
// answers, or fails. ctx bounds only the start: cancelling it later does not
// stop the server; call Stop. If ctx is done before the server is ready, the
// process is killed and ctx's error is returned. The port is picked by
// listening on 127.0.0.1:0 and closing; if redis then cannot bind it (another
// process took it), Start tries a new port, up to 5 times. In cluster mode
// (WithArgs("--cluster-enabled", "yes")) the cluster bus gets its own free
// port through --cluster-port unless one is given, so it never collides with
// port+10000.
//
// Start starts one goroutine per process run, which waits for the process to
// exit; Kill and Stop wait for it.
func Start(ctx context.Context, opts ...Option) (*Server, error) {
	cfg := newConfig(opts)
	bin, err := lookPath(cfg.binary)
	if err != nil {
		return nil, fmt.Errorf("redisserver: start: %w", err)
	}
	dir, err := os.MkdirTemp("", "tollgate-redis-")
	if err != nil {
		return nil, fmt.Errorf("redisserver: start: temp dir: %w", err)
	}
	s := &Server{
		bin:     bin,
		args:    cfg.args,
		dir:     dir,
		logPath: filepath.Join(dir, logName),
		keep:    map[string]bool{logName: true},
		log:     cfg.Log,
		timeout: cfg.StartTimeout,
		life:    lifecycle.Guard{Name: "redisserver", ErrStopped: ErrStopped},
	}
	for _, name := range cfg.keep {
		s.keep[name] = true
	}
	if name := argValue(cfg.args, "--cluster-config-file"); name != "" {
		s.keep[name] = true
	}
	if cfg.confName != "" {
		s.confArg = filepath.Join(dir, cfg.confName)
		if err := os.WriteFile(s.confArg, []byte(cfg.confBody), 0o600); err != nil {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("redisserver: start: write config: %w", err)
		}
	}
	wantBus := argValue(cfg.args, "--cluster-enabled") == "yes" && argValue(cfg.args, "--cluster-port") == ""

	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	t0 := time.Now()
	for attempt := 1; ; attempt++ {
		if s.port, err = freePort(); err == nil && wantBus {
			s.busPort, err = freePort()
		}
		if err != nil {
			break
		}
		s.life.Lock()
		err = s.launch(ctx)
		s.life.Unlock()
		if err == nil {
			s.log.Info("redis-server started", "addr", s.Addr(), "pid", s.Pid(),
				"dir", s.dir, "elapsed", time.Since(t0).Round(time.Millisecond))
			return s, nil
		}
		if !errors.Is(err, errAddrInUse) || attempt == portAttempts {
			break
		}
		s.log.Debug("redis-server port taken, retrying", "port", s.port, "attempt", attempt)
	}
	_ = os.RemoveAll(dir)
	return nil, fmt.Errorf("redisserver: start: %w", err)
}

// argValue returns the first argument after the last occurrence of directive
// in args, or "".
func argValue(args []string, directive string) string {
	v := ""
	for i, a := range args {
		if strings.EqualFold(a, directive) && i+1 < len(args) {
			v = args[i+1]
		}
	}
	return v
}

// freePort asks the kernel for a free loopback port and releases it.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pick port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, fmt.Errorf("pick port: %w", err)
	}
	return port, nil
}

// commandArgs returns redis-server's full argument list for this server.
func (s *Server) commandArgs() []string {
	var args []string
	if s.confArg != "" {
		args = append(args, s.confArg)
	}
	args = append(args,
		"--bind", "127.0.0.1",
		"--port", strconv.Itoa(s.port),
		"--save", "",
		"--appendonly", "no",
		"--protected-mode", "yes",
		"--dir", s.dir,
		"--repl-diskless-sync-delay", "0",
	)
	if s.busPort != 0 {
		args = append(args, "--cluster-port", strconv.Itoa(s.busPort))
	}
	return append(args, s.args...)
}

// launch starts the process on s.port and waits until it answers. On
// failure the process is gone. s.life must be held.
func (s *Server) launch(ctx context.Context) error {
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("open log: %w", err)
	}
	// The child keeps its own descriptor; ours is not needed after Start.
	defer logf.Close()
	logStart, _ := logf.Seek(0, io.SeekEnd)

	cmd := exec.Command(s.bin, s.commandArgs()...)
	cmd.Dir = s.dir
	cmd.Stdout = logf
	cmd.Stderr = logf
	p, err := spawn.Start(cmd)
	if err != nil {
		return fmt.Errorf("exec %s: %w", s.bin, err)
	}
	s.proc = p
	if err := s.waitReady(ctx, p, logStart); err != nil {
		_ = p.Cmd.Process.Kill()
		<-p.Done()
		return err
	}
	return nil
}

// waitReady polls until the process p answers INFO with its own pid (so a
// server that another process put on the same port is not mistaken for it),
// p exits, or ctx ends.
func (s *Server) waitReady(ctx context.Context, p *spawn.Process, logStart int64) error {
	pid := p.Cmd.Process.Pid
	interval := time.Millisecond
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-p.Done():
		case <-ctx.Done():
		case <-timer.C:
		}
		if p.Exited() {
			tail := s.logSince(logStart)
			if strings.Contains(tail, "Address already in use") {
				return fmt.Errorf("port %d: %w", s.port, errAddrInUse)
			}
			return fmt.Errorf("redis-server exited before ready (%v); log %s:\n%s", p.Err(), s.logPath, tail)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("wait for redis-server on port %d: %w; log %s:\n%s",
				s.port, ctx.Err(), s.logPath, s.logSince(logStart))
		}
		if probePid(ctx, s.Addr()) == pid {
			return nil
		}
		interval = min(2*interval, 25*time.Millisecond)
		timer.Reset(interval)
	}
}

// probePid asks the server at addr for its process id with INFO server, and
// returns 0 if it cannot tell (not listening, loading, another error).
func probePid(ctx context.Context, addr string) int {
	d := net.Dialer{Timeout: 200 * time.Millisecond}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := conn.Write([]byte("INFO server\r\n")); err != nil {
		return 0
	}
	r := bufio.NewReader(conn)
	head, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(head, "$") {
		return 0 // "-LOADING ..." and other errors: not ready
	}
	n, err := strconv.Atoi(strings.TrimSpace(head[1:]))
	if err != nil || n < 0 {
		return 0
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, "process_id:"); ok {
			pid, _ := strconv.Atoi(strings.TrimSpace(v))
			return pid
		}
	}
	return 0
}

// logSince returns the server log written after offset, at most its last 4 KiB.
func (s *Server) logSince(offset int64) string {
	b, err := os.ReadFile(s.logPath)
	if err != nil || offset > int64(len(b)) {
		return ""
	}
	b = b[offset:]
	if len(b) > 4096 {
		b = b[len(b)-4096:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(b)
}

// Addr returns the server's address, "127.0.0.1:port". It does not change
// across Restart.
func (s *Server) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
}

// Port returns the server's TCP port. It does not change across Restart.
func (s *Server) Port() int { return s.port }

// BusPort returns the cluster bus port in cluster mode (--cluster-port), or
// 0 when the server is not a cluster node or the caller chose the bus port.
func (s *Server) BusPort() int { return s.busPort }

// Dir returns the server's working directory (--dir). Stop removes it.
func (s *Server) Dir() string { return s.dir }

// LogPath returns the file that receives the server's stdout and stderr, for
// debugging. Output of every run since Start is appended; Stop removes it.
func (s *Server) LogPath() string { return s.logPath }

// Pid returns the process id of the running redis-server, or 0 when it is
// not running (after Kill, a crash or Stop).
func (s *Server) Pid() int {
	s.life.Lock()
	defer s.life.Unlock()
	if s.proc == nil || s.proc.Exited() {
		return 0
	}
	return s.proc.Cmd.Process.Pid
}

// Kill sends SIGKILL and returns once the process has exited, so the port
// is closed when Kill returns. Data in memory is lost. Killing a server that
// is not running does nothing. Use Restart to bring it back.
func (s *Server) Kill() error {
	return s.life.Do("kill", func() error {
		if err := s.kill(); err != nil {
			return fmt.Errorf("redisserver: kill %s: %w", s.Addr(), err)
		}
		s.log.Info("redis-server killed", "addr", s.Addr())
		return nil
	})
}

// kill SIGKILLs the current process, if running, and waits. s.life must be held.
func (s *Server) kill() error {
	p := s.proc
	if p == nil || p.Exited() {
		return nil
	}
	if err := p.Cmd.Process.Kill(); err != nil && !p.Exited() {
		return err
	}
	<-p.Done()
	return nil
}

// Pause sends SIGSTOP: the server keeps its port and its connections but
// answers nothing, as a hung Redis would; the kernel still accepts new
// connections into the listen backlog. On Linux Pause returns once the
// process is stopped. Resume undoes it; Kill, Restart and Stop work on a
// paused server.
func (s *Server) Pause() error {
	return s.signal("pause", sigStop)
}

// Resume sends SIGCONT to a paused server; resuming a server that is not
// paused does nothing.
func (s *Server) Resume() error {
	return s.signal("resume", sigCont)
}

func (s *Server) signal(op string, sig os.Signal) error {
	return s.life.Do(op, func() error {
		p := s.proc
		if p == nil || p.Exited() {
			return fmt.Errorf("redisserver: %s %s: %w", op, s.Addr(), ErrNotRunning)
		}
		if err := p.Cmd.Process.Signal(sig); err != nil {
			return fmt.Errorf("redisserver: %s %s: %w", op, s.Addr(), err)
		}
		if sig == sigStop {
			waitStopped(p.Cmd.Process.Pid, p.Done())
		}
		return nil
	})
}

// Restart kills the process if it is running (SIGKILL, no shutdown) and
// starts redis-server again on the same port with the same arguments and
// empty data: every file in Dir is deleted except the log, a config file
// given by the package, and the cluster config file, so a cluster node
// keeps its node id and slots but loses its keys. If the port is briefly
// taken, Restart keeps trying until its start timeout or ctx ends. ctx
// bounds only the restart.
func (s *Server) Restart(ctx context.Context) error {
	return s.life.Do("restart", func() error { return s.restart(ctx) })
}

// restart is Restart's work. s.life must be held.
func (s *Server) restart(ctx context.Context) error {
	if err := s.kill(); err != nil {
		return fmt.Errorf("redisserver: restart %s: kill: %w", s.Addr(), err)
	}
	if err := s.wipe(); err != nil {
		return fmt.Errorf("redisserver: restart %s: %w", s.Addr(), err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	t0 := time.Now()
	err := service.Poll(ctx, 10*time.Millisecond, func() (bool, error) {
		err := s.launch(ctx)
		if errors.Is(err, errAddrInUse) {
			return false, err
		}
		return true, err
	})
	if err != nil {
		return fmt.Errorf("redisserver: restart %s: %w", s.Addr(), err)
	}
	s.log.Info("redis-server restarted", "addr", s.Addr(), "pid", s.proc.Cmd.Process.Pid,
		"elapsed", time.Since(t0).Round(time.Millisecond))
	return nil
}

// wipe deletes the server's data files, keeping s.keep.
func (s *Server) wipe() error {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("wipe data: %w", err)
	}
	for _, e := range entries {
		if s.keep[e.Name()] {
			continue
		}
		if err := os.RemoveAll(filepath.Join(s.dir, e.Name())); err != nil {
			return fmt.Errorf("wipe data: %w", err)
		}
	}
	return nil
}

// Stop shuts the server down: it resumes a paused process, sends SIGTERM,
// waits up to 5s, then sends SIGKILL; then it deletes Dir, log included.
// Stop is idempotent and safe from many goroutines: every call returns after
// the first has finished, with its result. After Stop the other lifecycle
// methods return ErrStopped.
func (s *Server) Stop() error {
	return s.life.Stop(s.stop)
}

// stop is Stop's work. s.life must be held.
func (s *Server) stop() error {
	var errs []error
	if p := s.proc; p != nil && !p.Exited() {
		_ = p.Cmd.Process.Signal(sigCont)
		_ = p.Cmd.Process.Signal(sigTerm)
		t := time.NewTimer(stopGrace)
		select {
		case <-p.Done():
		case <-t.C:
			s.log.Warn("redis-server ignored SIGTERM, killing", "addr", s.Addr())
			if err := s.kill(); err != nil {
				errs = append(errs, fmt.Errorf("kill: %w", err))
			}
		}
		t.Stop()
	}
	if err := os.RemoveAll(s.dir); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("redisserver: stop %s: %w", s.Addr(), err)
	}
	s.log.Info("redis-server stopped", "addr", s.Addr())
	return nil
}

// ClientOptions returns fresh go-redis options for this server with short
// timeouts: dial, read and write 500ms, context deadlines honoured
// (ContextTimeoutEnabled), no automatic retries (a retried script runs
// twice), no CLIENT SETINFO and no maintenance notifications (Redis 7.0
// knows neither). Adjust them before use.
func (s *Server) ClientOptions() *redis.Options {
	return testOptions(s.Addr()).Simple()
}

// testOptions are the options of ClientOptions, ClusterOptions and
// Sentinel.FailoverOptions, for the servers at addrs.
func testOptions(addrs ...string) *redis.UniversalOptions {
	return &redis.UniversalOptions{
		Addrs:                    addrs,
		DialTimeout:              clientTimeout,
		ReadTimeout:              clientTimeout,
		WriteTimeout:             clientTimeout,
		ContextTimeoutEnabled:    true,
		MaxRetries:               -1,
		DisableIdentity:          true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
}

// Client returns a new go-redis client for this server built from
// ClientOptions. The caller closes it.
func (s *Server) Client() *redis.Client {
	return redis.NewClient(s.ClientOptions())
}
