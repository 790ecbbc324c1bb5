package natsserver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/tollgate/tollgate/compose/internal/lifecycle"
	"github.com/tollgate/tollgate/compose/internal/loopback"
	"github.com/tollgate/tollgate/compose/linkproxy"
	"github.com/tollgate/tollgate/internal/service"
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
	// serverName stays the same across runs on one store directory; a
	// server with a domain appends it, as linked servers must have
	// distinct names.
	serverName = "tollgate-nats"
	// leafReconnect is how often a leafnode remote retries a lost link.
	leafReconnect = 250 * time.Millisecond
	// linkDialTimeout bounds a leafnode link proxy's dial of its remote.
	linkDialTimeout = time.Second
)

// Option configures Start.
type Option = lifecycle.Option[config]

type config struct {
	lifecycle.Common
	listen      string
	storeDir    string
	domain      string
	leafListen  string
	leafRemotes []string
}

// WithListen sets the client address, "host:port" with a loopback host;
// port 0 picks a free port (nats-server's -1). Default: "127.0.0.1:0";
// make run uses "127.0.0.1:4222".
func WithListen(addr string) Option {
	return lifecycle.OptionFunc(func(c *config) { c.listen = addr })
}

// WithStoreDir keeps JetStream's store in dir (created if missing) and
// recovers the streams, KV buckets and durable consumers a previous server
// left there; Stop leaves dir in place. Default: a new temporary directory,
// owned by the Server and removed by Stop. Either way the store survives
// Down, Up and Restart.
func WithStoreDir(dir string) Option {
	return lifecycle.OptionFunc(func(c *config) { c.storeDir = dir })
}

// WithDomain sets the server's JetStream domain, a region's name: streams,
// KV buckets and consumers created through the server live in that domain,
// and a client reaches another linked region's JetStream only by naming its
// domain. Linked servers must have distinct domains, so that JetStream
// traffic never crosses a link unasked and each region's JetStream keeps
// answering while its links are down. The server's name becomes
// "tollgate-nats-<domain>". Default: none (a single server).
func WithDomain(name string) Option {
	return lifecycle.OptionFunc(func(c *config) { c.domain = name })
}

// WithLeafnodeListen makes the server accept leafnode connections (links
// from other regions' servers) on addr, "host:port" with a loopback host;
// port 0 picks a free port, kept across Down, Up and Restart. Default: no
// leafnode listener.
func WithLeafnodeListen(addr string) Option {
	return lifecycle.OptionFunc(func(c *config) { c.leafListen = addr })
}

// WithLeafnodeRemotes links the server to other servers' leafnode
// listeners, one link per URL ("nats-leaf://host:port"). A lost link is
// retried every 250ms, for as long as the server runs; Server.CutLinks and
// Server.HealLinks take the links down and up on purpose. Leafnode links
// must form a tree: a cycle is refused by the servers. Default: none.
func WithLeafnodeRemotes(urls ...string) Option {
	return lifecycle.OptionFunc(func(c *config) { c.leafRemotes = slices.Clone(urls) })
}

// WithLogger sets the logger for lifecycle events (start, down, up, stop; one
// Info line each) and for nats-server's own log, mapped to slog levels:
// its notices (the start-up listing of version, limits and store, "Server
// is ready", …) are Debug, as the lifecycle lines say what matters of them
// in one line; its warnings and errors are Warn and Error, and its traces
// Debug-4 (the server computes debug and trace lines only when the handler
// is enabled for them). Default: nil, which discards.
func WithLogger(log *slog.Logger) Option {
	return lifecycle.WithLogger[config](log)
}

// WithStartTimeout bounds Start and Up, which recover the JetStream store
// and, for Up, wait for the port to be free when another process briefly
// holds it; the context's deadline applies too. Default: 15s.
func WithStartTimeout(d time.Duration) Option {
	return lifecycle.WithStartTimeout[config](d)
}

