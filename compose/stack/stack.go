// Package stack is the local stack behind `make run` (SPEC §9): in one
// process it starts Redis (a redis-server from PATH on a free port, else an
// embedded stand-in), a demo API and a gateway in front of it, prints the
// addresses and a few curl lines to try, and stops everything in order when
// its context ends. Later versions add NATS, Kafka and the aggregator.
//
//	cfg, err := stack.LoadConfig(nil) // TOLLGATE_* variables
//	st, err := stack.New(cfg, logger)
//	err = st.Run(ctx) // until ctx is done
//
// Tests start the same stack on port-0 addresses (Config's listeners all
// accept "127.0.0.1:0") and read the bound ones from Addrs once Ready is
// closed.
package stack

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/tollgate/tollgate/compose/demoapi"
	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/gateway"
	"github.com/tollgate/tollgate/guard/keyid"
	"github.com/tollgate/tollgate/guard/redisstore"
)

// Errors; match them with errors.Is.
var (
	// ErrAddrInUse means a listener's address is taken; the error is an
	// *AddrInUseError naming the variable that moves it.
	ErrAddrInUse = errors.New("stack: address in use")
	// ErrRunning is returned by a second call of Run.
	ErrRunning = errors.New("stack: Run called more than once")
)

const (
	// minSecret is the shortest key secret the gateway accepts.
	minSecret = keyid.MinSecretLen
	// partKey is the log attribute naming the stack's part a line comes
	// from (redis, demoapi, gateway). The gateway names its own components
	// under "component" (guard, proxy, rulefile...), so the two never
	// repeat one key on a line.
	partKey = "part"
	// envRedis is the variable of Config.Redis.
	envRedis = configs.Prefix + "STACK_REDIS"
	// gatewayID names the stack's gateway in metrics and logs.
	gatewayID = "local"
	// shutdownTimeout bounds the gateway's drain and the demo API's.
	shutdownTimeout = 5 * time.Second
	// readyTimeout bounds the wait for the gateway's /readyz at start.
	readyTimeout = 10 * time.Second
	// embeddedRedisTimeout is the gateway's Redis deadline on the embedded
	// Redis, which runs Lua far slower than redis-server (the default,
	// 50ms, stays for redis-server).
	embeddedRedisTimeout = 500 * time.Millisecond
)

// Addrs are the addresses the stack listens on, with the ports bound.
type Addrs struct {
	Proxy   string // gateway proxy
	API     string // gateway check API
	Metrics string // gateway metrics and health
	GRPC    string // gateway Envoy RLS
	Demo    string // demo API (the proxy's upstream)
	Redis   string // Redis, either backend
}

// Stack is the local stack. Create it with New, then call Run once.
type Stack struct {
	cfg        Config
	log        *slog.Logger
	out        io.Writer
	genSecret  bool // KeySecret was generated
	genToken   bool // AdminToken was generated
	ready      chan struct{}
	addrs      Addrs      // written before ready is closed
	redisKind  string     // written before ready is closed
	running    sync.Mutex // guards runStarted
	runStarted bool
}

// New checks cfg (SetDefaults is applied, then Validate), generates the
// key secret and admin token when they are empty (crypto/rand), and checks
// that every listener's address is free, so a busy port fails here, before
// anything starts, with ErrAddrInUse naming the variable to change. It
// starts nothing. out receives the banner Run prints once everything is
// ready (nil: discard); log may be nil (discard).
func New(cfg Config, log *slog.Logger, out io.Writer) (*Stack, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("stack: invalid configuration:\n%w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if out == nil {
		out = io.Discard
	}
	s := &Stack{cfg: cfg, log: log, out: out, ready: make(chan struct{})}
	if s.cfg.KeySecret == "" {
		s.cfg.KeySecret, s.genSecret = rand.Text(), true
	}
	if s.cfg.AdminToken == "" {
		s.cfg.AdminToken, s.genToken = rand.Text(), true
	}
	if _, err := os.Stat(cfg.RulesFile); err != nil {
		return nil, fmt.Errorf("stack: rules file: %w (run from the repository root, as make run does, or set %s)",
			err, configs.EnvName("rules_file"))
	}
	if err := cfg.checkPorts(); err != nil {
		return nil, err
	}
	return s, nil
}

// checkPorts binds and releases every listener's address with a fixed
// port, and reports the busy ones.
func (c *Config) checkPorts() error {
	var errs []error
	for _, l := range c.listeners() {
		if err := probe(l.addr); err != nil {
			errs = append(errs, addrInUse(l, err))
		}
	}
	return errors.Join(errs...)
}

