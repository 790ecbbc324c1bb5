package natsserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/tollgate/tollgate/compose/internal/loopback"
)

// Errors returned by this package; match them with errors.Is. A start on a
// port another process holds fails with an error that also matches
// syscall.EADDRINUSE.
var (
	// ErrStopped is returned by lifecycle operations after Stop.
	ErrStopped = errors.New("natsserver: server stopped")
	// ErrNotLoopback is returned by Start when WithListen names an address
	// that is not a loopback address: the server has no authentication.
	ErrNotLoopback = loopback.ErrNotLoopback
)

const (
	// defaultListen picks a free port on 127.0.0.1.
	defaultListen = "127.0.0.1:0"
	// defaultStartTimeout bounds Start and Up, above all Up's wait for the
	// port to be free again.
	defaultStartTimeout = 15 * time.Second
	// serverName stays the same across runs on one store directory.
	serverName = "tollgate-nats"
)

// Option configures Start.
type Option interface {
	apply(*config)
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	listen       string
	storeDir     string
	log          *slog.Logger
	startTimeout time.Duration
}

func newConfig(opts []Option) config {
	c := config{listen: defaultListen, startTimeout: defaultStartTimeout}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	return c
}

// WithListen sets the client address, "host:port" with a loopback host;
// port 0 picks a free port (nats-server's -1). Default: "127.0.0.1:0";
// make run uses "127.0.0.1:4222".
func WithListen(addr string) Option {
	return optionFunc(func(c *config) { c.listen = addr })
}

// WithStoreDir keeps JetStream's store in dir (created if missing) and
// recovers the streams, KV buckets and durable consumers a previous server
// left there; Stop leaves dir in place. Default: a new temporary directory,
// owned by the Server and removed by Stop. Either way the store survives
// Down, Up and Restart.
func WithStoreDir(dir string) Option {
	return optionFunc(func(c *config) { c.storeDir = dir })
}

// WithLogger sets the logger for lifecycle events (start, down, up, stop; one
// Info line each) and for nats-server's own log, mapped to slog levels:
// its notices (the start-up listing of version, limits and store, "Server
// is ready", …) are Debug, as the lifecycle lines say what matters of them
// in one line; its warnings and errors are Warn and Error, and its traces
// Debug-4 (the server computes debug and trace lines only when the handler
// is enabled for them). Default: nil, which discards.
func WithLogger(log *slog.Logger) Option {
	return optionFunc(func(c *config) { c.log = log })
}

// WithStartTimeout bounds Start and Up, which recover the JetStream store
// and, for Up, wait for the port to be free when another process briefly
// holds it; the context's deadline applies too. Default: 15s.
func WithStartTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d > 0 {
			c.startTimeout = d
		}
	})
}

// Server is an embedded nats-server with JetStream on a fixed loopback
// address. Its methods are safe for concurrent use; lifecycle operations
// (Down, Up, Restart, Stop) are serialized. The caller owns the Server and
// must call Stop.
type Server struct {
	cfg    config
	host   string
	port   int // fixed at Start
	dir    string
	ownDir bool // dir is a temporary directory Stop removes

	// mu guards srv and stopped, and is held for a whole lifecycle
	// operation so that Down, Up and Stop never interleave.
	mu      sync.Mutex
	srv     *server.Server // nil while down
	stopped bool

	stopOnce sync.Once
	stopErr  error
}

// Start starts nats-server with JetStream and returns once it accepts
// client connections with JetStream enabled. A taken port fails at once.
// ctx bounds only the start, and is checked between steps: nats-server
// recovers its store synchronously and cannot be interrupted. The
// nats-server goroutines are owned by the server, and Down and Stop wait
// for them to exit.
func Start(ctx context.Context, opts ...Option) (*Server, error) {
	cfg := newConfig(opts)
	host, port, err := loopback.Split(cfg.listen)
	if err != nil {
		return nil, fmt.Errorf("natsserver: start: %w", err)
	}
	s := &Server{cfg: cfg, host: host, port: port, dir: cfg.storeDir}
	if s.dir == "" {
		if s.dir, err = os.MkdirTemp("", "tollgate-nats-"); err != nil {
			return nil, fmt.Errorf("natsserver: start: temp dir: %w", err)
		}
		s.ownDir = true
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.startTimeout)
	defer cancel()
	t0 := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.run(ctx); err != nil {
		s.removeDir()
		return nil, fmt.Errorf("natsserver: start: %w", err)
	}
	s.port = s.srv.Addr().(*net.TCPAddr).Port
	s.cfg.log.Info("nats-server started", "url", s.ClientURL(), "store_dir", s.dir,
		"elapsed", time.Since(t0).Round(time.Microsecond))
	return s, nil
}