// Server is an embedded nats-server with JetStream on a fixed loopback
// address. Its methods are safe for concurrent use; lifecycle operations
// (Down, Up, Restart, Stop) are serialized. The caller owns the Server and
// must call Stop.
type Server struct {
	cfg      config
	host     string
	port     int // fixed at Start
	leafHost string
	leafPort int // fixed at Start; 0 without a leafnode listener
	remotes  []*url.URL
	links    []*linkproxy.Proxy // one per remote: the path CutLinks cuts
	dir      lifecycle.Dir

	// life guards srv, and is held for a whole lifecycle operation so
	// that Down, Up and Stop never interleave.
	life lifecycle.Guard
	srv  *server.Server // nil while down
	cut  bool           // the remotes are disabled (CutLinks)
}

// Start starts nats-server with JetStream and returns once it accepts
// client connections with JetStream enabled. A taken port fails at once.
// ctx bounds only the start, and is checked between steps: nats-server
// recovers its store synchronously and cannot be interrupted. The
// nats-server goroutines are owned by the server, and Down and Stop wait
// for them to exit.
func Start(ctx context.Context, opts ...Option) (*Server, error) {
	cfg := lifecycle.Apply(config{listen: defaultListen}, opts)
	host, port, err := loopback.Split(cfg.listen)
	if err != nil {
		return nil, fmt.Errorf("natsserver: start: %w", err)
	}
	var leafHost string
	var leafPort int
	if cfg.leafListen != "" {
		if leafHost, leafPort, err = loopback.Split(cfg.leafListen); err != nil {
			return nil, fmt.Errorf("natsserver: start: leafnode listen: %w", err)
		}
	}
	remotes := make([]*url.URL, 0, len(cfg.leafRemotes))
	for _, r := range cfg.leafRemotes {
		u, err := url.Parse(r)
		if err != nil || u.Host == "" || u.Port() == "" {
			return nil, fmt.Errorf("natsserver: start: leafnode remote %q: want nats-leaf://host:port", r)
		}
		remotes = append(remotes, u)
	}
	var links []*linkproxy.Proxy
	closeLinks := func() {
		for _, l := range links {
			_ = l.Close()
		}
	}
	for _, u := range remotes {
		l, err := linkproxy.Listen("127.0.0.1:0", linkproxy.WithDialTimeout(linkDialTimeout),
			linkproxy.WithLogger(cfg.Log.With("leafnode_remote", u.Host)))
		if err != nil {
			closeLinks()
			return nil, fmt.Errorf("natsserver: start: leafnode remote %s: %w", u.Host, err)
		}
		l.SetTarget(u.Host)
		links = append(links, l)
	}
	dir, err := lifecycle.MakeDir(cfg.storeDir, "tollgate-nats-")
	if err != nil {
		closeLinks()
		return nil, fmt.Errorf("natsserver: start: %w", err)
	}
	s := &Server{cfg: cfg, host: host, port: port, leafHost: leafHost, leafPort: leafPort,
		remotes: remotes, links: links, dir: dir,
		life: lifecycle.Guard{Name: "natsserver", ErrStopped: ErrStopped}}
	ctx, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
	defer cancel()
	t0 := time.Now()
	s.life.Lock()
	defer s.life.Unlock()
	if err := s.run(ctx); err != nil {
		_ = s.dir.Remove()
		closeLinks()
		return nil, fmt.Errorf("natsserver: start: %w", err)
	}
	s.port = s.srv.Addr().(*net.TCPAddr).Port
	s.cfg.Log.Info("nats-server started", "url", s.ClientURL(), "store_dir", s.dir.Path,
		"domain", s.cfg.domain, "leafnode_url", s.LeafnodeURL(), "remotes", len(s.remotes),
		"elapsed", time.Since(t0).Round(time.Microsecond))
	return s, nil
}

