package kafkabroker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/tollgate/tollgate/compose/internal/lifecycle"
	"github.com/tollgate/tollgate/compose/internal/loopback"
	"github.com/tollgate/tollgate/internal/service"
)

// Errors returned by this package; match them with errors.Is.
var (
	// ErrStopped is returned by lifecycle operations after Stop.
	ErrStopped = errors.New("kafkabroker: broker stopped")
	// ErrNotLoopback is returned by Start when WithListen names an address
	// that is not a loopback address: the broker has no authentication.
	ErrNotLoopback = loopback.ErrNotLoopback
)

const (
	// DefaultPartitions is the partition count of auto-created topics,
	// of CreateTopics asking for -1 partitions, and of seed topics.
	DefaultPartitions = 6
	// defaultListen picks a free port on 127.0.0.1.
	defaultListen = "127.0.0.1:0"
	// connCloseTimeout bounds how long Down waits for kfake to close the
	// client connections once the cluster is closed.
	connCloseTimeout = 5 * time.Second
	// minSessionTimeout lets tests use short group session timeouts.
	minSessionTimeout = 100 * time.Millisecond
	// clusterID names the cluster in metadata responses.
	clusterID = "tollgate-local"
)

// Option configures Start.
type Option = lifecycle.Option[config]

type config struct {
	lifecycle.Common
	listen        string
	dataDir       string
	partitions    int
	brokers       int
	seedTopics    []string
	brokerConfigs map[string]string
	advertised    string
	waitPorts     bool
}

// WithListen sets the address of the first broker, "host:port" with a
// loopback host; port 0 picks a free port. Other brokers (WithBrokers) get
// free ports on the same host. The listener's address is what the broker
// advertises in metadata. Default: "127.0.0.1:0"; make run uses
// "127.0.0.1:9092".
func WithListen(addr string) Option {
	return lifecycle.OptionFunc(func(c *config) { c.listen = addr })
}

// WithAdvertisedAddr makes the first broker name addr ("host:port") in
// its metadata instead of the address it listens on, so that clients,
// which connect to the brokers the metadata names, reach it through addr:
// a TCP proxy in front of it (the chaos soak puts one there to cut and
// stall the broker's links). Seed clients with addr too. Default: the
// listening address.
func WithAdvertisedAddr(addr string) Option {
	return lifecycle.OptionFunc(func(c *config) { c.advertised = addr })
}

// WithWaitForPorts makes Start wait, as Up does, while a port it was given
// is taken, within the start timeout: for a broker that starts late on a
// port chosen earlier, which another process's outgoing connection may
// hold for a moment (the kernel picks those from the same range). Default:
// a taken port fails Start at once.
func WithWaitForPorts() Option {
	return lifecycle.OptionFunc(func(c *config) { c.waitPorts = true })
}

// WithDataDir keeps the broker's state (kfake's DataDir) in dir, created if
// missing, and reloads what a previous broker left there; Stop leaves dir in
// place. Default: a new temporary directory, owned by the Broker and removed
// by Stop. Either way the data survives Down, Up and Restart.
func WithDataDir(dir string) Option {
	return lifecycle.OptionFunc(func(c *config) { c.dataDir = dir })
}

// WithPartitions sets the partition count of auto-created topics, of topics
// created with -1 partitions and of seed topics. Values below 1 are
// ignored. Default: 6 (DefaultPartitions; kfake's own default is 10).
func WithPartitions(n int) Option {
	return lifecycle.OptionFunc(func(c *config) {
		if n > 0 {
			c.partitions = n
		}
	})
}

// WithSeedTopics creates the topics, with WithPartitions partitions each,
// when the broker starts on an empty data directory; a data directory that
// already holds state is loaded as it is. Several WithSeedTopics accumulate.
// Default: none.
func WithSeedTopics(topics ...string) Option {
	topics = append([]string(nil), topics...)
	return lifecycle.OptionFunc(func(c *config) { c.seedTopics = append(c.seedTopics, topics...) })
}

// WithBrokers runs n brokers in the one cluster, each on its own port,
// sharing one process and one data directory; partition leaders are spread
// over them. Values below 1 are ignored. Default: 1 (kfake's own default is 3).
func WithBrokers(n int) Option {
	return lifecycle.OptionFunc(func(c *config) {
		if n > 0 {
			c.brokers = n
		}
	})
}

// WithBrokerConfigs sets kfake broker configs, for example
// {"log.cleaner.backoff.ms": "1000"} to compact every second. Several
// WithBrokerConfigs merge, the later winning. Default: none; the broker
// then accepts group session timeouts from 100ms
// (group.min.session.timeout.ms, see the package doc).
func WithBrokerConfigs(cfgs map[string]string) Option {
	cp := make(map[string]string, len(cfgs))
	for k, v := range cfgs {
		cp[k] = v
	}
	return lifecycle.OptionFunc(func(c *config) {
		if c.brokerConfigs == nil {
			c.brokerConfigs = make(map[string]string, len(cp))
		}
		for k, v := range cp {
			c.brokerConfigs[k] = v
		}
	})
}