func probe(addr string) error {
	if _, port, _ := net.SplitHostPort(addr); port == "0" {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	return ln.Close()
}

func addrInUse(l listener, err error) error {
	if errors.Is(err, syscall.EADDRINUSE) {
		return &AddrInUseError{Addr: l.addr, Var: configs.EnvName(l.path)}
	}
	return fmt.Errorf("stack: cannot listen on %s (%s): %w", l.addr, configs.EnvName(l.path), err)
}

// AddrInUseError is the error of a listener whose address is taken. It
// matches ErrAddrInUse.
type AddrInUseError struct {
	Addr string // the address, host:port
	Var  string // the variable that moves it, e.g. TOLLGATE_LISTEN
}

func (e *AddrInUseError) Error() string {
	return fmt.Sprintf("stack: %s is already in use (%s): stop what listens there, or set %s to another address (port 0 picks a free one)",
		e.Addr, e.Var, e.Var)
}

// Is reports whether target is ErrAddrInUse.
func (e *AddrInUseError) Is(target error) bool { return target == ErrAddrInUse }

// Ready is closed once every part is serving and the banner is printed;
// Addrs and RedisBackend are valid from then on. It is never closed when
// Run fails to start.
func (s *Stack) Ready() <-chan struct{} { return s.ready }

// Addrs returns the bound addresses once Ready is closed, and the zero
// Addrs before.
func (s *Stack) Addrs() Addrs {
	select {
	case <-s.ready:
		return s.addrs
	default:
		return Addrs{}
	}
}

// RedisBackend returns BackendRedisServer or BackendEmbedded once Ready
// is closed, and "" before.
func (s *Stack) RedisBackend() string {
	select {
	case <-s.ready:
		return s.redisKind
	default:
		return ""
	}
}

// Run starts Redis, the demo API and the gateway, in that order, prints
// the banner, and serves until ctx is done or a part fails; then it stops
// them in the reverse order: the gateway drains its in-flight requests
// (which still reach the demo API), then the demo API, then Redis, whose
// process is gone when Run returns. It returns nil after a shutdown asked
// for by ctx, else the error that stopped it or prevented the start. Run
// may be called once. It starts the gateway's Run, the demo API's Serve and
// redisserver's process waiter on goroutines; all have exited when it
// returns.
func (s *Stack) Run(ctx context.Context) (err error) {
	s.running.Lock()
	if s.runStarted {
		s.running.Unlock()
		return ErrRunning
	}
	s.runStarted = true
	s.running.Unlock()

	// stops run in reverse order of the starts, whatever happens.
	var stops []func() error
	defer func() {
		for i := len(stops) - 1; i >= 0; i-- {
			err = errors.Join(err, stops[i]())
		}
		if err == nil {
			s.log.Info("stack stopped")
		}
	}()

	redisLog := s.log.With(slog.String(partKey, "redis"))
	rds, err := startRedis(ctx, s.cfg.Redis, redisLog)
	if err != nil {
		if ctx.Err() != nil {
			return nil // asked to stop while starting
		}
		return err
	}
	stops = append(stops, func() error { return rds.stop(redisLog) })

	demo, err := s.startDemo()
	if err != nil {
		return err
	}
	stops = append(stops, demo.stop)

	gw, err := gateway.New(s.gatewayConfig(rds, demo.addr), s.log.With(slog.String(partKey, "gateway")))
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			// Taken since New checked: name the variable again.
			if perr := s.cfg.checkPorts(); perr != nil {
				return perr
			}
		}
		return fmt.Errorf("stack: start the gateway: %w", err)
	}
	// The gateway's context is not ctx's child: the stops below end it,
	// first of all, rather than ctx all at once.
	gwCtx, gwCancel := context.WithCancel(context.WithoutCancel(ctx))
	gwRun := start(func() error { return gw.Run(gwCtx) })
	stops = append(stops, func() error {
		gwCancel()
		if err := gwRun.wait(); err != nil && !gwRun.reported {
			return fmt.Errorf("stack: gateway: %w", err)
		}
		return nil
	})

	ga := gw.Addrs()
	s.addrs = Addrs{Proxy: ga.Proxy, API: ga.API, Metrics: ga.Metrics, GRPC: ga.GRPC, Demo: demo.addr, Redis: rds.addr}
	s.redisKind = rds.kind

	if err := s.waitReady(ctx, gwRun); err != nil {
		if ctx.Err() != nil {
			return nil // asked to stop while starting
		}
		return err
	}
	s.printBanner()
	close(s.ready)
	s.log.Info("stack ready; Ctrl-C stops it")

	select {
	case <-ctx.Done():
		s.log.Info("stack shutting down: gateway, then demo API, then redis")
		return nil
	case <-gwRun.done:
		return gwRun.report("gateway")
	case <-demo.run.done:
		return demo.run.report("demo API")
	}
}

