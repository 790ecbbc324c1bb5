// Package gateway is Tollgate's data-plane process as a library: a reverse
// proxy with the guard in front, the check API for gateways written in
// other languages, Envoy's rate-limit service, and the metrics and health
// endpoints. bin/gateway (gateway/cmd/gateway) only loads a
// Config and calls New and Run; tests and `make run` start servers in
// process the same way.
//
//	cfg, err := gateway.LoadConfig("", nil) // TOLLGATE_* variables
//	srv, err := gateway.New(cfg, logger)
//	err = srv.Run(ctx) // returns after a graceful drain once ctx is done
//
// Counters live in Redis (redis.*); while Redis is unavailable rules fail
// open, except `on_failure: closed` ones, which a local in-memory limiter
// decides with failure_share of their limits. The gateway starts without
// Redis. In static mode rules come from rules_file, which is watched and
// hot-reloaded. In fleet mode (nats.url set) rules, blocklist, penalties
// and overrides come from the NATS KV buckets the aggregator's operator API
// writes (package rulesync), with a last-known-good copy on disk; the
// gateway starts and serves without NATS.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/gateway/internal/checkapi"
	"github.com/tollgate/tollgate/gateway/internal/events"
	"github.com/tollgate/tollgate/gateway/internal/metrics"
	"github.com/tollgate/tollgate/gateway/internal/proxy"
	"github.com/tollgate/tollgate/gateway/internal/rulefile"
	"github.com/tollgate/tollgate/gateway/internal/rulesync"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/lease"
	"github.com/tollgate/tollgate/guard/memstore"
	"github.com/tollgate/tollgate/guard/redisstore"
	"github.com/tollgate/tollgate/internal/fleetkv"
	"github.com/tollgate/tollgate/internal/promdef"
	"github.com/tollgate/tollgate/internal/service"
)

// Errors.
var (
	// ErrRunning is returned by a second call of Run.
	ErrRunning = service.ErrRunning
	// ErrClosed is returned by Run after Close.
	ErrClosed = service.ErrClosed
)

// Sizes of the after-the-fact cost queue (cost_response_header).
const (
	costQueue   = 4096
	costWorkers = 4
)

// Addrs are the addresses a Server listens on; "" for a listener that is
// not started.
type Addrs struct {
	Proxy   string
	API     string
	Metrics string
	GRPC    string
}

// Server is a gateway. Create it with New, then call Run once. It is safe
// for concurrent use.
type Server struct {
	cfg   Config
	log   *slog.Logger
	reg   *prometheus.Registry
	m     *metrics.Metrics
	guard *guard.Guard

	client redis.UniversalClient
	store  *redisstore.Store
	lease  *lease.Store // nil when fast_path.disabled

	rules     rulesSource
	sync      *rulesync.Syncer   // fleet mode; nil in static mode
	announcer *fleetkv.Announcer // fleet mode: the presence entry; nil in static mode
	events    *events.Producer   // nil without kafka.brokers
	reporter  *proxy.Reporter
	upstream  *http.Transport
	offenders *offenders

	servers   []*httpServer // proxy, check API (draining first), metrics last
	grpc      *grpcServer   // nil without the Envoy RLS listener
	addrs     Addrs
	ruleState atomic.Pointer[activeRules]
	draining  atomic.Bool

	// What /readyz reports of Redis and NATS, kept by their monitors.
	started     time.Time
	redisHealth atomic.Pointer[depState]
	natsHealth  atomic.Pointer[natsState]

	life service.Lifecycle
}

// rulesSource keeps the gateway's rules current until ctx is done,
// handing every new ruleset to the callback it was built with: the rules
// file watcher (static mode) or the NATS KV watcher (fleet mode). Run
// returns nil when ctx ends.
type rulesSource interface {
	Run(ctx context.Context) error
}

var _ rulesSource = (*rulefile.Watcher)(nil)

// Where the rules in force came from (readyz's rules.source).
const (
	sourceFile = "file" // rules_file
	sourceNATS = "nats" // the tollgate_rules KV bucket
	sourceLKG  = "lkg"  // the last-known-good copy on disk
)

// activeRules is the ruleset in force and where it came from.
type activeRules struct {
	*rulefile.Ruleset
	source string
}