// WithLogger sets the logger for lifecycle events (start, down, up, stop; one
// line each) and for kfake's own messages, mapped to slog levels (kfake logs
// every request at debug). Default: nil, which discards.
func WithLogger(log *slog.Logger) Option {
	return lifecycle.WithLogger[config](log)
}

// WithStartTimeout bounds Start and Up; Up waits for the ports to be free
// when another process holds them. The context's deadline applies too.
// Default: 15s.
func WithStartTimeout(d time.Duration) Option {
	return lifecycle.WithStartTimeout[config](d)
}

// Broker is a kfake cluster of one or more brokers on fixed loopback
// addresses. Its methods are safe for concurrent use; lifecycle operations
// (Down, Up, Restart, Stop) are serialized. The caller owns the Broker and
// must call Stop.
type Broker struct {
	cfg   config
	addrs []string // fixed at Start
	dir   lifecycle.Dir

	// life guards run, and is held for a whole lifecycle operation so
	// that Down, Up and Stop never interleave.
	life lifecycle.Guard
	run  *run // nil while down
}

// run is one life of the kfake cluster, from Start or Up to Down or Stop.
type run struct {
	cluster   *kfake.Cluster
	listeners []*trackingListener
}

// Start starts the cluster and returns once it accepts connections: kfake
// binds its listeners and loads DataDir synchronously, so there is nothing
// to poll. A taken port fails at once, with an error matching
// syscall.EADDRINUSE, unless WithWaitForPorts. ctx bounds only the start.
//
// The Broker starts no goroutine of its own. kfake runs one loop per
// cluster, one accept loop per broker and two goroutines per client
// connection; Down and Stop close them and wait until every client
// connection is closed, but kfake offers no way to wait for its loop and
// accept goroutines, which exit on their own just after.
func Start(ctx context.Context, opts ...Option) (*Broker, error) {
	cfg := lifecycle.Apply(config{listen: defaultListen, partitions: DefaultPartitions, brokers: 1}, opts)
	host, port, err := loopback.Split(cfg.listen)
	if err != nil {
		return nil, fmt.Errorf("kafkabroker: start: %w", err)
	}
	dir, err := lifecycle.MakeDir(cfg.dataDir, "tollgate-kafka-")
	if err != nil {
		return nil, fmt.Errorf("kafkabroker: start: %w", err)
	}
	b := &Broker{cfg: cfg, dir: dir, life: lifecycle.Guard{Name: "kafkabroker", ErrStopped: ErrStopped}}
	t0 := time.Now()
	addrs := make([]string, cfg.brokers)
	addrs[0] = net.JoinHostPort(host, strconv.Itoa(port))
	for i := 1; i < len(addrs); i++ {
		addrs[i] = net.JoinHostPort(host, "0")
	}
	b.life.Lock()
	defer b.life.Unlock()
	if err := b.up(ctx, addrs, cfg.waitPorts); err != nil {
		_ = b.dir.Remove()
		return nil, fmt.Errorf("kafkabroker: start: %w", err)
	}
	b.addrs = make([]string, len(b.run.listeners))
	for i, l := range b.run.listeners {
		b.addrs[i] = l.Addr().String()
	}
	b.cfg.Log.Info("kafka broker started", "addrs", b.addrs, "data_dir", b.dir.Path,
		"elapsed", time.Since(t0).Round(time.Microsecond))
	return b, nil
}

// up binds addrs, with retry polling while a port is in use, and starts
// kfake on the listeners. b.life must be held.
func (b *Broker) up(ctx context.Context, addrs []string, retry bool) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.StartTimeout)
	defer cancel()
	listeners, err := listenAll(ctx, addrs, retry)
	if err != nil {
		return err
	}
	var advertised net.Addr
	if b.cfg.advertised != "" {
		a, err := net.ResolveTCPAddr("tcp", b.cfg.advertised)
		if err != nil {
			for _, l := range listeners {
				_ = l.Close()
			}
			return fmt.Errorf("advertised address: %w", err)
		}
		advertised = a
	}
	next := 0
	listenFn := func(network, address string) (net.Listener, error) {
		if next < len(listeners) {
			next++
			if next == 1 && advertised != nil {
				return advertisedListener{listeners[0], advertised}, nil
			}
			return listeners[next-1], nil
		}
		return net.Listen(network, address) // kfake's AddNode
	}
	opts := []kfake.Opt{
		kfake.NumBrokers(len(listeners)),
		kfake.ListenFn(listenFn),
		kfake.DataDir(b.dir.Path),
		kfake.ClusterID(clusterID),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(b.cfg.partitions),
		kfake.GroupMinSessionTimeout(minSessionTimeout), // group.min.session.timeout.ms overrides it
		kfake.WithLogger(slogAdapter{b.cfg.Log}),
	}
	if len(b.cfg.brokerConfigs) > 0 {
		opts = append(opts, kfake.BrokerConfigs(b.cfg.brokerConfigs))
	}
	if len(b.cfg.seedTopics) > 0 {
		opts = append(opts, kfake.SeedTopics(int32(b.cfg.partitions), b.cfg.seedTopics...))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		for _, l := range listeners {
			_ = l.Close() // kfake closed those it took; closing twice is harmless
		}
		return fmt.Errorf("kfake: %w", err)
	}
	b.run = &run{cluster: c, listeners: listeners}
	return nil
}

