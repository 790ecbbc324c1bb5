// Package aggregator is Tollgate's control-plane process as a library: the
// exactly-once consumer of the decision stream, the per-tenant usage
// windows in Pebble, abuse detection and the penalty ladder (applied to
// NATS KV through an outbox), the usage reports, the operator API, and its
// metrics and health endpoints. bin/aggregator (aggregator/cmd/aggregator) loads a
// Config and calls New and Run; tests and `make run` start instances in
// process the same way.
//
//	cfg, err := aggregator.LoadConfig("", nil) // TOLLGATE_* variables
//	srv, err := aggregator.New(cfg, logger)
//	err = srv.Run(ctx) // returns after a graceful stop once ctx is done
//
// How exactly-once holds across crashes, rebalances and lost instances is
// in docs/aggregator.md.
package aggregator

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tollgate/tollgate/aggregator/internal/adminapi"
	"github.com/tollgate/tollgate/aggregator/internal/audit"
	"github.com/tollgate/tollgate/aggregator/internal/console"
	"github.com/tollgate/tollgate/aggregator/internal/consume"
	"github.com/tollgate/tollgate/aggregator/internal/outbox"
	"github.com/tollgate/tollgate/aggregator/internal/reports"
	"github.com/tollgate/tollgate/aggregator/internal/state"
	"github.com/tollgate/tollgate/aggregator/internal/windows"
	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/guard/keyid"
	"github.com/tollgate/tollgate/guard/redisstore"
	"github.com/tollgate/tollgate/internal/fleetkv"
	"github.com/tollgate/tollgate/internal/kafkalog"
	"github.com/tollgate/tollgate/internal/service"
)

// Server is an aggregator instance. Create it with New, then call Run
// once; Close stops it. It is safe for concurrent use.
type Server struct {
	cfg   Config
	log   *slog.Logger
	reg   *prometheus.Registry
	db    *state.DB
	proc  *consume.Processor
	audit *audit.Store
	snaps *state.Snapshots
	kafka *kgo.Client // producer of audit entries and lift commands
	kv    atomic.Pointer[fleetkv.KV]
	// outbox applies committed penalty steps to NATS KV (nil without
	// NATS).
	outbox *outbox.Reconciler
	// regions runs the region's agent and coordinator (nil without NATS).
	regions *regionAgent

	redis   redis.UniversalClient
	store   *redisstore.Store
	keyGard atomic.Pointer[hashedGuard] // the operator API's guard, by ruleset hash
	// keyControls are the key guard's overrides and penalties, mirrored
	// from NATS while the control plane is connected.
	keyControls *keyControls
	guard       *console.Guard // who a request is: tokens and console sessions

	// reportsMux serves the usage reports of this region alone.
	reportsMux *http.ServeMux
	// hasher turns API keys into key_ids.
	hasher *keyid.Hasher
	// global is the link global changes use, once NATS answers; replay
	// applies other regions' global changes (the operator API without
	// its token).
	global atomic.Pointer[globalLink]
	replay http.Handler

	api, metrics *http.Server
	apiLn, metLn net.Listener

	deps       deps                         // what the probes learnt of Kafka, NATS and Redis
	nc         atomic.Pointer[fleetkv.Conn] // the NATS connection, once made
	setUp      atomic.Bool                  // the processor's Setup is done: Kafka answered
	draining   atomic.Bool
	drainingAt atomic.Int64 // unix nanoseconds

	life service.Lifecycle
}

// Errors of New and Run.
var (
	// ErrDataDirInUse is returned by New when another aggregator process
	// holds data_dir.
	ErrDataDirInUse = errors.New("aggregator: data directory in use")
	// ErrDuplicateID is returned by Run when another live instance has
	// this instance's aggregator_id.
	ErrDuplicateID = errors.New("aggregator: aggregator_id in use")
)

// lockedByOther reports whether opening the state failed on its lock:
// another process holds it (fcntl answers EAGAIN or EACCES), or another
// aggregator in this process (Pebble's own message).
func lockedByOther(err error) bool {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return false // creating the lock file failed: a permission problem, said as is
	}
	return errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EACCES) ||
		strings.Contains(err.Error(), "lock held by current process")
}

// Addrs are the bound addresses.
type Addrs struct {
	API     string
	Metrics string
}