// sweepInterval is how often expired controls (blocklist, penalties,
// overrides) are dropped from memory; decisions ignore them at once.
const sweepInterval = 5 * time.Second

// httpServer is one HTTP listener: a net/http server, or the check API's
// fasthttp server (fast).
type httpServer struct {
	name string
	srv  *http.Server
	fast *fastServer
	ln   net.Listener
}

// New builds a gateway from cfg (SetDefaults is applied, then Validate):
// it loads its starting rules — the rules file, or in fleet mode (nats.url
// set) the last-known-good copy under data_dir when there is one — and
// refuses to start without a valid ruleset; it creates the Redis client
// and store, and binds every listener, so Addrs is known when New returns
// and clients connecting before Run wait in the listen queue. When some
// listeners cannot be bound it binds none, and its error names each (a
// busy address as a service.AddrInUseError naming the variable that moves
// it, matching service.ErrAddrInUse and syscall.EADDRINUSE), one per line. log may be
// nil (discard); API keys are never logged. New does not contact NATS.
//
// New starts the Redis store's pipelining goroutines and the fast path's
// lease sweep, and nothing else; Run
// starts the servers, the rules source (the file watcher, or the NATS KV
// watcher and its connection), the sweeper of expired controls and the
// cost reporters, and Close (or Run's return) stops and waits for all of
// them.
func New(cfg Config, log *slog.Logger) (*Server, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("gateway: invalid configuration:\n%w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	id, err := cfg.identity()
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}

	s := &Server{cfg: cfg, log: log, reg: prometheus.NewRegistry(), offenders: newOffenders(cfg.Offenders, id)}
	s.registerProcessMetrics()
	s.m = metrics.New(prometheus.WrapRegistererWith(prometheus.Labels{"gateway": cfg.GatewayID}, s.reg))

	s.client, err = redisstore.NewClient(cfg.Redis.Client())
	if err != nil {
		return nil, fmt.Errorf("gateway: redis: %w", err)
	}
	s.store = redisstore.New(s.client,
		redisstore.WithTimeout(cfg.Redis.Timeout),
		redisstore.WithKeyPrefix(cfg.Redis.KeyPrefix),
		redisstore.WithLogger(log.With(slog.String("component", "redisstore"))))
	fallback := memstore.New()
	labelled := prometheus.WrapRegistererWith(prometheus.Labels{"gateway": cfg.GatewayID}, s.reg)
	labelled.MustRegister(newBreakerCollector(s.store),
		promdef.GaugeFunc("tollgate_fallback_counters", "Counters held by the in-memory limiter that decides on_failure: closed rules while Redis is unavailable (bounded by memstore.DefaultMaxCounters).", func() float64 { return float64(fallback.Len()) }))
	observers := []guard.Observer{s.m}
	if len(cfg.Kafka.Brokers) > 0 {
		if err := s.newEvents(); err != nil {
			s.releaseStore()
			return nil, fmt.Errorf("gateway: decision events: %w", err)
		}
		observers = append(observers, eventObserver{s.events})
	}
	// The guard's store: Redis, counted by the metrics, behind the local
	// fast path unless it is disabled.
	var store guard.Store = s.m.Store(s.store)
	if !cfg.FastPath.Disabled {
		s.lease = lease.New(store,
			lease.WithMaxTTL(cfg.FastPath.MaxLeaseTTL),
			lease.WithWindowTTL(cfg.FastPath.WindowLeaseTTL),
			lease.WithCounters(cfg.FastPath.Counters),
			lease.WithLogger(log.With(slog.String("component", "lease"))))
		store = s.lease
		labelled.MustRegister(newFastPathCollector(s.lease))
	}
	s.guard, err = guard.New(store, []byte(cfg.KeySecret), nil,
		guard.WithResolutionCache(cfg.FastPath.Resolutions),
		guard.WithFallback(fallback, cfg.FailureShare),
		guard.WithMaxCost(cfg.MaxCost),
		guard.WithRegion(cfg.Region), guard.WithRegionsPeriod(cfg.RegionsPeriod),
		guard.WithMaxRules(cfg.MaxRulesPerRequest),
		guard.WithOnTooManyRules(s.m.TooManyRules),
		guard.WithObserver(observers...),
		guard.WithLogger(log.With(slog.String("component", "guard"))))
	if err != nil {
		s.releaseStore()
		return nil, fmt.Errorf("gateway: %w", err)
	}
	if err := s.startRules(); err != nil {
		s.releaseStore()
		return nil, fmt.Errorf("gateway: rules_file %s: %w", cfg.RulesFile, err)
	}
	labelled.MustRegister(newControlsCollector(s.guard.Controls()))
	labelled.MustRegister(s.offenderCollectors()...)
	if s.sync != nil {
		labelled.MustRegister(s.fleetCollectors()...)
	}

	checker := guard.Checker(s.guard)
	if cfg.Upstream != "" {
		u, _ := url.Parse(cfg.Upstream) // validated
		s.upstream = proxy.NewTransport()
		pcfg := proxy.Config{
			Upstream:  u,
			Checker:   checker,
			Identity:  id,
			Transport: s.upstream,
			OnClose:   s.onClose,
			Log:       log.With(slog.String("component", "proxy")),
		}
		if cfg.CostResponseHeader != "" {
			s.reporter = proxy.NewReporter(func(ctx context.Context, req *guard.Request) error {
				_, err := checker.Report(ctx, req)
				return err
			}, costQueue, costWorkers, time.Second, s.m.CostDropped)
			pcfg.CostHeader, pcfg.Reporter = cfg.CostResponseHeader, s.reporter
		}
		s.addServer("proxy", cfg.Listen, proxy.New(pcfg), cfg.Limits.WriteTimeout)
		s.servers[len(s.servers)-1].srv.ConnContext = s.offenders.connContext
	}
	if cfg.APIListen != Off {
		s.servers = append(s.servers, &httpServer{name: "api", fast: s.newAPIServer(checkapi.Config{
			Decider:  checker,
			Token:    cfg.APIToken,
			Identity: id,
			MaxBatch: cfg.MaxBatch,
			MaxBody:  cfg.Limits.MaxBodyBytes,
			Log:      log.With(slog.String("component", "checkapi")),
		})})
	}
	if cfg.MetricsListen != Off {
		s.addServer("metrics", cfg.MetricsListen, s.metricsHandler(), apiWriteTimeout)
	}
	if cfg.GRPCListen != Off {
		creds, err := cfg.grpcCredentials()
		if err != nil {
			s.releaseStore()
			return nil, fmt.Errorf("gateway: %w", err)
		}
		s.grpc = newGRPCServer(s.guard, s.m, log, creds)
	}
	if err := s.listen(); err != nil {
		s.releaseListeners()
		s.releaseStore()
		return nil, err
	}
	return s, nil
}

