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
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tollgate/tollgate/aggregator/internal/adminapi"
	"github.com/tollgate/tollgate/aggregator/internal/audit"
	"github.com/tollgate/tollgate/aggregator/internal/consume"
	"github.com/tollgate/tollgate/aggregator/internal/outbox"
	"github.com/tollgate/tollgate/aggregator/internal/reports"
	"github.com/tollgate/tollgate/aggregator/internal/state"
	"github.com/tollgate/tollgate/aggregator/internal/windows"
	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/keyid"
	"github.com/tollgate/tollgate/guard/redisstore"
	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/internal/fleetkv"
	"github.com/tollgate/tollgate/internal/kafkalog"
	"github.com/tollgate/tollgate/internal/service"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
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
	kafka *kgo.Client // producer of audit entries and lift commands
	kv    atomic.Pointer[fleetkv.KV]
	// outbox applies committed penalty steps to NATS KV (nil without
	// NATS).
	outbox *outbox.Reconciler

	redis   redis.UniversalClient
	store   *redisstore.Store
	keyGard atomic.Pointer[hashedGuard] // the operator API's guard, by ruleset hash

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

// New opens the state in cfg.DataDir and binds the listeners, so Addrs is
// known when it returns; it starts no goroutine (Run does). log may be nil.
func New(cfg Config, log *slog.Logger) (*Server, error) {
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
	s := &Server{cfg: cfg, log: log, reg: prometheus.NewRegistry(), db: db,
		deps: deps{kafka: newDependency("kafka", log, now), nats: newDependency("nats", log, now), redis: newDependency("redis", log, now)}}
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	labelled := prometheus.WrapRegistererWith(prometheus.Labels{"aggregator": cfg.ID}, s.reg)
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
		Abuse: cfg.Penalty.abuse(),
		Log:   log.With(slog.String("component", "consume")),
	}, db, labelled)

	s.audit = audit.NewStore(db, log.With(slog.String("component", "audit")))
	mux := http.NewServeMux()
	reports.Register(mux, reports.Config{DB: db, Hasher: hasher, MaxRows: cfg.Usage.MaxRows})
	s.kafka, err = kgo.NewClient(kgo.SeedBrokers(cfg.Kafka.Brokers...), kgo.WithLogger(kafkalog.New(log)),
		kgo.MetadataMinAge(250*time.Millisecond), kgo.ProduceRequestTimeout(5*time.Second), kgo.RecordDeliveryTimeout(10*time.Second),
		kgo.RecordPartitioner(commandPartitioner(cfg.Kafka.DecisionsTopic)))
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("aggregator: kafka client: %w", err)
	}
	if s.redis, err = redisstore.NewClient(cfg.Redis.Client()); err != nil {
		s.kafka.Close()
		_ = db.Close()
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
	labelled.MustRegister(s.readyGauge())
	s.api = &http.Server{Handler: s.authorize(s.gate(mux)), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 60 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 16 << 10,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	if s.apiLn, err = net.Listen("tcp", cfg.Listen); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("aggregator: aggregator_listen: %w", err)
	}
	if cfg.MetricsListen != Off {
		mm := http.NewServeMux()
		mm.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
		mm.HandleFunc("GET /healthz", healthz)
		mm.HandleFunc("GET /readyz", s.readyz)
		s.metrics = &http.Server{Handler: mm, ReadHeaderTimeout: 5 * time.Second, WriteTimeout: 30 * time.Second,
			ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
		if s.metLn, err = net.Listen("tcp", cfg.MetricsListen); err != nil {
			_ = s.apiLn.Close()
			_ = db.Close()
			return nil, fmt.Errorf("aggregator: aggregator_metrics_listen: %w", err)
		}
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

// authorize requires a bearer token on the operator API and the reports:
// admin_token, or, with admin_insecure (no token configured), any
// non-empty one. A request without it is answered 401 and changes nothing,
// whatever its method, content type or Origin: a web page cannot make a
// browser attach an Authorization header to a cross-site request without
// a CORS preflight, which this API never grants, so no page can forge a
// change (not even a text/plain POST, which needs no preflight).
func (s *Server) authorize(next http.Handler) http.Handler {
	token := []byte(s.cfg.AdminToken)
	if len(token) == 0 {
		s.log.Warn("the operator API has NO TOKEN ("+configs.EnvName("admin_insecure")+"=true): whoever reaches its address can change the fleet's rules, lists and quotas; any bearer token is accepted",
			slog.String("aggregator_listen", s.cfg.Listen))
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := r.Header.Get("Authorization")
		const scheme = "bearer "
		var presented []byte
		if len(v) > len(scheme) && strings.EqualFold(v[:len(scheme)], scheme) {
			presented = []byte(strings.TrimSpace(v[len(scheme):]))
		}
		if len(presented) == 0 || (len(token) > 0 && subtle.ConstantTimeCompare(presented, token) != 1) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="tollgate"`)
			reports.Error(w, http.StatusUnauthorized, "UNAUTHORIZED", "a valid operator token is required: Authorization: Bearer <TOLLGATE_ADMIN_TOKEN>")
			return
		}
		next.ServeHTTP(w, r)
	})
}

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
		g.Go(func() error { return s.tailAudit(gctx) })
		if s.cfg.NATS.URL != "" {
			// After Kafka answers: seeding the rules bucket is audited
			// through it.
			g.Go(func() error { return s.connectNATS(gctx) })
			g.Go(func() error { return s.outbox.Run(gctx) })
		}
		if s.cfg.Audit.SnapshotInterval > 0 {
			g.Go(func() error { s.snapshots(gctx); return nil })
		}
		return nil
	})
	err = g.Wait()
	s.kafka.Close()
	_ = s.store.Close()
	_ = s.redis.Close()
	if cerr := s.db.Close(); cerr != nil && err == nil {
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
	s.life.Close(func() {
		_ = s.apiLn.Close()
		if s.metLn != nil {
			_ = s.metLn.Close()
		}
		s.kafka.Close()
		_ = s.store.Close()
		_ = s.redis.Close()
		_ = s.db.Close()
	})
	return nil
}

// hashedGuard is a guard for one ruleset.
type hashedGuard struct {
	hash string
	g    *guard.Guard
}

// keyGuard returns a guard with the fleet's active ruleset (the rules
// bucket, else rules_file) over the gateways' Redis, for the operator
// API's keys/{key} routes. It is rebuilt when the ruleset changes.
func (s *Server) keyGuard(ctx context.Context) (*guard.Guard, error) {
	var src []byte
	if kv := s.kv.Load(); kv != nil {
		e, _, err := kv.ActiveRules(ctx)
		if err != nil {
			return nil, err
		}
		if e != nil {
			src = []byte(e.Source)
		}
	}
	if src == nil && s.cfg.RulesFile != "" {
		b, err := os.ReadFile(s.cfg.RulesFile)
		if err != nil {
			return nil, fmt.Errorf("rules_file: %w", err)
		}
		src = b
	}
	if src == nil {
		return nil, errors.New("no ruleset: the rules bucket is empty and rules_file is not set")
	}
	rs, err := rules.Load(src)
	if err != nil {
		return nil, err
	}
	if cur := s.keyGard.Load(); cur != nil && cur.hash == rs.Hash() {
		return cur.g, nil
	}
	g, err := guard.New(s.store, []byte(s.cfg.KeySecret), rs,
		guard.WithLogger(s.log.With(slog.String("component", "guard"))))
	if err != nil {
		return nil, err
	}
	s.keyGard.Store(&hashedGuard{hash: rs.Hash(), g: g})
	return g, nil
}

// connectNATS connects to NATS, opens the KV buckets (retrying until
// JetStream answers), seeds the rules bucket from rules_file when it is
// empty, and holds the connection until ctx is done.
func (s *Server) connectNATS(ctx context.Context) error {
	log := s.log.With(slog.String("component", "nats"))
	nc, err := fleetkv.Connect(s.cfg.NATS.URL, fleetkv.Options{Name: "tollgate-aggregator-" + s.cfg.ID, Log: log})
	if err != nil {
		return fmt.Errorf("aggregator: %w", err)
	}
	defer nc.Close()
	s.nc.Store(nc)
	defer s.nc.Store(nil)
	var kv *fleetkv.KV
	for {
		octx, cancel := context.WithTimeout(ctx, 5*time.Second)
		kv, err = fleetkv.Open(octx, nc)
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		log.Warn("NATS JetStream unavailable; the control plane answers 503 until it is", slog.String("error", err.Error()))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
	if err := s.seedRules(ctx, kv); err != nil {
		log.Error("seeding the rules bucket failed", slog.String("error", err.Error()))
	}
	s.kv.Store(kv)
	log.Info("control plane ready", slog.String("nats", fleetkv.RedactURL(s.cfg.NATS.URL)))
	<-ctx.Done()
	s.kv.Store(nil)
	return nil
}

// seedRules writes rules_file as version 1 when the bucket holds no
// ruleset; a concurrent seeder's win is fine.
func (s *Server) seedRules(ctx context.Context, kv *fleetkv.KV) error {
	if s.cfg.RulesFile == "" {
		return nil
	}
	cur, _, err := kv.ActiveRules(ctx)
	if err != nil || cur != nil {
		return err
	}
	src, err := os.ReadFile(s.cfg.RulesFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if _, err := rules.Load(src); err != nil {
		return fmt.Errorf("rules_file %s: %w", s.cfg.RulesFile, err)
	}
	e := &tollgatev1.RulesEntry{Version: 1, Source: string(src), Format: "yaml", Actor: "seed:" + s.cfg.ID,
		Reason: "seeded from " + s.cfg.RulesFile, Time: time.Now().UTC()}
	if _, err := kv.PutRules(ctx, e, 0); err != nil {
		if errors.Is(err, fleetkv.ErrConflict) {
			return nil
		}
		return err
	}
	s.log.Info("rules bucket seeded", slog.String("rules_file", s.cfg.RulesFile))
	return audit.NewWriter(s.kafka, s.cfg.Kafka.AuditTopic).Write(ctx, &tollgatev1.AuditEntry{Actor: e.Actor, Kind: audit.KindRules,
		Subject: "rules", Reason: e.Reason, Version: 1, Before: []byte(`{"version":0}`), After: mustJSON(map[string]any{"version": 1})})
}

// commandPartitioner sends records of the decisions topic (lift commands)
// to the partition they name, and hashes the others' keys.
func commandPartitioner(decisions string) kgo.Partitioner {
	return kgo.BasicConsistentPartitioner(func(topic string) func(*kgo.Record, int) int {
		if topic == decisions {
			return func(r *kgo.Record, n int) int { return int(r.Partition) % n }
		}
		return kgo.StickyKeyPartitioner(nil).ForTopic(topic).Partition
	})
}

// commander writes lift commands into the decisions topic.
type commander struct {
	cl    *kgo.Client
	topic string
}

// Lift writes a KIND_PENALTY_LIFT record for keyID into partition q, with
// the decision stream's codec. A value beyond its bound, or not UTF-8, is
// refused: the partition's owner would refuse the command.
func (c commander) Lift(ctx context.Context, q int32, keyID, tenant, actor, reason string, at time.Time) error {
	for _, s := range [...]string{keyID, tenant, actor, reason} {
		if !utf8.ValidString(s) {
			return errors.New("aggregator: encode lift: a value is not UTF-8")
		}
	}
	v, corrected := tollgatev1.AppendDecision(nil, &tollgatev1.Decision[string]{Partition: q,
		TimeUnixMicros: at.UnixMicro(), Kind: tollgatev1.DecisionEvent_KIND_PENALTY_LIFT, KeyID: keyID, Tenant: tenant,
		CommandActor: actor, CommandReason: reason})
	if corrected != 0 {
		return fmt.Errorf("aggregator: encode lift: %v beyond its bound", corrected)
	}
	if err := c.cl.ProduceSync(ctx, &kgo.Record{Topic: c.topic, Partition: q, Key: []byte(tenant), Value: v}).FirstErr(); err != nil {
		return fmt.Errorf("aggregator: produce lift: %w", err)
	}
	return nil
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// tailAudit materializes the audit topic into Pebble, once the topic
// exists (the processor creates it).
func (s *Server) tailAudit(ctx context.Context) error {
	topic := s.cfg.Kafka.AuditTopic
	adminCl, err := kgo.NewClient(kgo.SeedBrokers(s.cfg.Kafka.Brokers...), kgo.WithLogger(kafkalog.New(s.log)),
		kgo.MetadataMinAge(250*time.Millisecond))
	if err != nil {
		return fmt.Errorf("aggregator: audit client: %w", err)
	}
	adm := kadm.NewClient(adminCl)
	var parts int32
	for parts == 0 {
		meta, err := adm.Metadata(ctx, topic)
		if err == nil {
			parts = int32(len(meta.Topics[topic].Partitions))
		}
		if parts > 0 {
			break
		}
		select {
		case <-ctx.Done():
			adminCl.Close()
			return nil
		case <-time.After(200 * time.Millisecond):
		}
	}
	adminCl.Close()
	offsets, err := s.audit.Offsets(topic, parts)
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.cfg.Kafka.Brokers...), kgo.WithLogger(kafkalog.New(s.log)),
		kgo.ConsumePartitions(offsets), kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords())
	if err != nil {
		return fmt.Errorf("aggregator: audit client: %w", err)
	}
	defer cl.Close()
	return s.audit.Tail(ctx, cl)
}

// snapshots writes a checkpoint of the state every snapshot_interval into
// data_dir/snapshots/<UTC time>, keeping the newest snapshot_keep.
func (s *Server) snapshots(ctx context.Context) {
	t := time.NewTicker(s.cfg.Audit.SnapshotInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if dir, err := s.Snapshot(now); err != nil {
				s.log.Error("snapshot failed", slog.String("error", err.Error()))
			} else {
				s.log.Info("snapshot written", slog.String("dir", dir))
			}
		}
	}
}

// SnapshotDir is where snapshots are written.
func (s *Server) SnapshotDir() string { return filepath.Join(s.cfg.DataDir, "snapshots") }

// Snapshot writes a consistent snapshot of the state now (named for
// now) and prunes the oldest beyond snapshot_keep; it returns its
// directory.
func (s *Server) Snapshot(now time.Time) (string, error) {
	root := s.SnapshotDir()
	if err := os.MkdirAll(root, 0o750); err != nil {
		return "", err
	}
	dir := filepath.Join(root, now.UTC().Format("20060102T150405.000000000Z"))
	if err := s.db.Checkpoint(dir); err != nil {
		return "", err
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		return dir, err
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	for len(names) > s.cfg.Audit.SnapshotKeep {
		if err := os.RemoveAll(filepath.Join(root, names[0])); err != nil {
			return dir, err
		}
		names = names[1:]
	}
	return dir, nil
}
