// Package stack is the local stack behind `make run` (docs/local-stack.md): in one
// process it starts Redis (a redis-server from PATH on a free port, else an
// embedded stand-in), an embedded NATS server, an embedded Kafka-protocol
// broker, the aggregator, a demo API and a gateway in front of it, prints
// the addresses and curl lines to try, and stops everything in order when
// its context ends. The gateway runs in fleet mode: its rules, blocklist
// and overrides come from the NATS KV buckets that the aggregator seeds
// from rules_file and its operator API changes, so the banner's operator
// API lines take effect on it at once, and on any gateway that joins
// through bin/stack.env.
//
//	cfg, err := stack.LoadConfig(nil) // TOLLGATE_* variables
//	st, err := stack.New(cfg, logger, os.Stdout) // banner to stdout
//	err = st.Run(ctx) // until ctx is done
//
// With Config.Regions above 1 (TOLLGATE_STACK_REGIONS) it starts that
// many regions, each the above with its own Redis, NATS (its own
// JetStream domain), broker, aggregator, demo API and gateway, their NATS
// servers linked by leafnode connections through link proxies
// (compose/linkproxy) whose control APIs add latency, cut and heal.
//
// Tests start the same stack on port-0 addresses (Config's listeners all
// accept "127.0.0.1:0") and read the bound ones from Addrs (and Regions)
// once Ready is closed.
package stack

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tollgate/tollgate/aggregator"
	"github.com/tollgate/tollgate/compose/demoapi"
	"github.com/tollgate/tollgate/compose/kafkabroker"
	"github.com/tollgate/tollgate/compose/natsserver"
	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/gateway"
	"github.com/tollgate/tollgate/guard/keyid"
	"github.com/tollgate/tollgate/internal/fleetkv"
	"github.com/tollgate/tollgate/internal/service"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// Errors; match them with errors.Is.
var (
	// ErrAddrInUse means a listener's address is taken; the error is an
	// *AddrInUseError naming the variable that moves it. It is
	// service.ErrAddrInUse, which bin/gateway's errors match too.
	ErrAddrInUse = service.ErrAddrInUse
	// ErrRunning is returned by a second call of Run.
	ErrRunning = errors.New("stack: Run called more than once")

	// errStopping: ctx ended while the stack was starting.
	errStopping = errors.New("stack: stopping")
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
	// pollEvery is how often the waits at start look again.
	pollEvery = 20 * time.Millisecond
	// embeddedRedisTimeout is the gateway's and aggregator's Redis
	// deadline on the embedded Redis, which runs Lua far slower than
	// redis-server (the default, 50ms, stays for redis-server), unless
	// redis.timeout is set.
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
	Kafka   string // embedded Kafka-protocol broker
	NATS    string // embedded NATS server, nats://host:port

	Aggregator        string // operator API and reports
	AggregatorMetrics string // aggregator metrics and health
}

// Stack is the local stack. Create it with New, then call Run once.
type Stack struct {
	cfg        Config
	log        *slog.Logger
	out        io.Writer
	genSecret  bool   // KeySecret was generated
	genToken   bool   // AdminToken was generated
	genViewer  bool   // ViewerToken was generated
	console    string // the console's one-time sign-in link; written before ready is closed
	ready      chan struct{}
	addrs      Addrs      // written before ready is closed
	redisKind  string     // written before ready is closed
	redisDL    string     // the gateway's and aggregator's Redis deadline; written before ready is closed
	running    sync.Mutex // guards runStarted
	runStarted bool
	regions    []*region // written before ready is closed
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
	if s.cfg.ViewerToken == "" {
		s.cfg.ViewerToken, s.genViewer = rand.Text(), true
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
		return &AddrInUseError{Addr: l.addr, Var: configs.EnvName(l.path), Err: err}
	}
	return fmt.Errorf("stack: cannot listen on %s (%s): %w", l.addr, configs.EnvName(l.path), err)
}

// AddrInUseError is the error of a listener whose address is taken, as
// bin/gateway reports it too. It matches ErrAddrInUse.
type AddrInUseError = service.AddrInUseError

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