// New opens the state in cfg.DataDir, creates the Kafka and Redis clients
// and binds the listeners, so Addrs is known when it returns. It serves and
// consumes nothing (Run does), but the clients start goroutines of their
// own: franz-go's metadata, connection-reaper and metrics loops, the Redis store's
// batching goroutines. Close, or Run's return, stops them. When New fails,
// it has released everything it opened. log may be nil.
func New(cfg Config, log *slog.Logger) (_ *Server, err error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("aggregator: invalid configuration:\n%w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	hasher, err := keyid.New([]byte(cfg.KeySecret))
	if err != nil {
		return nil, fmt.Errorf("aggregator: key_secret (TOLLGATE_KEY_SECRET): %w", err)
	}
	if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
		return nil, fmt.Errorf("aggregator: data_dir: %w", err)
	}
	db, err := state.Open(filepath.Join(cfg.DataDir, "state"), log.With(slog.String("component", "pebble")))
	if err != nil {
		if lockedByOther(err) {
			return nil, fmt.Errorf("%w: data_dir (%s) %s is held by another aggregator; give each instance its own data directory",
				ErrDataDirInUse, configs.EnvName("data_dir"), cfg.DataDir)
		}
		return nil, fmt.Errorf("aggregator: %w", err)
	}
	now := time.Now()
	s := &Server{cfg: cfg, log: log, keyControls: newKeyControls(), reg: prometheus.NewRegistry(), db: db,
		deps: deps{kafka: newDependency("kafka", log, now), nats: newDependency("nats", log, now), redis: newDependency("redis", log, now)}}
	defer func() {
		if err != nil {
			_ = s.release()
		}
	}()
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	labelled := prometheus.WrapRegistererWith(prometheus.Labels{"aggregator": cfg.ID}, s.reg)
	var observe func(*windows.Event)
	if cfg.NATS.URL != "" {
		s.regions = newRegionAgent(s, labelled)
		observe = s.regions.observe
	}
	s.proc = consume.New(consume.Config{
		Brokers: cfg.Kafka.Brokers,
		Topics: consume.Topics{
			Decisions: cfg.Kafka.DecisionsTopic,
			Changelog: cfg.Kafka.ChangelogTopic,
			Usage:     cfg.Kafka.UsageTopic,
			Penalties: cfg.Kafka.PenaltiesTopic,
			Audit:     cfg.Kafka.AuditTopic,
		},
		Group:          cfg.ConsumerGroup,
		InstanceID:     cfg.ID,
		Partitions:     cfg.Kafka.Partitions,
		TxnTimeout:     cfg.TransactionTimeout,
		SessionTimeout: cfg.SessionTimeout,
		CommitInterval: cfg.CommitInterval,
		Windows: windows.Config{
			Lateness: cfg.Usage.Lateness,
			Retention: map[windows.Granularity]time.Duration{
				windows.Minute: cfg.Usage.RetentionMinute,
				windows.Hour:   cfg.Usage.RetentionHour,
				windows.Day:    cfg.Usage.RetentionDay,
			},
		},
		Abuse:   cfg.Penalty.abuse(),
		Log:     log.With(slog.String("component", "consume")),
		Observe: observe,
	}, db, labelled)

	s.audit = audit.NewStore(db, log.With(slog.String("component", "audit")))
	s.snaps = state.NewSnapshots(db, filepath.Join(cfg.DataDir, "snapshots"), cfg.Audit.SnapshotKeep, log)
	mux := http.NewServeMux()
	s.hasher = hasher
	s.reportsMux = http.NewServeMux()
	reports.Register(s.reportsMux, reports.Config{DB: db, Hasher: hasher, MaxRows: cfg.Usage.MaxRows})
	usage := reports.WithRegions(s.reportsMux, s.regionsConfig())
	mux.Handle("GET /v1/usage/tenants/{tenant}", usage)
	mux.Handle("GET /v1/usage/keys/{key}", usage)
	s.kafka, err = kgo.NewClient(kgo.SeedBrokers(cfg.Kafka.Brokers...), kgo.WithLogger(kafkalog.New(log)),
		kgo.MetadataMinAge(250*time.Millisecond), kgo.ProduceRequestTimeout(5*time.Second), kgo.RecordDeliveryTimeout(10*time.Second),
		kgo.RecordPartitioner(commandPartitioner(cfg.Kafka.DecisionsTopic)))
	if err != nil {
		return nil, fmt.Errorf("aggregator: kafka client: %w", err)
	}
	if s.redis, err = redisstore.NewClient(cfg.Redis.Client()); err != nil {
		return nil, fmt.Errorf("aggregator: redis: %w", err)
	}
	s.store = redisstore.New(s.redis, redisstore.WithTimeout(cfg.Redis.Timeout), redisstore.WithKeyPrefix(cfg.Redis.KeyPrefix),
		redisstore.WithLogger(log.With(slog.String("component", "redisstore"))))
	acfg := adminapi.Config{Audit: s.audit, Hasher: hasher, Auditor: audit.NewWriter(s.kafka, cfg.Kafka.AuditTopic),
		Penalties: db, Commands: commander{cl: s.kafka, topic: cfg.Kafka.DecisionsTopic},
		Log: log.With(slog.String("component", "adminapi")), Guard: s.keyGuard}
	if cfg.NATS.URL != "" {
		acfg.KV = s.natsKV
		s.outbox = outbox.New(outbox.Config{Brokers: cfg.Kafka.Brokers, Topic: cfg.Kafka.PenaltiesTopic,
			SessionTimeout: cfg.SessionTimeout, KV: s.kv.Load, States: db, Log: log.With(slog.String("component", "outbox")),
			KafkaLog: kafkalog.Slog(log)}, labelled)
	}
	adminapi.Register(mux, acfg)
	mux.HandleFunc("GET /admin/v1/overview", s.overview)
	mux.HandleFunc("GET /admin/v1/gateways", s.gateways)
	labelled.MustRegister(s.readyGauge())
	s.guard = console.NewGuard(cfg.AdminToken, cfg.ViewerToken, nil)
	top := http.NewServeMux()
	s.replay = s.gate(mux)
	top.Handle("/", s.authorize(s.gate(s.globalScope(mux))))
	console.Register(top, s.guard)
	s.api = &http.Server{Handler: top, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 60 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 16 << 10,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	ls := []service.Listener{{Name: "api", Addr: cfg.Listen, Var: configs.EnvName("aggregator_listen")}}
	if cfg.MetricsListen != Off {
		mm := http.NewServeMux()
		mm.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
		mm.HandleFunc("GET /healthz", healthz)
		mm.HandleFunc("GET /readyz", s.readyz)
		s.metrics = &http.Server{Handler: mm, ReadHeaderTimeout: 5 * time.Second, WriteTimeout: 30 * time.Second,
			ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
		ls = append(ls, service.Listener{Name: "metrics", Addr: cfg.MetricsListen, Var: configs.EnvName("aggregator_metrics_listen")})
	}
	lns, err := service.ListenAll(ls)
	if err != nil {
		return nil, fmt.Errorf("aggregator: %w", err)
	}
	s.apiLn = lns[0]
	if s.metrics != nil {
		s.metLn = lns[1]
	}
	return s, nil
}

// Addrs returns the bound addresses.
func (s *Server) Addrs() Addrs {
	a := Addrs{API: s.apiLn.Addr().String()}
	if s.metLn != nil {
		a.Metrics = s.metLn.Addr().String()
	}
	return a
}

// Registry returns the Prometheus registry /metrics serves.
func (s *Server) Registry() *prometheus.Registry { return s.reg }

// Ready reports whether the state is restored (reports are complete).
func (s *Server) Ready() bool { return s.proc.Ready() }

// Owned returns the decisions partitions this instance processes now.
func (s *Server) Owned() []int32 { return s.proc.Owned() }

// insecureWarning is the line /readyz adds while the operator API runs
// without a token (admin_insecure), else "".
func (s *Server) insecureWarning() string {
	if s.cfg.AdminToken != "" {
		return ""
	}
	return "WARNING: the operator API has no token (" + configs.EnvName("admin_insecure") + "=true): whoever reaches " +
		s.cfg.Listen + " can change the fleet's rules, lists and quotas\n"
}

// authorize requires a caller on the operator API and the reports: the
// admin token, the viewer token (reads only) or a console session
// (package console). A request without one is answered 401 and changes
// nothing, whatever its method, content type or Origin: a web page cannot
// make a browser attach an Authorization header to a cross-site request
// without a CORS preflight, which this API never grants, and a change made
// with the console's cookie must come from the console's own pages and
// carry its session's CSRF token. With admin_insecure (no admin token
// configured) any bearer token but the viewer's is the admin's.
func (s *Server) authorize(next http.Handler) http.Handler {
	if s.cfg.AdminToken == "" {
		s.log.Warn("the operator API has NO TOKEN ("+configs.EnvName("admin_insecure")+"=true): whoever reaches its address can change the fleet's rules, lists and quotas; any bearer token is accepted",
			slog.String("aggregator_listen", s.cfg.Listen))
	}
	if s.guard == nil {
		s.guard = console.NewGuard(s.cfg.AdminToken, s.cfg.ViewerToken, nil)
	}
	return s.guard.Wrap(next)
}

// ConsoleCode returns a single-use code that signs a browser in to the
// console as the admin within an hour: the link `make run` prints is
// /console/#code=<code> (a URL fragment: never sent to a server, so never
// in an access log). The code is not a token: once exchanged it is gone.
func (s *Server) ConsoleCode() string { return s.guard.NewCode(console.RoleAdmin) }

// Run serves and aggregates until ctx is done or a part fails, then stops
// gracefully: HTTP drains within aggregator_shutdown_timeout, the
// processor ends its transaction and leaves the group so its partitions
// move at once, and Pebble is closed. Every goroutine it starts has exited
// when it returns.
//
// The listeners serve at once: /healthz, /readyz and the API answer
// whatever Kafka, NATS or Redis do (the API 503 with the reason while it
// cannot serve a request). The processor, the audit tail, NATS and the
// outbox, and the snapshots start once Kafka has answered and the state's
// identity is checked (which may wipe it).
func (s *Server) Run(ctx context.Context) error {
	ctx, finish, err := s.life.Start(ctx)
	if err != nil {
		return err
	}
	defer finish()
	s.log.Info("aggregator started", slog.String("aggregator_id", s.cfg.ID), slog.String("api", s.Addrs().API),
		slog.String("metrics", s.Addrs().Metrics), slog.Any("kafka", s.cfg.Kafka.Brokers), slog.String("data_dir", s.cfg.DataDir),
		slog.Bool("admin_token_set", s.cfg.AdminToken != ""))
	g, gctx := service.NewGroup(ctx)
	serve := func(srv *http.Server, ln net.Listener, name string) {
		g.Go(func() error {
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("aggregator: %s listener: %w", name, err)
			}
			return nil
		})
	}
	serve(s.api, s.apiLn, "api")
	if s.metrics != nil {
		serve(s.metrics, s.metLn, "metrics")
	}
	g.Go(func() error {
		<-gctx.Done()
		s.drainingAt.Store(time.Now().UnixNano())
		s.draining.Store(true)
		sctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
		defer cancel()
		_ = s.api.Shutdown(sctx)
		if s.metrics != nil {
			_ = s.metrics.Shutdown(sctx)
		}
		return nil
	})
	g.Go(func() error { return s.probeKafka(gctx) })
	g.Go(func() error { return s.probeRedis(gctx) })
	if s.cfg.NATS.URL != "" {
		g.Go(func() error { return s.probeNATS(gctx) })
	}
	g.Go(func() error {
		if err := s.proc.Setup(gctx); err != nil {
			if gctx.Err() != nil {
				return nil
			}
			return err
		}
		s.setUp.Store(true)
		g.Go(func() error {
			err := s.proc.Run(gctx)
			if errors.Is(err, consume.ErrDuplicateID) {
				return fmt.Errorf("%w: each instance needs its own aggregator_id (%s): %w",
					ErrDuplicateID, configs.EnvName("aggregator_id"), err)
			}
			return err
		})
		g.Go(func() error {
			return s.audit.Tail(gctx, audit.TailConfig{Brokers: s.cfg.Kafka.Brokers, Topic: s.cfg.Kafka.AuditTopic})
		})
		if s.cfg.NATS.URL != "" {
			// After Kafka answers: seeding the rules bucket is audited
			// through it.
			g.Go(func() error { return s.connectNATS(gctx) })
			g.Go(func() error { return s.outbox.Run(gctx) })
			// The regions agent: idle until the rules list several regions.
			g.Go(func() error { return s.regions.run(gctx) })
		}
		if s.cfg.Audit.SnapshotInterval > 0 {
			g.Go(func() error { s.snaps.Run(gctx, s.cfg.Audit.SnapshotInterval); return nil })
		}
		return nil
	})
	err = g.Wait()
	if cerr := s.release(); cerr != nil && err == nil {
		err = cerr
	}
	if err != nil {
		s.log.Error("aggregator stopped", slog.String("error", err.Error()))
	} else {
		s.log.Info("aggregator stopped")
	}
	return err
}

// drainingSince is when the shutdown began.
func (s *Server) drainingSince() time.Time { return time.Unix(0, s.drainingAt.Load()) }

// Close stops a running server and waits for Run to return, or releases
// what New acquired. Idempotent, safe from many goroutines.
func (s *Server) Close() error {
	s.life.Close(func() { _ = s.release() })
	return nil
}

// release closes everything New opened, the last opened first: the
// listeners, the Redis store and its client, the Kafka client and Pebble.
// It is the one release path: New calls it when a step fails, Run when it
// returns, Close when Run never ran; each calls it once. It skips what was
// not opened, and returns Pebble's error (the others' say nothing a caller
// could act on).
func (s *Server) release() error {
	for _, ln := range []net.Listener{s.metLn, s.apiLn} {
		if ln != nil {
			_ = ln.Close() // after Serve, already closed
		}
	}
	if s.store != nil {
		_ = s.store.Close()
	}
	if s.redis != nil {
		_ = s.redis.Close()
	}
	if s.kafka != nil {
		s.kafka.Close()
	}
	return s.db.Close()
}

// SnapshotDir is where snapshots are written.
func (s *Server) SnapshotDir() string { return s.snaps.Dir() }

// Snapshot writes a consistent snapshot of the state now (named for
// now) and prunes the oldest beyond snapshot_keep; it returns its
// directory.
func (s *Server) Snapshot(now time.Time) (string, error) { return s.snaps.Take(now) }