// listenAll binds every address, with retry polling while one is in use
// (by another process) until ctx ends. On failure none is left open.
func listenAll(ctx context.Context, addrs []string, retry bool) ([]*trackingListener, error) {
	out := make([]*trackingListener, 0, len(addrs))
	closeAll := func() {
		for _, l := range out {
			_ = l.Close()
		}
	}
	for _, addr := range addrs {
		l, err := listen(ctx, addr, retry)
		if err != nil {
			closeAll()
			return nil, err
		}
		out = append(out, newTrackingListener(l))
	}
	return out, nil
}

func listen(ctx context.Context, addr string, retry bool) (net.Listener, error) {
	var lc net.ListenConfig
	var l net.Listener
	err := service.Poll(ctx, 10*time.Millisecond, func() (bool, error) {
		var err error
		l, err = lc.Listen(ctx, "tcp", addr)
		return err == nil || !retry || !errors.Is(err, syscall.EADDRINUSE), err
	})
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	return l, nil
}

// Addr returns the first broker's address, "127.0.0.1:port", for
// kgo.SeedBrokers. It does not change across Down, Up and Restart.
func (b *Broker) Addr() string { return b.addrs[0] }

// Addrs returns every broker's address, in node id order. The slice is a
// copy. The addresses do not change across Down, Up and Restart.
func (b *Broker) Addrs() []string { return append([]string(nil), b.addrs...) }

// DataDir returns the directory that holds the broker's state.
func (b *Broker) DataDir() string { return b.dir.Path }

// Cluster returns the running kfake cluster, for its fault injection
// (ControlKey, Compact, MoveTopicPartition…), or nil while the broker is
// down. Up creates a new cluster, so do not keep the value across Down.
// Do not Close it; call Down or Stop.
func (b *Broker) Cluster() *kfake.Cluster {
	b.life.Lock()
	defer b.life.Unlock()
	if b.run == nil {
		return nil
	}
	return b.run.cluster
}

// Down shuts the cluster down cleanly and keeps it down until Up: its
// state is written to DataDir, its listeners are closed (a client's dial is
// refused), and Down returns once kfake has closed every client connection,
// so clients see the outage. Down on a broker that is down does nothing.
func (b *Broker) Down() error {
	return b.life.Do("down", func() error {
		if err := b.down(); err != nil {
			return fmt.Errorf("kafkabroker: down: %w", err)
		}
		b.cfg.Log.Info("kafka broker down", "addrs", b.addrs)
		return nil
	})
}

// down closes the current run, if any. b.life must be held.
func (b *Broker) down() error {
	r := b.run
	if r == nil {
		return nil
	}
	b.run = nil
	r.cluster.Close()
	deadline := time.NewTimer(connCloseTimeout)
	defer deadline.Stop()
	for _, l := range r.listeners {
		select {
		case <-l.idle():
		case <-deadline.C:
			return fmt.Errorf("client connections still open %v after close", connCloseTimeout)
		}
	}
	return nil
}

// Up starts the cluster again on the same addresses with the same data
// directory, waiting (within the start timeout and ctx) while a port is
// still taken. Up on a running broker does nothing. ctx bounds only the
// start.
func (b *Broker) Up(ctx context.Context) error {
	return b.life.Do("up", func() error {
		if b.run != nil {
			return nil
		}
		t0 := time.Now()
		if err := b.up(ctx, b.addrs, true); err != nil {
			return fmt.Errorf("kafkabroker: up: %w", err)
		}
		b.cfg.Log.Info("kafka broker up", "addrs", b.addrs, "elapsed", time.Since(t0).Round(time.Microsecond))
		return nil
	})
}

// Restart is Down followed by Up: a broker bounce that clients ride
// through by reconnecting.
func (b *Broker) Restart(ctx context.Context) error {
	return b.life.Do("restart", func() error {
		t0 := time.Now()
		if err := b.down(); err != nil {
			return fmt.Errorf("kafkabroker: restart: %w", err)
		}
		if err := b.up(ctx, b.addrs, true); err != nil {
			return fmt.Errorf("kafkabroker: restart: %w", err)
		}
		b.cfg.Log.Info("kafka broker restarted", "addrs", b.addrs, "elapsed", time.Since(t0).Round(time.Microsecond))
		return nil
	})
}

// Stop shuts the cluster down as Down does and removes the data directory
// if the Broker created it. Stop is idempotent and safe from many
// goroutines: every call returns after the first has finished, with its
// result. After Stop the other lifecycle methods return ErrStopped.
func (b *Broker) Stop() error {
	return b.life.Stop(func() error {
		if err := errors.Join(b.down(), b.dir.Remove()); err != nil {
			return fmt.Errorf("kafkabroker: stop: %w", err)
		}
		b.cfg.Log.Info("kafka broker stopped", "addrs", b.addrs)
		return nil
	})
}