// Run starts Redis, NATS, the Kafka-protocol broker, the demo API, the
// aggregator and, once the aggregator is ready and has seeded the NATS
// buckets, the gateway, in that order (with several regions, region by
// region, each region's link proxy beside it, and waits until the
// regions' NATS servers are linked); prints the banner once the gateway
// follows the rules in NATS, and serves until ctx is done or a part fails;
// then it stops them in the reverse order: the gateway drains its
// in-flight requests (which still reach the demo API), then the
// aggregator, the demo API, the broker, NATS and Redis, whose process is
// gone when Run returns. It returns nil after a shutdown asked for by ctx,
// else the error that stopped it or prevented the start. Run may be called
// once. It starts the gateway's and the aggregator's Run, the demo API's
// Serve and redisserver's process waiter on goroutines; all have exited
// when it returns.
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

	dataDir, removeData, err := s.dataDir()
	if err != nil {
		return err
	}
	stops = append(stops, removeData)

	regions, err := s.plan(dataDir)
	if err != nil {
		return err
	}
	var parts []part // what Run watches once ready
	for i, r := range regions {
		if i > 0 {
			// The region's link to the hub, before its NATS server dials it.
			if err := s.startLink(ctx, r, regions[0].link.Addr(), &stops); err != nil {
				return err
			}
		}
		ps, err := s.startRegion(ctx, r, &stops)
		if errors.Is(err, errStopping) {
			return nil // asked to stop while starting
		}
		if err != nil {
			return err
		}
		parts = append(parts, ps...)
		if i == 0 && len(regions) > 1 {
			if err := s.startLink(ctx, r, r.leafAddr, &stops); err != nil {
				return err
			}
		}
	}
	first := regions[0]
	s.regions = regions
	s.addrs, s.redisKind, s.redisDL, s.console = first.addrs, first.redisKind, first.redisDL, first.console
	if len(regions) > 1 {
		if err := s.waitLinked(ctx, regions); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			s.log.Warn("the regions' NATS servers are not linked yet; they link once their leafnode connections are up",
				slog.String("error", err.Error()))
		}
	}

	stops = append(stops, s.removeEnvFile) // what was written, should the write fail midway
	if err := s.writeEnvFile(); err != nil {
		return err
	}
	s.printBanner()
	close(s.ready)
	s.log.Info("stack ready; Ctrl-C stops it")

	if p := s.watch(ctx, parts); p != nil {
		return p.t.report(p.name)
	}
	s.log.Info("stack shutting down: gateway, aggregator, demo API, kafka, nats, then redis")
	return nil
}