// run starts one nats-server on s.port (0: a free port) and sets s.srv.
// nats-server reports a failed listen only through its logger, so a fixed
// port is first bound and released here, which gives a taken port its
// proper error. s.life must be held.
func (s *Server) run(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := probe(s.host, s.port); err != nil {
		return err
	}
	if s.leafHost != "" {
		if err := probe(s.leafHost, s.leafPort); err != nil {
			return err
		}
	}
	opts := s.options()
	ns, err := server.NewServer(opts)
	if err != nil {
		return fmt.Errorf("nats-server: %w", err)
	}
	la := &logAdapter{log: s.cfg.Log}
	ctxb := context.Background()
	ns.SetLoggerV2(la, s.cfg.Log.Enabled(ctxb, slog.LevelDebug), s.cfg.Log.Enabled(ctxb, levelTrace), false)
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
	if s.leafHost != "" && s.leafPort == 0 {
		s.leafPort = opts.LeafNode.Port // nats-server wrote the port it picked
	}
	return nil
}

// probe binds and releases host:port, unless port is 0, so that a taken
// port fails with its proper error (nats-server reports a failed listen
// only through its logger).
func probe(host string, port int) error {
	if port == 0 {
		return nil
	}
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", addr, err)
	}
	if err := l.Close(); err != nil {
		return fmt.Errorf("listen %s: %w", addr, err)
	}
	return nil
}

// options returns nats-server's options for the next run.
// s.life must be held.
func (s *Server) options() *server.Options {
	port := cmp.Or(s.port, server.RANDOM_PORT) // nats-server reads 0 as its default, 4222
	name := serverName
	if s.cfg.domain != "" {
		name += "-" + s.cfg.domain
	}
	o := &server.Options{
		ServerName:      name,
		Host:            s.host,
		Port:            port,
		JetStream:       true,
		JetStreamDomain: s.cfg.domain,
		StoreDir:        s.dir.Path,
		NoLog:           true, // no default logger; ours is set below
		NoSigs:          true, // the process's signals belong to its owner
		// No ASCII-art JetStream banner in the owner's log (make run's).
		DisableJetStreamBanner: true,
	}
	o.LeafNode.ReconnectInterval = leafReconnect
	if s.leafHost != "" {
		o.LeafNode.Host = s.leafHost
		o.LeafNode.Port = s.leafPort
		o.LeafNode.Port = cmp.Or(o.LeafNode.Port, server.RANDOM_PORT)
		// Remotes reconnect only to the URL they were given: advertised,
		// the listener's own address would join their URL pool, and a
		// link made through a link proxy would come back around it
		// once cut.
		o.LeafNode.NoAdvertise = true
	}
	for i, u := range s.remotes {
		via := *u
		via.Host = s.links[i].Addr()
		o.LeafNode.Remotes = append(o.LeafNode.Remotes, &server.RemoteLeafOpts{URLs: []*url.URL{&via}})
	}
	return o
}

// ClientURL returns the URL clients connect to, "nats://127.0.0.1:port". It
// does not change across Down, Up and Restart.
func (s *Server) ClientURL() string { return "nats://" + s.Addr() }

// Addr returns the client address, "127.0.0.1:port". It does not change
// across Down, Up and Restart.
func (s *Server) Addr() string { return net.JoinHostPort(s.host, strconv.Itoa(s.port)) }

// LeafnodeURL returns the URL other servers link to with
// WithLeafnodeRemotes, "nats-leaf://127.0.0.1:port", or "" without
// WithLeafnodeListen. It does not change across Down, Up and Restart.
func (s *Server) LeafnodeURL() string {
	if s.leafHost == "" {
		return ""
	}
	return "nats-leaf://" + net.JoinHostPort(s.leafHost, strconv.Itoa(s.leafPort))
}

// Domain returns the server's JetStream domain ("" for none).
func (s *Server) Domain() string { return s.cfg.domain }

// Leafnodes returns the number of leafnode links the server has now, in
// either direction; 0 while down.
func (s *Server) Leafnodes() int {
	s.life.Lock()
	defer s.life.Unlock()
	if s.srv == nil {
		return 0
	}
	return s.srv.NumLeafNodes()
}