// task is one goroutine's result, which many may wait for.
type task struct {
	done     chan struct{}
	err      error
	reported bool // Run returned err already; owned by Run's goroutine
}

// start runs f on a new goroutine.
func start(f func() error) *task {
	t := &task{done: make(chan struct{})}
	go func() {
		t.err = f()
		close(t.done)
	}()
	return t
}

// wait waits for the goroutine and returns its error.
func (t *task) wait() error {
	<-t.done
	return t.err
}

// report is Run's error for a part that stopped on its own.
func (t *task) report(part string) error {
	t.reported = true
	if t.err == nil {
		return fmt.Errorf("stack: %s stopped unexpectedly", part)
	}
	return fmt.Errorf("stack: %s: %w", part, t.err)
}

// gatewayConfig is the configuration of the stack's gateway: the stack's
// addresses, rules and secret, the stack's Redis and the demo API.
func (s *Stack) gatewayConfig(rds *redisBackend, demoAddr string) gateway.Config {
	c := gateway.Config{
		Listen:          s.cfg.Listen,
		Upstream:        "http://" + demoAddr,
		APIListen:       s.cfg.APIListen,
		MetricsListen:   s.cfg.MetricsListen,
		GRPCListen:      s.cfg.GRPCListen,
		RulesFile:       s.cfg.RulesFile,
		KeySecret:       s.cfg.KeySecret,
		Redis:           redisstore.Config{Mode: redisstore.ModeStandalone, Addrs: []string{rds.addr}},
		GatewayID:       gatewayID,
		ShutdownTimeout: shutdownTimeout,
		Log:             s.cfg.Log,
	}
	if rds.kind == BackendEmbedded {
		c.Redis.Timeout = embeddedRedisTimeout
	}
	return c
}

// demoServer is the running demo API.
type demoServer struct {
	addr string
	srv  *http.Server
	run  *task // Serve
	log  *slog.Logger
}

func (s *Stack) startDemo() (*demoServer, error) {
	l := listener{"demo_listen", s.cfg.DemoListen}
	ln, err := net.Listen("tcp", l.addr)
	if err != nil {
		return nil, addrInUse(l, err)
	}
	log := s.log.With(slog.String(partKey, "demoapi"))
	d := &demoServer{
		addr: ln.Addr().String(),
		srv: &http.Server{
			Handler:           demoapi.Handler(),
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       30 * time.Second,
			WriteTimeout:      demoapi.MaxSlow + 5*time.Second,
			IdleTimeout:       2 * time.Minute,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		},
		log: log,
	}
	d.run = start(func() error {
		if err := d.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	log.Info("demo API started", slog.String("addr", d.addr))
	return d, nil
}

// stop shuts the demo API down, waiting up to shutdownTimeout for requests
// in flight, and waits for its Serve goroutine.
func (d *demoServer) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := d.srv.Shutdown(ctx); err != nil {
		d.log.Warn("demo API: in-flight requests cut at shutdown timeout")
		_ = d.srv.Close()
	}
	if err := d.run.wait(); err != nil && !d.run.reported {
		return fmt.Errorf("stack: demo API: %w", err)
	}
	d.log.Info("demo API stopped", slog.String("addr", d.addr))
	return nil
}

// waitReady polls the gateway's /readyz until it answers 200, so that the
// banner comes once the curl lines work.
func (s *Stack) waitReady(ctx context.Context, gw *task) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	client := &http.Client{Timeout: time.Second}
	defer client.CloseIdleConnections()
	url := "http://" + dialable(s.addrs.Metrics) + "/readyz"
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return fmt.Errorf("stack: readyz: %w", err)
		}
		if resp, err := client.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-gw.done:
			return gw.report("gateway")
		case <-ctx.Done():
			return fmt.Errorf("stack: gateway not ready within %v: %w", readyTimeout, ctx.Err())
		case <-tick.C:
		}
	}
}

// dialable turns a listen address into one a client can dial: an
// unspecified host (0.0.0.0, ::, empty) becomes the loopback address.
func dialable(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		if ip != nil && ip.To4() == nil {
			host = "::1"
		} else {
			host = "127.0.0.1"
		}
	}
	return net.JoinHostPort(host, port)
}