func (s *Server) addServer(name, addr string, h http.Handler, writeTimeout time.Duration) {
	l := s.cfg.Limits
	s.servers = append(s.servers, &httpServer{name: name, srv: &http.Server{
		Addr:              addr,
		Handler:           h,
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		ReadTimeout:       l.ReadTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    l.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.log.With(slog.String("listener", name)).Handler(), slog.LevelDebug),
	}})
}

// listenVars are the settings of the listeners' addresses, by listener.
var listenVars = map[string]string{"proxy": "listen", "api": "api_listen", "metrics": "metrics_listen", "grpc": "grpc_listen"}

// listen binds every listener. When some cannot be bound, none stays
// bound and the error names each that failed, a busy one with the
// variable that moves it (service.ErrAddrInUse, one line each).
func (s *Server) listen() error {
	var ls []service.Listener
	for _, hs := range s.servers {
		addr := s.cfg.APIListen
		if hs.srv != nil {
			addr = hs.srv.Addr
		}
		ls = append(ls, service.Listener{Name: hs.name, Addr: addr, Var: configs.EnvName(listenVars[hs.name])})
	}
	if s.grpc != nil {
		ls = append(ls, service.Listener{Name: "grpc", Addr: s.cfg.GRPCListen, Var: configs.EnvName(listenVars["grpc"])})
	}
	lns, err := service.ListenAll(ls)
	if err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	for i, hs := range s.servers {
		ln := lns[i]
		hs.ln = ln
		switch hs.name {
		case "proxy":
			s.addrs.Proxy = ln.Addr().String()
			hs.ln = s.wrapProxyListener(ln)
		case "api":
			s.addrs.API = ln.Addr().String()
		case "metrics":
			s.addrs.Metrics = ln.Addr().String()
		}
	}
	if s.grpc != nil {
		s.grpc.ln = lns[len(lns)-1]
		s.addrs.GRPC = s.grpc.ln.Addr().String()
	}
	return nil
}

