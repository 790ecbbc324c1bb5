package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tollgate/tollgate/compose/demoapi"
	"github.com/tollgate/tollgate/compose/linkproxy"
	"github.com/tollgate/tollgate/compose/redisserver"
	"github.com/tollgate/tollgate/internal/service"
	"github.com/tollgate/tollgate/loadtest/internal/chaos/history"
)

// Settings of the fleet the checker's bounds rely on (docs/reliability.md).
const (
	failureShare    = 0.25
	sessionTimeout  = 3 * time.Second
	txnTimeout      = 6 * time.Second
	spoolMemory     = 64 << 10 // the spool gateway's events.memory_bytes (the least it takes)
	spoolBudget     = 32 << 10 // and its events.spool_max_bytes
	partitions      = 6
	masterName      = "mymaster"
	sentinelDownMs  = 1000
	sentinelTimeout = 2000
)

// fleet is the soak's processes and the proxies on their links.
type fleet struct {
	cfg    Config
	dir    string
	rec    *recorder
	log    *slog.Logger
	secret string
	token  string
	rules  []history.Rule
	keys   []history.Key

	redisNodes []*redisNode // redis-a, redis-b
	sentinels  []*redisNode // sentinel-1..3
	broker     *server
	nats       *server
	aggs       []*aggregator
	gws        []*gateway

	upstream   *http.Server
	upstreamLn net.Listener
	upDone     chan struct{}

	// proxies by the group of servers they front: redis (nodes and
	// sentinels), kafka, nats.
	proxies map[string][]*linkproxy.Proxy

	owners *linkproxy.Owners

	portMu sync.Mutex
	used   map[int]bool
}

// redisNode is a redis-server (data node or sentinel) behind its proxy.
type redisNode struct {
	name  string
	srv   *redisserver.Server
	proxy *linkproxy.Proxy
	// killed: the harness killed it and has not restarted it yet.
	mu     sync.Mutex
	killed bool
}

// server is the broker or NATS: a child process behind its proxy.
type server struct {
	proc  *proc
	proxy *linkproxy.Proxy
	addr  string // where it listens
}

type aggregator struct {
	name         string
	proc         *proc
	api, metrics string
}

type gateway struct {
	name                         string
	index                        int
	proc                         *proc
	proxy, api, metrics, grpcAdr string
}

func (g *gateway) String() string { return g.name }

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// port picks a free loopback port below the ephemeral range, so that an
// outgoing connection never takes it while its process restarts.
func (f *fleet) port() (int, error) {
	f.portMu.Lock()
	defer f.portMu.Unlock()
	for range 200 {
		p := 20000 + mrand.IntN(12000)
		if f.used[p] {
			continue
		}
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		_ = ln.Close()
		f.used[p] = true
		return p, nil
	}
	return 0, errors.New("chaos: no free port between 20000 and 32000")
}

func (f *fleet) addr() (string, error) {
	p, err := f.port()
	if err != nil {
		return "", err
	}
	return "127.0.0.1:" + strconv.Itoa(p), nil
}

// newProxy opens a proxy in front of a server of group.
func (f *fleet) newProxy(group string) (*linkproxy.Proxy, error) {
	a, err := f.addr()
	if err != nil {
		return nil, err
	}
	p, err := linkproxy.Listen(a, linkproxy.WithClassifier(f.classify), linkproxy.WithLogger(f.log))
	if err != nil {
		return nil, err
	}
	f.proxies[group] = append(f.proxies[group], p)
	return p, nil
}

// classify names the process holding a connection's client end.
func (f *fleet) classify(peer, local netip.AddrPort) string {
	names := map[int]string{}
	var pids []int
	add := func(name string, pid int) {
		if pid > 0 {
			names[pid] = name
			pids = append(pids, pid)
		}
	}
	for _, g := range f.gws {
		add(g.name, g.proc.pid())
	}
	for _, a := range f.aggs {
		add(a.name, a.proc.pid())
	}
	for _, n := range append(append([]*redisNode(nil), f.redisNodes...), f.sentinels...) {
		add(n.name, n.srv.Pid())
	}
	pid, err := f.owners.Owner(peer, local, pids)
	if err != nil || pid == 0 {
		return ""
	}
	return names[pid]
}