// run starts one nats-server on s.port (0: a free port) and sets s.srv.
// nats-server reports a failed listen only through its logger, so a fixed
// port is first bound and released here, which gives a taken port its
// proper error. s.mu must be held.
func (s *Server) run(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.port != 0 {
		l, err := net.Listen("tcp", s.Addr())
		if err != nil {
			return fmt.Errorf("listen %s: %w", s.Addr(), err)
		}
		if err := l.Close(); err != nil {
			return fmt.Errorf("listen %s: %w", s.Addr(), err)
		}
	}
	port := s.port
	if port == 0 {
		port = server.RANDOM_PORT // nats-server reads 0 as its default, 4222
	}
	ns, err := server.NewServer(&server.Options{
		ServerName: serverName,
		Host:       s.host,
		Port:       port,
		JetStream:  true,
		StoreDir:   s.dir,
		NoLog:      true, // no default logger; ours is set below
		NoSigs:     true, // the process's signals belong to its owner
		// No ASCII-art JetStream banner in the owner's log (make run's).
		DisableJetStreamBanner: true,
	})
	if err != nil {
		return fmt.Errorf("nats-server: %w", err)
	}
	la := &logAdapter{log: s.cfg.log}
	ctxb := context.Background()
	ns.SetLoggerV2(la, s.cfg.log.Enabled(ctxb, slog.LevelDebug), s.cfg.log.Enabled(ctxb, levelTrace), false)
	ns.Start() // returns once listening, or after a fatal error
	if ns.Addr() == nil || !ns.JetStreamEnabled() {
		ns.Shutdown()
		ns.WaitForShutdown()
		if msg := la.fatal(); msg != "" {
			return fmt.Errorf("nats-server: %s", msg)
		}
		return errors.New("nats-server: did not start (no listener or JetStream)")
	}
	deadline, _ := ctx.Deadline()
	if !ns.ReadyForConnections(time.Until(deadline)) {
		ns.Shutdown()
		ns.WaitForShutdown()
		return fmt.Errorf("nats-server: not ready for connections: %w", context.DeadlineExceeded)
	}
	s.srv = ns
	return nil
}

// ClientURL returns the URL clients connect to, "nats://127.0.0.1:port". It
// does not change across Down, Up and Restart.
func (s *Server) ClientURL() string { return "nats://" + s.Addr() }

// Addr returns the client address, "127.0.0.1:port". It does not change
// across Down, Up and Restart.
func (s *Server) Addr() string { return net.JoinHostPort(s.host, strconv.Itoa(s.port)) }

// StoreDir returns the JetStream store directory.
func (s *Server) StoreDir() string { return s.dir }

// Down shuts the server down, as a stopped nats-server process would be:
// JetStream flushes its store, every client connection is closed, and Down
// returns once every nats-server goroutine has exited. Clients then retry
// the port (nats.go reconnects by default). Down on a server that is down
// does nothing.
func (s *Server) Down() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return fmt.Errorf("natsserver: down: %w", ErrStopped)
	}
	s.down()
	s.cfg.log.Info("nats-server down", "url", s.ClientURL())
	return nil
}

// down shuts the current server down, if any. s.mu must be held.
func (s *Server) down() {
	if s.srv == nil {
		return
	}
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
	s.srv = nil
}

// Up starts the server again on the same port with the same store, waiting
// (within the start timeout and ctx) while the port is taken. Up on a
// running server does nothing. ctx bounds only the start.
func (s *Server) Up(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return fmt.Errorf("natsserver: up: %w", ErrStopped)
	}
	if s.srv != nil {
		return nil
	}
	t0 := time.Now()
	if err := s.runRetry(ctx); err != nil {
		return fmt.Errorf("natsserver: up: %w", err)
	}
	s.cfg.log.Info("nats-server up", "url", s.ClientURL(), "elapsed", time.Since(t0).Round(time.Microsecond))
	return nil
}

// runRetry calls run until it succeeds or the start timeout or ctx ends.
// s.mu must be held.
func (s *Server) runRetry(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.startTimeout)
	defer cancel()
	t := time.NewTimer(0)
	defer t.Stop()
	var last error
	for {
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("%w (last: %w)", ctx.Err(), last)
			}
			return ctx.Err()
		case <-t.C:
		}
		if last = s.run(ctx); last == nil {
			return nil
		}
		t.Reset(10 * time.Millisecond)
	}
}

// Restart is Down followed by Up: a server bounce that clients ride through
// by reconnecting.
func (s *Server) Restart(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return fmt.Errorf("natsserver: restart: %w", ErrStopped)
	}
	t0 := time.Now()
	s.down()
	if err := s.runRetry(ctx); err != nil {
		return fmt.Errorf("natsserver: restart: %w", err)
	}
	s.cfg.log.Info("nats-server restarted", "url", s.ClientURL(), "elapsed", time.Since(t0).Round(time.Microsecond))
	return nil
}

// Stop shuts the server down as Down does and removes the store directory
// if the Server created it. Stop is idempotent and safe from many
// goroutines: every call returns after the first has finished, with its
// result. After Stop the other lifecycle methods return ErrStopped.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() { s.stopErr = s.stop() })
	return s.stopErr
}

func (s *Server) stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	s.down()
	if s.ownDir {
		if err := os.RemoveAll(s.dir); err != nil {
			return fmt.Errorf("natsserver: stop: %w", err)
		}
	}
	s.cfg.log.Info("nats-server stopped", "url", s.ClientURL())
	return nil
}

func (s *Server) removeDir() {
	if s.ownDir {
		_ = os.RemoveAll(s.dir)
	}
}