// startRegion starts one region's Redis, NATS, Kafka-protocol broker,
// demo API, aggregator and, once the aggregator is ready and has seeded
// the NATS buckets, gateway, in that order, appending their stops to
// stops; it returns the parts Run watches. errStopping means ctx ended
// while starting.
func (s *Stack) startRegion(ctx context.Context, r *region, stops *[]func() error) ([]part, error) {
	log := r.log
	redisLog := log.With(slog.String(partKey, "redis"))
	rds, err := startRedis(ctx, s.cfg.Redis, redisLog)
	if err != nil {
		if ctx.Err() != nil {
			return nil, errStopping
		}
		return nil, err
	}
	*stops = append(*stops, func() error { return rds.stop(redisLog) })

	natsLog := log.With(slog.String(partKey, "nats"))
	nopts := append([]natsserver.Option{natsserver.WithListen(natsHostPort(r.cfg.NATSListen)),
		natsserver.WithStoreDir(filepath.Join(r.dataDir, "nats")), natsserver.WithLogger(natsLog)}, r.natsOptions()...)
	ns, err := natsserver.Start(ctx, nopts...)
	if err != nil {
		if ctx.Err() != nil {
			return nil, errStopping
		}
		return nil, r.portOr(fmt.Errorf("stack: start nats: %w", err))
	}
	*stops = append(*stops, ns.Stop) // it logs its start and stop itself
	r.nats = ns
	r.leafAddr = strings.TrimPrefix(ns.LeafnodeURL(), "nats-leaf://")

	kafkaLog := log.With(slog.String(partKey, "kafka"))
	kb, err := kafkabroker.Start(ctx, kafkabroker.WithListen(r.cfg.KafkaListen),
		kafkabroker.WithDataDir(filepath.Join(r.dataDir, "kafka")), kafkabroker.WithLogger(kafkaLog))
	if err != nil {
		if ctx.Err() != nil {
			return nil, errStopping
		}
		return nil, r.portOr(fmt.Errorf("stack: start the kafka broker: %w", err))
	}
	*stops = append(*stops, kb.Stop) // it logs its start and stop itself

	demo, err := s.startDemo(r)
	if err != nil {
		return nil, err
	}
	*stops = append(*stops, demo.stop)

	agg, err := aggregator.New(s.aggregatorConfig(r, rds, kb.Addrs(), ns.ClientURL()), log.With(slog.String(partKey, "aggregator")))
	if err != nil {
		return nil, r.portOr(fmt.Errorf("stack: start the aggregator: %w", err))
	}
	aggRun, aggStop := startPart(ctx, "aggregator", agg.Run)
	*stops = append(*stops, aggStop)

	// The gateway starts once the aggregator has created the topics it
	// produces to and the buckets it watches, and seeded the rules: else
	// its first moments are warnings that Kafka does not know the topic
	// and that the control plane is unavailable, and its rules come from
	// the file until its next retry.
	aggReady := "http://" + dialable(agg.Addrs().Metrics) + "/readyz"
	if err := s.waitReady(ctx, "aggregator", aggReady, aggRun, nil); err != nil {
		if ctx.Err() != nil {
			return nil, errStopping
		}
		return nil, err
	}
	if err := s.waitControlPlane(ctx, ns.ClientURL(), aggRun); err != nil {
		if ctx.Err() != nil {
			return nil, errStopping
		}
		if aggRun.reported {
			return nil, err // the aggregator stopped
		}
		log.Warn("the aggregator has not seeded the NATS buckets; the gateway starts from the rules file and follows them once they exist",
			slog.String("error", err.Error()))
	}

	gw, err := gateway.New(s.gatewayConfig(r, rds, demo.addr, ns.ClientURL(), kb.Addrs()), log.With(slog.String(partKey, "gateway")))
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			// Taken since New checked: name the variable again.
			if perr := r.cfg.checkPorts(); perr != nil {
				return nil, perr
			}
		}
		return nil, fmt.Errorf("stack: start the gateway: %w", err)
	}
	gwRun, gwStop := startPart(ctx, "gateway", gw.Run)
	*stops = append(*stops, gwStop)

	ga, aa := gw.Addrs(), agg.Addrs()
	r.addrs = Addrs{Proxy: ga.Proxy, API: ga.API, Metrics: ga.Metrics, GRPC: ga.GRPC, Demo: demo.addr, Redis: rds.addr,
		Kafka: kb.Addr(), NATS: ns.ClientURL(), Aggregator: aa.API, AggregatorMetrics: aa.Metrics}
	r.redisKind = rds.kind
	r.redisDL = rds.config(s.cfg.RedisClient).Timeout.String()
	r.console = "http://" + dialable(aa.API) + "/console/#code=" + agg.ConsoleCode()

	if err := s.waitReady(ctx, "gateway", "http://"+dialable(r.addrs.Metrics)+"/readyz", gwRun, nil); err != nil {
		if ctx.Err() != nil {
			return nil, errStopping
		}
		return nil, err
	}
	// The banner's operator API lines act on the rules in NATS: wait until
	// the gateway follows them (the aggregator seeds the bucket from
	// rules_file), so they take effect as soon as they are pasted.
	if err := s.waitReady(ctx, "gateway", "http://"+dialable(r.addrs.Metrics)+"/readyz", gwRun, rulesFromNATS); err != nil {
		if ctx.Err() != nil {
			return nil, errStopping
		}
		log.Warn("the gateway does not follow the rules in NATS yet; the operator API's changes reach it once it does",
			slog.String("error", err.Error()))
	}
	return []part{{r.partName("gateway"), gwRun}, {r.partName("aggregator"), aggRun}, {r.partName("demo API"), demo.run}}, nil
}

// part is a part's name and task, which Run watches once ready.
type part struct {
	name string
	t    *task
}

// watch waits until ctx is done (nil) or a part stops on its own (that
// part).
func (s *Stack) watch(ctx context.Context, parts []part) *part {
	cases := []reflect.SelectCase{{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())}}
	for _, p := range parts {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(p.t.Done())})
	}
	i, _, _ := reflect.Select(cases)
	if i == 0 {
		return nil
	}
	return &parts[i-1]
}

// startPart runs a part (the aggregator, the gateway) on a context that is
// not ctx's child, and returns its task and its stop, which ends it: the
// stops end the parts one by one, in order, rather than ctx all at once.
func startPart(ctx context.Context, name string, run func(context.Context) error) (*task, func() error) {
	pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	t := start(func() error { return run(pctx) })
	return t, func() error {
		cancel()
		if err := t.wait(); err != nil && !t.reported {
			return fmt.Errorf("stack: %s: %w", name, err)
		}
		return nil
	}
}

// task is one part's goroutine, which Run and the stops wait for.
type task struct {
	*service.Task
	reported bool // Run returned its error already; owned by Run's goroutine
}

// start runs f on a new goroutine.
func start(f func() error) *task { return &task{Task: service.Go(f)} }

// wait waits for the goroutine and returns its error.
func (t *task) wait() error { return t.Wait() }