// Addrs returns the bound addresses (useful with port 0).
func (s *Server) Addrs() Addrs { return s.addrs }

// Guard returns the server's guard, for callers that need its controls
// (blocklist, penalties, overrides) or its rules.
func (s *Server) Guard() *guard.Guard { return s.guard }

// Registry returns the server's Prometheus registry (what /metrics serves).
func (s *Server) Registry() *prometheus.Registry { return s.reg }

// setRules applies a ruleset from source: the guard's, the metrics' route
// labels and the version and source readyz reports.
func (s *Server) setRules(rs *rulefile.Ruleset, source string, reload bool) {
	s.guard.SetRules(rs.Rules)
	s.m.SetRules(rs.Rules, rs.Routes, reload)
	s.ruleState.Store(&activeRules{Ruleset: rs, source: source})
	s.announcer.Poke()
	if reload {
		s.log.Info("rules reloaded", slog.String("source", source), slog.String("version", rs.Version()),
			slog.Int("rules", len(rs.Rules.Rules())))
	}
}

// Run serves until ctx is done or a listener fails, then shuts down
// gracefully. It serves /metrics, /healthz and /readyz at once; in fleet
// mode it then waits up to natsStartWait (1 s) for NATS to deliver the
// fleet's rules before it serves the other listeners. On shutdown it stops accepting, lets
// in-flight requests finish within shutdown_timeout (then closes their
// connections), charges the queued costs, and releases Redis. It returns
// nil after a shutdown asked for by ctx or Close, else the error that
// stopped it. Run may be called once; every goroutine it starts has exited
// when it returns.
func (s *Server) Run(ctx context.Context) error {
	ctx, finish, err := s.life.Start(ctx)
	if err != nil {
		return err
	}
	defer finish()

	s.started = time.Now()
	g, ctx := service.NewGroup(ctx)
	g.Go(func() error { return s.rules.Run(ctx) })
	// Health answers from the start, whatever the dependencies do: the
	// monitors first, then the metrics listener, before the wait for NATS.
	s.startHealth(ctx, g)
	serve := func(hs *httpServer) {
		g.Go(func() error {
			if hs.fast != nil {
				if err := hs.fast.serve(hs.ln); err != nil {
					return fmt.Errorf("gateway: %s listener: %w", hs.name, err)
				}
				return nil
			}
			if err := hs.srv.Serve(hs.ln); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("gateway: %s listener: %w", hs.name, err)
			}
			return nil
		})
	}
	for _, hs := range s.servers {
		if hs.name == "metrics" {
			serve(hs)
		}
	}
	if s.sync != nil {
		s.waitForNATS(ctx)
	}
	// The warnings come before the start line, so that whoever reads up
	// to "gateway started" (a person, a test) has read them too.
	s.warnExposure()
	s.log.Info("gateway started",
		slog.String("gateway_id", s.cfg.GatewayID),
		slog.String("proxy", s.addrs.Proxy), slog.String("upstream", redactURL(s.cfg.Upstream)),
		slog.String("api", s.addrs.API), slog.String("metrics", s.addrs.Metrics), slog.String("grpc", s.addrs.GRPC),
		slog.Bool("api_token_set", s.cfg.APIToken != ""), slog.String("grpc_tls", s.grpcTLSMode()),
		slog.Any("exposed", s.exposed()),
		slog.String("rules_source", s.ruleState.Load().source), slog.String("rules_file", s.cfg.RulesFile),
		slog.String("rules_version", s.ruleState.Load().Version()), slog.String("nats", fleetkv.RedactURL(s.cfg.NATS.URL)),
		slog.Any("redis", s.cfg.Redis.Addrs), slog.String("redis_mode", s.cfg.Redis.Mode))

	g.Go(func() error { s.loadScript(ctx); return nil })
	if s.events != nil {
		// Not ctx: the producer stops in shutdown, once every decision is
		// made (Close), not when the drain begins.
		g.Go(func() error { return s.events.Run(context.WithoutCancel(ctx)) })
	}
	g.Go(func() error { s.sweep(ctx); return nil })
	if s.reporter != nil {
		g.Go(s.reporter.Run)
	}
	for _, hs := range s.servers {
		if hs.name != "metrics" {
			serve(hs)
		}
	}
	if s.grpc != nil {
		g.Go(func() error {
			if err := s.grpc.serve(); err != nil {
				return fmt.Errorf("gateway: grpc listener: %w", err)
			}
			return nil
		})
	}
	g.Go(func() error {
		<-ctx.Done()
		s.shutdown()
		return nil
	})
	err = g.Wait()
	s.releaseStore()
	if err != nil {
		s.log.Error("gateway stopped", slog.String("error", err.Error()))
	} else {
		s.log.Info("gateway stopped")
	}
	return err
}