// newFleet prepares a fleet in dir; start starts it.
func newFleet(cfg Config, dir string, rec *recorder) *fleet {
	f := &fleet{cfg: cfg, dir: dir, rec: rec, secret: "chaos-secret-" + randomHex(8), token: "chaos-admin-" + randomHex(8),
		rules: soakRules(), keys: soakKeys(), proxies: map[string][]*linkproxy.Proxy{}, used: map[int]bool{}, owners: linkproxy.NewOwners()}
	lf, err := os.OpenFile(filepath.Join(dir, "harness.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err == nil {
		f.log = slog.New(slog.NewTextHandler(lf, nil))
	} else {
		f.log = slog.New(slog.DiscardHandler)
	}
	return f
}

// start brings the fleet up in dependency order and waits until every
// part is ready: Redis and its sentinels, the broker, NATS, the
// aggregators (which create the topics and seed the rules bucket), the
// gateways (following the rules in NATS).
func (f *fleet) start(ctx context.Context) error {
	steps := []struct {
		what string
		fn   func(context.Context) error
	}{
		{"redis", f.startRedis},
		{"broker and nats", f.startServers},
		{"upstream", f.startUpstream},
		{"aggregators", f.startAggregators},
		{"gateways", f.startGateways},
	}
	for _, s := range steps {
		t0 := time.Now()
		if err := s.fn(ctx); err != nil {
			return fmt.Errorf("chaos: start %s: %w", s.what, err)
		}
		f.rec.logf("started %s in %v", s.what, time.Since(t0).Round(time.Millisecond))
	}
	return nil
}

// startRedis starts the Sentinel fleet with every link through proxies:
// the data nodes announce their proxies to the sentinels and to each
// other, the sentinels monitor the primary's proxy and announce their own.
func (f *fleet) startRedis(ctx context.Context) error {
	if f.cfg.RedisMode == "cluster" {
		return f.startCluster(ctx)
	}
	for _, name := range []string{"redis-a", "redis-b"} {
		p, err := f.newProxy("redis")
		if err != nil {
			return err
		}
		srv, err := redisserver.Start(ctx, redisserver.WithLogger(f.log),
			redisserver.WithArgs("--replica-announce-ip", "127.0.0.1", "--replica-announce-port", strconv.Itoa(p.Port())))
		if err != nil {
			return err
		}
		p.SetTarget(srv.Addr())
		f.redisNodes = append(f.redisNodes, &redisNode{name: name, srv: srv, proxy: p})
	}
	primary := f.redisNodes[0]
	cl := f.redisNodes[1].srv.Client()
	defer cl.Close()
	if err := cl.Do(ctx, "REPLICAOF", "127.0.0.1", strconv.Itoa(primary.proxy.Port())).Err(); err != nil {
		return fmt.Errorf("replicaof: %w", err)
	}
	if err := pollUntil(ctx, 15*time.Second, func() error {
		info, err := cl.Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		if !strings.Contains(info, "master_link_status:up") {
			return errors.New("replica link not up")
		}
		return nil
	}); err != nil {
		return err
	}
	for i := range sentinels {
		p, err := f.newProxy("redis")
		if err != nil {
			return err
		}
		conf := fmt.Sprintf("sentinel announce-ip 127.0.0.1\nsentinel announce-port %d\n"+
			"sentinel monitor %s 127.0.0.1 %d %d\n"+
			"sentinel down-after-milliseconds %s %d\n"+
			"sentinel failover-timeout %s %d\n"+
			"sentinel parallel-syncs %s 1\n",
			p.Port(), masterName, primary.proxy.Port(), sentinels/2+1,
			masterName, sentinelDownMs, masterName, sentinelTimeout, masterName)
		srv, err := redisserver.Start(ctx, redisserver.WithLogger(f.log),
			redisserver.WithConfigFile("sentinel.conf", conf), redisserver.WithArgs("--sentinel"))
		if err != nil {
			return err
		}
		p.SetTarget(srv.Addr())
		f.sentinels = append(f.sentinels, &redisNode{name: fmt.Sprintf("sentinel-%d", i+1), srv: srv, proxy: p})
	}
	return pollUntil(ctx, 30*time.Second, func() error {
		for _, s := range f.sentinels {
			m, err := s.sentinelMaster(ctx)
			if err != nil {
				return err
			}
			if m["num-slaves"] != "1" || m["num-other-sentinels"] != strconv.Itoa(sentinels-1) || m["flags"] != "master" {
				return fmt.Errorf("%s sees flags=%s replicas=%s other sentinels=%s", s.name, m["flags"], m["num-slaves"], m["num-other-sentinels"])
			}
		}
		return nil
	})
}

// redisAddrs are the addresses Tollgate's processes are given: the
// sentinels' proxies, or the cluster nodes'.
func (f *fleet) redisAddrs() string {
	var out []string
	nodes := f.sentinels
	if f.cfg.RedisMode == "cluster" {
		nodes = f.redisNodes
	}
	for _, s := range nodes {
		out = append(out, s.proxy.Addr())
	}
	return strings.Join(out, ",")
}

// startServers starts the broker and NATS, each a child process behind
// its proxy, on fixed ports and data directories kept across restarts.
func (f *fleet) startServers(ctx context.Context) error {
	self := f.cfg.Self
	for _, kind := range []string{"kafka", "nats"} {
		p, err := f.newProxy(kind)
		if err != nil {
			return err
		}
		listen, err := f.addr()
		if err != nil {
			return err
		}
		args := []string{ChildCommand, kind, "-listen", listen, "-dir", filepath.Join(f.dir, kind)}
		if kind == "kafka" {
			args = append(args, "-advertise", p.Addr(), "-partitions", strconv.Itoa(partitions))
		}
		name := "broker"
		if kind == "nats" {
			name = "nats"
		}
		s := &server{proxy: p, addr: listen, proc: &proc{name: name, path: self, args: args, env: baseEnv(),
			logPath: filepath.Join(f.dir, name+".log"), ready: childReady, rec: f.rec}}
		if err := s.proc.start(ctx); err != nil {
			return err
		}
		p.SetTarget(listen)
		if kind == "kafka" {
			f.broker = s
		} else {
			f.nats = s
		}
	}
	return nil
}

// startUpstream serves the demo API the gateways' proxies forward to.
func (f *fleet) startUpstream(context.Context) error {
	a, err := f.addr()
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", a)
	if err != nil {
		return err
	}
	f.upstreamLn = ln
	f.upstream = &http.Server{Handler: demoapi.Handler(), ReadHeaderTimeout: 5 * time.Second}
	f.upDone = make(chan struct{})
	go func() {
		defer close(f.upDone)
		_ = f.upstream.Serve(ln)
	}()
	return nil
}

// baseEnv is the environment of every child: the harness's, without its
// TOLLGATE_ variables (each child gets exactly the ones it needs).
func baseEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TOLLGATE_") {
			out = append(out, kv)
		}
	}
	return out
}