// CutLinks closes the links this server made to its WithLeafnodeRemotes and
// refuses them until HealLinks, as a network partition between regions
// would: the server and its clients carry on, and JetStream keeps
// answering in the server's own domain. The server keeps retrying (every
// 250ms), so links come back within that of HealLinks. The cut outlives
// Down and Up. Links other servers made to this one are theirs to cut.
// Each remote is reached through a loopback link proxy the Server owns
// (compose/linkproxy), which is what is cut: the server itself is not
// touched.
func (s *Server) CutLinks() error {
	return s.life.Do("cut links", func() error { return s.setCut(true) })
}

// HealLinks undoes CutLinks: the links are made again at once.
func (s *Server) HealLinks() error {
	return s.life.Do("heal links", func() error { return s.setCut(false) })
}

// setCut cuts or heals the links. s.life must be held.
func (s *Server) setCut(cut bool) error {
	if s.cut == cut {
		return nil
	}
	s.cut = cut
	fault := linkproxy.Fault{} // pass
	if cut {
		fault.Mode = linkproxy.Cut
	}
	for _, l := range s.links {
		l.Set(linkproxy.AnyClient, fault)
	}
	s.cfg.Log.Info("nats-server links", "url", s.ClientURL(), "cut", cut, "remotes", len(s.remotes))
	return nil
}

// StoreDir returns the JetStream store directory.
func (s *Server) StoreDir() string { return s.dir.Path }

// Down shuts the server down, as a stopped nats-server process would be:
// JetStream flushes its store, every client connection is closed, and Down
// returns once every nats-server goroutine has exited. Clients then retry
// the port (nats.go reconnects by default). Down on a server that is down
// does nothing.
func (s *Server) Down() error {
	return s.life.Do("down", func() error {
		s.down()
		s.cfg.Log.Info("nats-server down", "url", s.ClientURL())
		return nil
	})
}

// down shuts the current server down, if any. s.life must be held.
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
	return s.life.Do("up", func() error {
		if s.srv != nil {
			return nil
		}
		t0 := time.Now()
		if err := s.runRetry(ctx); err != nil {
			return fmt.Errorf("natsserver: up: %w", err)
		}
		s.cfg.Log.Info("nats-server up", "url", s.ClientURL(), "elapsed", time.Since(t0).Round(time.Microsecond))
		return nil
	})
}

// runRetry calls run until it succeeds or the start timeout or ctx ends.
// s.life must be held.
func (s *Server) runRetry(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.StartTimeout)
	defer cancel()
	return service.Poll(ctx, 10*time.Millisecond, func() (bool, error) {
		err := s.run(ctx)
		return err == nil, err
	})
}

// Restart is Down followed by Up: a server bounce that clients ride through
// by reconnecting.
func (s *Server) Restart(ctx context.Context) error {
	return s.life.Do("restart", func() error {
		t0 := time.Now()
		s.down()
		if err := s.runRetry(ctx); err != nil {
			return fmt.Errorf("natsserver: restart: %w", err)
		}
		s.cfg.Log.Info("nats-server restarted", "url", s.ClientURL(), "elapsed", time.Since(t0).Round(time.Microsecond))
		return nil
	})
}

// Stop shuts the server down as Down does and removes the store directory
// if the Server created it. Stop is idempotent and safe from many
// goroutines: every call returns after the first has finished, with its
// result. After Stop the other lifecycle methods return ErrStopped.
func (s *Server) Stop() error {
	return s.life.Stop(func() error {
		s.down()
		for _, l := range s.links {
			_ = l.Close()
		}
		if err := s.dir.Remove(); err != nil {
			return fmt.Errorf("natsserver: stop: %w", err)
		}
		s.cfg.Log.Info("nats-server stopped", "url", s.ClientURL())
		return nil
	})
}