// shutdown drains the listeners: the proxy, check API and gRPC first (while
// /readyz answers 503 draining), then the metrics listener, then the cost
// reports.
func (s *Server) shutdown() {
	s.draining.Store(true)
	s.log.Info("gateway shutting down", slog.Duration("timeout", s.cfg.ShutdownTimeout))
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	var wg sync.WaitGroup
	var metricsSrv *httpServer
	for _, hs := range s.servers {
		if hs.name == "metrics" {
			metricsSrv = hs
			continue
		}
		wg.Go(func() { s.shutdownHTTP(ctx, hs) })
	}
	if s.grpc != nil {
		wg.Go(func() { s.grpc.shutdown(ctx) })
	}
	wg.Wait()
	if metricsSrv != nil {
		s.shutdownHTTP(ctx, metricsSrv)
	}
	if s.reporter != nil {
		// Queued costs get what is left of the shutdown time.
		s.reporter.Close(ctx)
	}
	if s.events != nil {
		// Every decision is made: what is buffered goes to Kafka, or to the
		// spool (events.shutdown_timeout), before the process exits.
		if err := s.events.Close(); err != nil {
			s.log.Error("decision events: stop", slog.String("error", err.Error()))
		}
	}
	if s.upstream != nil {
		s.upstream.CloseIdleConnections()
	}
}

func (s *Server) shutdownHTTP(ctx context.Context, hs *httpServer) {
	if hs.fast != nil {
		if err := hs.fast.shutdown(ctx); err != nil {
			s.log.Warn("in-flight requests cut at shutdown timeout", slog.String("listener", hs.name))
		}
		return
	}
	if err := hs.srv.Shutdown(ctx); err != nil {
		s.log.Warn("in-flight requests cut at shutdown timeout", slog.String("listener", hs.name))
		_ = hs.srv.Close()
	}
}

// sweep drops expired controls every sweepInterval until ctx is done.
func (s *Server) sweep(ctx context.Context) {
	service.Every(ctx, sweepInterval, func(time.Time) {
		if n := s.guard.Controls().Sweep(time.Now().UnixMicro()); n > 0 {
			s.log.Debug("expired controls dropped", slog.Int("entries", n))
		}
	})
}

// loadScript loads the Redis script so that the first checks need no
// NOSCRIPT round trip. Redis may be down: the gateway starts anyway, fails
// open, and the store loads the script on its first NOSCRIPT.
func (s *Server) loadScript(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, max(time.Second, 4*s.cfg.Redis.Timeout))
	defer cancel()
	if err := s.store.Load(ctx); err != nil {
		if ctx.Err() == nil || !errors.Is(err, context.Canceled) {
			s.log.Warn("redis unavailable at start; failing open until it answers (on_failure: closed rules limited locally)",
				slog.String("error", err.Error()))
		}
		return
	}
	s.log.Info("redis ready", slog.Any("addrs", s.cfg.Redis.Addrs))
}

// Close stops a running server and waits for Run to return, or releases
// the listeners and Redis of a server Run was never called on. It is
// idempotent and safe from many goroutines.
func (s *Server) Close() error {
	s.life.Close(func() {
		s.releaseListeners()
		s.releaseStore()
	})
	return nil
}