// commonEnv are the settings gateways and aggregators share.
func (f *fleet) commonEnv() []string {
	return []string{
		"TOLLGATE_KEY_SECRET=" + f.secret,
		"TOLLGATE_REDIS_MODE=" + f.cfg.RedisMode,
		"TOLLGATE_REDIS_ADDRS=" + f.redisAddrs(),
		"TOLLGATE_REDIS_MASTER_NAME=" + masterName,
		"TOLLGATE_KAFKA_BROKERS=" + f.broker.proxy.Addr(),
		"TOLLGATE_KAFKA_PARTITIONS=" + strconv.Itoa(partitions),
		"TOLLGATE_NATS_URL=nats://" + f.nats.proxy.Addr(),
		"TOLLGATE_RULES_FILE=" + filepath.Join(f.dir, "rules.yaml"),
		"TOLLGATE_LOG_LEVEL=info",
	}
}

func (f *fleet) startAggregators(ctx context.Context) error {
	if err := os.WriteFile(filepath.Join(f.dir, "rules.yaml"), []byte(rulesYAML(f.rules, f.keys, opsLimit)), 0o600); err != nil {
		return err
	}
	for i := range f.cfg.Aggregators {
		name := fmt.Sprintf("agg%d", i+1)
		api, err := f.addr()
		if err != nil {
			return err
		}
		met, err := f.addr()
		if err != nil {
			return err
		}
		env := append(baseEnv(), f.commonEnv()...)
		env = append(env,
			"TOLLGATE_AGGREGATOR_ID="+name,
			"TOLLGATE_DATA_DIR="+filepath.Join(f.dir, name),
			"TOLLGATE_AGGREGATOR_LISTEN="+api,
			"TOLLGATE_AGGREGATOR_METRICS_LISTEN="+met,
			"TOLLGATE_ADMIN_TOKEN="+f.token,
			"TOLLGATE_AGGREGATOR_SESSION_TIMEOUT="+sessionTimeout.String(),
			"TOLLGATE_AGGREGATOR_TRANSACTION_TIMEOUT="+txnTimeout.String(),
			"TOLLGATE_AGGREGATOR_SHUTDOWN_TIMEOUT=5s",
			"TOLLGATE_USAGE_LATENESS=2s",
			"TOLLGATE_PENALTY_WINDOW=10s",
			"TOLLGATE_PENALTY_REDUCED_FOR=5s",
			"TOLLGATE_PENALTY_COOLDOWN_FOR=5s",
			"TOLLGATE_PENALTY_BLOCK_FOR=5s",
			"TOLLGATE_PENALTY_QUIET_PERIOD=5s",
		)
		f.aggs = append(f.aggs, &aggregator{name: name, api: api, metrics: met, proc: &proc{name: name, path: filepath.Join(f.cfg.BinDir, "aggregator"),
			env: env, logPath: filepath.Join(f.dir, name+".log"), rec: f.rec}})
	}
	return startAll(ctx, f, f.aggs, func(a *aggregator) *proc { return a.proc }, f.aggReady)
}

