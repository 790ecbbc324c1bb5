package redisserver

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/compose/internal/lifecycle"
	"github.com/tollgate/tollgate/internal/service"
)

// MasterName is the name under which the sentinels of StartSentinel
// monitor the primary.
const MasterName = "mymaster"

// sentinelCount is the number of sentinels StartSentinel runs; the quorum is
// a majority of them.
const sentinelCount = 3

// Sentinel is a primary, one replica and three sentinels monitoring the
// primary as MasterName with down-after-milliseconds 1000 and
// failover-timeout 2000, so that a SIGKILLed primary is replaced within a few
// seconds. The caller owns it and must call Stop.
type Sentinel struct {
	primary   *Server
	replica   *Server
	sentinels []*Server

	stopOnce lifecycle.Once
}

// StartSentinel starts a primary, a replica of it, and three sentinels
// (quorum 2), and returns once the replica's link is up and every sentinel
// sees the primary, the replica and the two other sentinels. opts apply to
// every process, but WithArgs only to the primary and the replica.
// ctx bounds only the start; on failure everything started is stopped.
//
// After a failover the roles move: Primary and Replica keep naming the
// processes started as such, whatever their role now. Ask the sentinels, or
// use Client, which follows the current primary.
func StartSentinel(ctx context.Context, opts ...Option) (*Sentinel, error) {
	cfg := newConfig(opts)
	t0 := time.Now()
	primary, err := Start(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("redisserver: start sentinel: primary: %w", err)
	}
	st := &Sentinel{primary: primary}
	fail := func(err error) (*Sentinel, error) {
		_ = st.Stop()
		return nil, fmt.Errorf("redisserver: start sentinel: %w", err)
	}
	replicaOpts := append(append([]Option(nil), opts...),
		WithArgs("--replicaof", "127.0.0.1", strconv.Itoa(primary.Port())))
	if st.replica, err = Start(ctx, replicaOpts...); err != nil {
		return fail(fmt.Errorf("replica: %w", err))
	}

	wctx, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
	defer cancel()
	// Sentinels learn replicas from the primary's INFO, which they read on
	// connecting and then only every 10s: start them once the link is up.
	if err := waitReplicaLink(wctx, st.replica); err != nil {
		return fail(err)
	}

	conf := fmt.Sprintf("sentinel monitor %[1]s 127.0.0.1 %[2]d %[3]d\n"+
		"sentinel down-after-milliseconds %[1]s 1000\n"+
		"sentinel failover-timeout %[1]s 2000\n"+
		"sentinel parallel-syncs %[1]s 1\n",
		MasterName, primary.Port(), sentinelCount/2+1)
	sentinelOpts := []Option{
		WithStartTimeout(cfg.StartTimeout),
		WithLogger(cfg.Log),
		WithBinary(cfg.binary),
		WithConfigFile("sentinel.conf", conf),
		WithArgs("--sentinel"),
	}
	if st.sentinels, err = startAll(ctx, sentinelCount, func(int) []Option { return sentinelOpts }); err != nil {
		return fail(fmt.Errorf("sentinels: %w", err))
	}
	if err := st.waitDiscovery(wctx); err != nil {
		return fail(err)
	}
	cfg.Log.Info("redis sentinel ready", "primary", primary.Addr(), "replica", st.replica.Addr(),
		"sentinels", st.SentinelAddrs(), "elapsed", time.Since(t0).Round(time.Millisecond))
	return st, nil
}

// waitReplicaLink waits until the replica reports master_link_status:up.
func waitReplicaLink(ctx context.Context, replica *Server) error {
	cl := replica.Client()
	defer cl.Close()
	err := service.Poll(ctx, 10*time.Millisecond, func() (bool, error) {
		info, err := cl.Info(ctx, "replication").Result()
		if err != nil {
			return false, err
		}
		if !strings.Contains(info, "master_link_status:up") {
			return false, fmt.Errorf("master_link_status not up")
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("wait for replica %s link: %w", replica.Addr(), err)
	}
	return nil
}

// waitDiscovery waits until every sentinel sees the primary with one replica
// and the other sentinels (hello messages go out every 2s).
func (st *Sentinel) waitDiscovery(ctx context.Context) error {
	clients := make([]*redis.SentinelClient, len(st.sentinels))
	for i, s := range st.sentinels {
		o := s.ClientOptions()
		clients[i] = redis.NewSentinelClient(o)
		defer clients[i].Close()
	}
	err := service.Poll(ctx, 20*time.Millisecond, func() (bool, error) {
		for i, cl := range clients {
			m, err := cl.Master(ctx, MasterName).Result()
			if err != nil {
				return false, fmt.Errorf("sentinel %s: %w", st.sentinels[i].Addr(), err)
			}
			if m["num-slaves"] != "1" || m["num-other-sentinels"] != strconv.Itoa(sentinelCount-1) ||
				m["flags"] != "master" || m["port"] != strconv.Itoa(st.primary.Port()) {
				return false, fmt.Errorf("sentinel %s: flags=%s port=%s num-slaves=%s num-other-sentinels=%s",
					st.sentinels[i].Addr(), m["flags"], m["port"], m["num-slaves"], m["num-other-sentinels"])
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("wait for sentinel discovery: %w", err)
	}
	return nil
}

// MasterName returns the name the sentinels monitor, MasterName.
func (st *Sentinel) MasterName() string { return MasterName }

// Primary returns the server started as the primary. Kill it to force a
// failover; after one it is no longer the primary (see StartSentinel).
func (st *Sentinel) Primary() *Server { return st.primary }

// Replica returns the server started as the replica.
func (st *Sentinel) Replica() *Server { return st.replica }

// Sentinels returns the three sentinel servers. The slice is a copy; the
// Servers are owned by the Sentinel.
func (st *Sentinel) Sentinels() []*Server {
	return append([]*Server(nil), st.sentinels...)
}

// SentinelAddrs returns the sentinels' addresses.
func (st *Sentinel) SentinelAddrs() []string { return addrsOf(st.sentinels) }

// FailoverOptions returns fresh go-redis failover options for MasterName
// through the sentinels, with the short timeouts and no retries of
// Server.ClientOptions; the short dial timeout matters during a failover,
// when go-redis keeps dialling the dead primary.
func (st *Sentinel) FailoverOptions() *redis.FailoverOptions {
	o := testOptions(st.SentinelAddrs()...)
	o.MasterName = MasterName
	return o.Failover()
}

// Client returns a new go-redis failover client that follows the current
// primary, built from FailoverOptions. The caller closes it.
func (st *Sentinel) Client() *redis.Client {
	return redis.NewFailoverClient(st.FailoverOptions())
}

// Stop stops the sentinels first (so they do not fail over a primary that is
// shutting down), then the replica and the primary. It is idempotent and safe
// from many goroutines, like Server.Stop.
func (st *Sentinel) Stop() error {
	return st.stopOnce.Do(func() error {
		err := errors.Join(stopAll(st.sentinels), stopAll([]*Server{st.replica, st.primary}))
		if err != nil {
			return fmt.Errorf("redisserver: stop sentinel: %w", err)
		}
		return nil
	})
}