// report is Run's error for a part that stopped on its own.
func (t *task) report(part string) error {
	t.reported = true
	if err := t.Wait(); err != nil {
		return fmt.Errorf("stack: %s: %w", part, err)
	}
	return fmt.Errorf("stack: %s stopped unexpectedly", part)
}

// gatewayConfig is the configuration of the stack's gateway: the stack's
// addresses, rules and secret, the stack's Redis and the demo API, in
// fleet mode on the stack's NATS (its rules, blocklist and overrides come
// from the operator API; rules_file until the aggregator has seeded the
// rules bucket), streaming its decisions to the stack's broker, with its
// files under the stack's data dir.
func (s *Stack) gatewayConfig(r *region, rds *redisBackend, demoAddr, natsURL string, brokers []string) gateway.Config {
	c := gateway.Config{
		Listen:          r.cfg.Listen,
		Upstream:        "http://" + demoAddr,
		APIListen:       r.cfg.APIListen,
		MetricsListen:   r.cfg.MetricsListen,
		GRPCListen:      r.cfg.GRPCListen,
		RulesFile:       r.rulesFile,
		KeySecret:       s.cfg.KeySecret,
		GatewayID:       r.id(),
		Region:          r.name,
		DataDir:         r.dataDir,
		ShutdownTimeout: shutdownTimeout,
		Offenders:       s.cfg.Offenders,
		Log:             s.cfg.Log,
	}
	c.NATS.URL = natsURL
	c.Kafka.Brokers = brokers
	c.Redis = rds.config(s.cfg.RedisClient)
	return c
}

// demoServer is the running demo API.
type demoServer struct {
	addr string
	srv  *http.Server
	run  *task // Serve
	log  *slog.Logger
}

func (s *Stack) startDemo(r *region) (*demoServer, error) {
	l := listener{"demo_listen", r.cfg.DemoListen}
	ln, err := net.Listen("tcp", l.addr)
	if err != nil {
		return nil, addrInUse(l, err)
	}
	log := r.log.With(slog.String(partKey, "demoapi"))
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

// rulesFromNATS reports whether a gateway's /readyz body says its rules
// come from NATS.
func rulesFromNATS(body []byte) bool {
	var r struct {
		Rules struct {
			Source string `json:"source"`
		} `json:"rules"`
	}
	return json.Unmarshal(body, &r) == nil && r.Rules.Source == "nats"
}

// waitControlPlane waits until the three KV buckets exist in NATS and the
// rules bucket holds a ruleset: the aggregator creates them and seeds the
// rules from rules_file once it reaches NATS.
func (s *Stack) waitControlPlane(ctx context.Context, natsURL string, agg *task) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	nc, err := fleetkv.Connect(natsURL, fleetkv.Options{Name: "tollgate-stack"})
	if err != nil {
		return fmt.Errorf("stack: %w", err)
	}
	defer nc.Close()
	seeded := func() error {
		octx, ocancel := context.WithTimeout(ctx, time.Second)
		defer ocancel()
		kv, err := fleetkv.Bind(octx, nc)
		if err != nil {
			return err
		}
		_, rev, err := kv.ActiveRules(octx)
		if err != nil && !errors.Is(err, fleetkv.ErrCorrupt) {
			return err
		}
		if rev == 0 {
			return fmt.Errorf("bucket %s holds no ruleset yet", tollgatev1.BucketRules)
		}
		return nil
	}
	err = service.Poll(ctx, pollEvery, func() (bool, error) {
		if agg.Exited() {
			return true, agg.report("aggregator")
		}
		err := seeded()
		return err == nil, err
	})
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("stack: control plane not seeded within %v: %w", readyTimeout, err)
	}
	return err
}

// waitReady polls a part's /readyz until it answers 200 (and, when accept
// is not nil, with a body accept accepts), so that the banner comes once
// the curl lines work.
func (s *Stack) waitReady(ctx context.Context, name, url string, part *task, accept func([]byte) bool) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	client := &http.Client{Timeout: time.Second}
	defer client.CloseIdleConnections()
	err := service.Poll(ctx, pollEvery, func() (bool, error) {
		if part.Exited() {
			return true, part.report(name)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return true, fmt.Errorf("stack: readyz: %w", err)
		}
		resp, err := client.Do(req)
		if err != nil {
			return false, err
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK && (accept == nil || accept(body)), nil
	})
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("stack: %s not ready within %v: %w", name, readyTimeout, err)
	}
	return err
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