func (f *fleet) startGateways(ctx context.Context) error {
	up := "http://" + f.upstreamLn.Addr().String()
	for i := range f.cfg.Gateways {
		name := fmt.Sprintf("gw%d", i+1)
		var addrs [4]string
		for j := range addrs {
			a, err := f.addr()
			if err != nil {
				return err
			}
			addrs[j] = a
		}
		g := &gateway{name: name, index: i + 1, proxy: addrs[0], api: addrs[1], metrics: addrs[2], grpcAdr: addrs[3]}
		env := append(baseEnv(), f.commonEnv()...)
		env = append(env,
			"TOLLGATE_GATEWAY_ID="+name,
			"TOLLGATE_DATA_DIR="+filepath.Join(f.dir, name),
			"TOLLGATE_LISTEN="+g.proxy,
			"TOLLGATE_UPSTREAM="+up,
			"TOLLGATE_API_LISTEN="+g.api,
			"TOLLGATE_METRICS_LISTEN="+g.metrics,
			"TOLLGATE_GRPC_LISTEN="+g.grpcAdr,
			"TOLLGATE_FAILURE_SHARE="+strconv.FormatFloat(failureShare, 'f', -1, 64),
			"TOLLGATE_OFFENDERS_THROTTLE=off",
			"TOLLGATE_SHUTDOWN_TIMEOUT=5s",
			"TOLLGATE_RUNTIME_MEMORY_LIMIT_MB=256",
		)
		if g.index == f.spoolGateway() {
			env = append(env, fmt.Sprintf("TOLLGATE_EVENTS_MEMORY_BYTES=%d", spoolMemory),
				fmt.Sprintf("TOLLGATE_EVENTS_SPOOL_MAX_BYTES=%d", spoolBudget))
		}
		g.proc = &proc{name: name, path: filepath.Join(f.cfg.BinDir, "gateway"), env: env,
			logPath: filepath.Join(f.dir, name+".log"), rec: f.rec}
		f.gws = append(f.gws, g)
	}
	return startAll(ctx, f, f.gws, func(g *gateway) *proc { return g.proc }, f.gatewayReady)
}

// key returns the key named name; it panics on a name the harness does
// not define (a bug).
func (f *fleet) key(name string) *history.Key {
	for i := range f.keys {
		if f.keys[i].Name == name {
			return &f.keys[i]
		}
	}
	panic("chaos: no key " + name)
}