func (s *Server) releaseListeners() {
	for _, hs := range s.servers {
		if hs.ln != nil {
			_ = hs.ln.Close()
		}
	}
	if s.grpc != nil && s.grpc.ln != nil {
		_ = s.grpc.ln.Close()
	}
}

func (s *Server) releaseStore() {
	if s.lease != nil {
		// Gives back the units of every lease before Redis goes.
		_ = s.lease.Close()
	}
	if s.events != nil {
		_ = s.events.Close() // idempotent: spools what is buffered, releases the spool's lock
	}
	if s.store != nil {
		_ = s.store.Close()
	}
	if s.client != nil {
		_ = s.client.Close()
	}
}

// exposed returns the names of the listeners bound beyond loopback (a
// wildcard or another interface), for the start log: what others on the
// network can reach.
func (s *Server) exposed() []string {
	out := []string{}
	for _, l := range []struct{ name, addr string }{
		{"proxy", s.addrs.Proxy}, {"api", s.addrs.API}, {"metrics", s.addrs.Metrics}, {"grpc", s.addrs.GRPC},
	} {
		if l.addr != "" && !configs.Loopback(l.addr) {
			out = append(out, l.name)
		}
	}
	return out
}

// warnExposure warns about listeners exposed beyond loopback without
// protection: the check API without api_token, Envoy RLS without mutual
// TLS (it never uses api_token). Secrets are never logged, only whether
// they are set.
func (s *Server) warnExposure() {
	if s.addrs.API != "" && !configs.Loopback(s.addrs.API) && s.cfg.APIToken == "" {
		s.log.Warn("the check API is reachable beyond loopback without api_token: anyone who reaches it can spend and read quotas; set TOLLGATE_API_TOKEN or bind api_listen to loopback",
			slog.String("api", s.addrs.API))
	}
	if s.addrs.GRPC != "" && !configs.Loopback(s.addrs.GRPC) && s.cfg.GRPCTLSClientCAFile == "" {
		s.log.Warn("Envoy RLS is reachable beyond loopback without mutual TLS (it does not use api_token): bind grpc_listen to loopback or a private interface, or set grpc_tls_client_ca_file",
			slog.String("grpc", s.addrs.GRPC))
	}
}

// grpcTLSMode names the Envoy RLS listener's transport for the start log.
func (s *Server) grpcTLSMode() string {
	switch {
	case s.grpc == nil:
		return "off"
	case s.cfg.GRPCTLSClientCAFile != "":
		return "mtls"
	case s.cfg.GRPCTLSCertFile != "":
		return "tls"
	}
	return "plaintext"
}

// redactURL drops user information from a URL for logs.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	return u.Redacted()
}

// newEvents creates the decision event producer (kafka.brokers set).
func (s *Server) newEvents() error {
	cfg := s.cfg
	dir := cfg.Events.SpoolDir
	if dir == "" {
		dir = events.DefaultSpoolDir(cfg.DataDir, cfg.GatewayID)
	}
	// New takes no context: the partition count's read is bounded by
	// events.Config.MetadataTimeout alone.
	p, err := events.New(context.Background(), events.Config{
		Brokers:       cfg.Kafka.Brokers,
		Topic:         cfg.Kafka.DecisionsTopic,
		GatewayID:     cfg.GatewayID,
		SpoolDir:      dir,
		SpoolMaxBytes: cfg.Events.SpoolMaxBytes,
		MemoryBytes:   cfg.Events.MemoryBytes,
		FlushInterval: cfg.Events.FlushInterval,
		Partitions:    cfg.Kafka.Partitions,
		Log:           s.log, // the producer names itself component=events
		Registerer:    prometheus.WrapRegistererWith(prometheus.Labels{"gateway": cfg.GatewayID}, s.reg),
	})
	if err != nil {
		return err
	}
	s.events = p
	return nil
}

// eventObserver turns the guard's decisions into decision events: checks
// (admissions and rejections; not peeks) and after-the-fact charges.
type eventObserver struct{ p *events.Producer }

func (o eventObserver) Decided(_ context.Context, op guard.Op, req *guard.Request, d *guard.Decision, err error, _ time.Duration) {
	if err != nil {
		return
	}
	switch op {
	case guard.OpCheck:
		o.p.Record(req, d, req.Surface)
	case guard.OpReport:
		o.p.Report(req, d, req.Surface)
	}
}