// aggregatorConfig is the configuration of the stack's aggregator, on
// the stack's Redis (its operator API resets keys, grants quota and reads
// key state there).
func (s *Stack) aggregatorConfig(r *region, rds *redisBackend, brokers []string, natsURL string) aggregator.Config {
	c := aggregator.Config{
		Listen:          r.cfg.AggregatorListen,
		MetricsListen:   r.cfg.AggregatorMetricsListen,
		ID:              r.id(),
		Region:          r.name,
		DataDir:         filepath.Join(r.dataDir, "aggregator"),
		AdminToken:      s.cfg.AdminToken,
		ViewerToken:     s.cfg.ViewerToken,
		KeySecret:       s.cfg.KeySecret,
		RulesFile:       r.rulesFile,
		SessionTimeout:  6 * time.Second,
		ShutdownTimeout: shutdownTimeout,
		Penalty:         s.cfg.Penalty,
		Log:             s.cfg.Log,
	}
	c.Kafka.Brokers = brokers
	c.NATS.URL = natsURL
	c.Redis = rds.config(s.cfg.RedisClient)
	return c
}

// dataDir returns the stack's state directory (data_dir, or a new
// temporary one) and how to remove it on exit (only a temporary one).
func (s *Stack) dataDir() (string, func() error, error) {
	if s.cfg.DataDir != "" {
		if err := os.MkdirAll(s.cfg.DataDir, 0o750); err != nil {
			return "", nil, fmt.Errorf("stack: %s: %w", configs.EnvName("data_dir"), err)
		}
		return s.cfg.DataDir, func() error { return nil }, nil
	}
	dir, err := os.MkdirTemp("", "tollgate-stack-")
	if err != nil {
		return "", nil, fmt.Errorf("stack: data dir: %w", err)
	}
	s.log.Info("state in a temporary directory, removed on exit (set "+configs.EnvName("data_dir")+" to keep it)", slog.String("dir", dir))
	return dir, func() error { return os.RemoveAll(dir) }, nil
}

// portOr names the variable of a taken port when err is one, else
// returns err.
func (r *region) portOr(err error) error {
	if errors.Is(err, syscall.EADDRINUSE) {
		if perr := r.cfg.checkPorts(); perr != nil {
			return perr
		}
	}
	return err
}

// envLines are bin/stack.env's lines: the join variables of the first
// region and, with several regions, every region's addresses.
func (s *Stack) envLines() []string {
	return append(s.joinLines(s.regions[0]), s.regionLines()...)
}

// envFiles are the files writeEnvFile writes, with their bodies: the
// join file and, with several regions, one per region beside it
// (RegionEnvFile).
func (s *Stack) envFiles() map[string]string {
	body := func(file string, lines []string) string {
		return "# Written by make run while the stack runs (removed on exit). Join the stack with:\n" +
			"#   set -a; . " + file + "; set +a\n" + strings.Join(lines, "\n") + "\n"
	}
	files := map[string]string{s.cfg.EnvFile: body(s.cfg.EnvFile, s.envLines())}
	if len(s.regions) > 1 {
		for _, r := range s.regions {
			f := RegionEnvFile(s.cfg.EnvFile, r.name)
			files[f] = strings.Replace(body(f, append(s.joinLines(r), s.regionLines()...)), "Join the stack", "Join region "+r.name, 1)
		}
	}
	return files
}

// writeEnvFile writes stack_env_file (0600: it holds the secrets), the
// regions' join files beside it when there are several, and the pid file
// (PIDFile).
func (s *Stack) writeEnvFile() error {
	if s.cfg.EnvFile == "" || s.cfg.EnvFile == "off" {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(s.cfg.EnvFile), 0o755); err != nil {
		return fmt.Errorf("stack: %s: %w", configs.EnvName("stack_env_file"), err)
	}
	for f, body := range s.envFiles() {
		if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
			return fmt.Errorf("stack: %s: %w", configs.EnvName("stack_env_file"), err)
		}
	}
	if err := os.WriteFile(PIDFile(s.cfg.EnvFile), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return fmt.Errorf("stack: pid file beside %s: %w", configs.EnvName("stack_env_file"), err)
	}
	return nil
}

func (s *Stack) removeEnvFile() error {
	if s.cfg.EnvFile == "" || s.cfg.EnvFile == "off" {
		return nil
	}
	var errs []error
	files := []string{s.cfg.EnvFile, PIDFile(s.cfg.EnvFile)}
	for _, r := range s.regions {
		if r.name != "" {
			files = append(files, RegionEnvFile(s.cfg.EnvFile, r.name))
		}
	}
	for _, f := range files {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("stack: %w", err))
		}
	}
	return errors.Join(errs...)
}