// spoolGateway is the gateway with a small spool budget.
func (f *fleet) spoolGateway() int { return f.cfg.Gateways }

// shape is what the schedule needs of the fleet.
func (f *fleet) shape() Shape {
	s := Shape{Gateways: f.cfg.Gateways, Aggregators: f.cfg.Aggregators, SpoolGateway: f.spoolGateway(),
		RedisNodes: []string{"redis-a", "redis-b"}, Sentinels: sentinels}
	if f.cfg.RedisMode == "cluster" {
		s.RedisNodes, s.Sentinels = nil, 0
		for i := range 2 * clusterShards {
			s.RedisNodes = append(s.RedisNodes, fmt.Sprintf("redis-%d", i+1))
		}
	}
	return s
}

// stop ends everything, gateways first (they flush their events), then
// the aggregators, the broker, NATS and Redis; each stop is recorded as
// planned.
func (f *fleet) stop() {
	var wg sync.WaitGroup
	for _, g := range f.gws {
		wg.Add(1)
		go func() { defer wg.Done(); _ = g.proc.stop(10 * time.Second) }()
	}
	wg.Wait()
	for _, a := range f.aggs {
		wg.Add(1)
		go func() { defer wg.Done(); _ = a.proc.stop(10 * time.Second) }()
	}
	wg.Wait()
	for _, s := range []*server{f.broker, f.nats} {
		if s != nil {
			_ = s.proc.stop(10 * time.Second)
		}
	}
	for _, n := range append(append([]*redisNode(nil), f.sentinels...), f.redisNodes...) {
		_ = n.srv.Stop()
	}
	if f.upstream != nil {
		_ = f.upstream.Close()
		<-f.upDone
	}
	for _, ps := range f.proxies {
		for _, p := range ps {
			_ = p.Close()
		}
	}
	for _, p := range f.procs() {
		p.wait()
	}
}

// procs lists the child processes the harness runs itself.
func (f *fleet) procs() []*proc {
	var out []*proc
	for _, g := range f.gws {
		out = append(out, g.proc)
	}
	for _, a := range f.aggs {
		out = append(out, a.proc)
	}
	for _, s := range []*server{f.broker, f.nats} {
		if s != nil {
			out = append(out, s.proc)
		}
	}
	return out
}

// errGone stops a wait for a process that exited.
type errGone struct{ err error }

func (e errGone) Error() string { return e.err.Error() }

// startAll starts the process of each of ms, then waits for each in turn
// until ready says it is up (awaitReady): the processes boot side by
// side, not one after the other. A start that fails ends it; those not
// started yet are left alone, as stop leaves them.
func startAll[M any](ctx context.Context, f *fleet, ms []M, procOf func(M) *proc, ready func(context.Context, M) error) error {
	for _, m := range ms {
		if err := procOf(m).start(ctx); err != nil {
			return err
		}
	}
	for _, m := range ms {
		if err := f.awaitReady(ctx, procOf(m), func() error { return ready(ctx, m) }); err != nil {
			return err
		}
	}
	return nil
}

// awaitReady polls ready until it returns nil, for at most the start-up
// bound; it stops at once when p has exited, as waiting longer for it to
// become ready is pointless. Its error names p and its log.
func (f *fleet) awaitReady(ctx context.Context, p *proc, ready func() error) error {
	err := pollUntil(ctx, f.cfg.Startup, func() error {
		err := ready()
		if err != nil && !p.running() {
			return errGone{fmt.Errorf("%s exited: %w", p.name, err)}
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("%s: %w (log %s)", p.name, err, p.logPath)
	}
	return nil
}

// pollUntil calls cond every 50 ms (service.Poll) until it returns nil
// or errGone, ctx ends or d passes; it returns cond's last error then.
func pollUntil(ctx context.Context, d time.Duration, cond func() error) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var last error
	err := service.Poll(ctx, 50*time.Millisecond, func() (bool, error) {
		last = cond()
		return last == nil || errors.As(last, new(errGone)), last
	})
	if err != nil && ctx.Err() != nil && last != nil {
		return fmt.Errorf("%w (after %v)", last, d)
	}
	return err
}
