package redisserver

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/compose/internal/lifecycle"
	"github.com/tollgate/tollgate/internal/service"
)

// clusterSlots is the number of hash slots in a Redis Cluster.
const clusterSlots = 16384

// clusterArgs make a node a cluster member that fails fast in tests: a one
// second node timeout, and, because full coverage is not required, a node
// keeps serving its own slots while another shard is down.
var clusterArgs = []string{
	"--cluster-enabled", "yes",
	"--cluster-config-file", "nodes.conf",
	"--cluster-node-timeout", "1000",
	"--cluster-require-full-coverage", "no",
}

// Cluster is a Redis Cluster of primaries without replicas, each a Server.
// The caller owns it and must call Stop.
type Cluster struct {
	nodes []*Server

	stopOnce lifecycle.Once
}

// StartCluster starts n ≥ 3 redis-server processes in cluster mode (with
// --cluster-node-timeout 1000 and --cluster-require-full-coverage no, which
// opts may override through WithArgs), splits the 16384 slots evenly in
// order, joins the nodes with CLUSTER MEET (no redis-cli needed), and returns
// once every node reports cluster_state:ok, knows all n nodes and sees all
// slots assigned. opts apply to every node.
//
// A cluster is never ready sooner than about 2s after its nodes start: a
// primary waits that long (CLUSTER_WRITABLE_DELAY) before it turns its state
// to ok. ctx bounds only the start; on failure every node is stopped.
func StartCluster(ctx context.Context, n int, opts ...Option) (*Cluster, error) {
	if n < 3 {
		return nil, fmt.Errorf("redisserver: start cluster: need at least 3 primaries, got %d", n)
	}
	cfg := newConfig(opts)
	t0 := time.Now()
	nodeOpts := append([]Option{WithArgs(clusterArgs...)}, opts...)
	nodes, err := startAll(ctx, n, func(int) []Option { return nodeOpts })
	if err != nil {
		return nil, fmt.Errorf("redisserver: start cluster: %w", err)
	}
	c := &Cluster{nodes: nodes}
	ctx, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
	defer cancel()
	if err := c.create(ctx); err != nil {
		_ = c.Stop()
		return nil, fmt.Errorf("redisserver: start cluster: %w", err)
	}
	cfg.Log.Info("redis cluster ready", "addrs", c.Addrs(), "elapsed", time.Since(t0).Round(time.Millisecond))
	return c, nil
}

// startAll starts n servers concurrently; on any failure it stops the rest.
func startAll(ctx context.Context, n int, opts func(i int) []Option) ([]*Server, error) {
	nodes := make([]*Server, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { nodes[i], errs[i] = Start(ctx, opts(i)...) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		stopAll(nodes)
		return nil, err
	}
	return nodes, nil
}

// stopAll stops the non-nil servers concurrently and joins their errors.
func stopAll(servers []*Server) error {
	errs := make([]error, len(servers))
	var wg sync.WaitGroup
	for i, s := range servers {
		if s != nil {
			wg.Go(func() { errs[i] = s.Stop() })
		}
	}
	wg.Wait()
	return errors.Join(errs...)
}

// create assigns slots, sets distinct config epochs (as redis-cli --cluster
// create does, which avoids epoch-collision rounds), meets the nodes and
// waits for convergence.
func (c *Cluster) create(ctx context.Context) error {
	clients := make([]*redis.Client, len(c.nodes))
	for i, node := range c.nodes {
		clients[i] = node.Client()
		defer clients[i].Close()
	}
	per := clusterSlots / len(c.nodes)
	for i, cl := range clients {
		lo, hi := i*per, (i+1)*per-1
		if i == len(clients)-1 {
			hi = clusterSlots - 1
		}
		// NodeOf answers from the same split.
		if err := cl.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			return fmt.Errorf("node %s: set config epoch: %w", c.nodes[i].Addr(), err)
		}
		if err := cl.ClusterAddSlotsRange(ctx, lo, hi).Err(); err != nil {
			return fmt.Errorf("node %s: add slots %d-%d: %w", c.nodes[i].Addr(), lo, hi, err)
		}
	}
	for _, node := range c.nodes[1:] {
		err := clients[0].Do(ctx, "CLUSTER", "MEET", "127.0.0.1", node.Port(), node.BusPort()).Err()
		if err != nil {
			return fmt.Errorf("meet %s: %w", node.Addr(), err)
		}
	}
	err := service.Poll(ctx, 20*time.Millisecond, func() (bool, error) {
		for i, cl := range clients {
			if err := clusterNodeReady(ctx, cl, len(c.nodes)); err != nil {
				return false, fmt.Errorf("node %s: %w", c.nodes[i].Addr(), err)
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("wait for cluster_state:ok: %w", err)
	}
	return nil
}

// clusterNodeReady reports, as an error, why one node's CLUSTER INFO does not
// yet show a converged cluster of n nodes.
func clusterNodeReady(ctx context.Context, cl *redis.Client, n int) error {
	info, err := cl.ClusterInfo(ctx).Result()
	if err != nil {
		return err
	}
	fields := map[string]string{}
	for line := range strings.SplitSeq(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			fields[k] = v
		}
	}
	want := map[string]string{
		"cluster_state":          "ok",
		"cluster_slots_assigned": strconv.Itoa(clusterSlots),
		"cluster_slots_ok":       strconv.Itoa(clusterSlots),
		"cluster_known_nodes":    strconv.Itoa(n),
	}
	for k, v := range want {
		if fields[k] != v {
			return fmt.Errorf("%s:%s, want %s", k, fields[k], v)
		}
	}
	return nil
}

// NodeOf returns the index in Nodes of the primary that was given slot
// at creation (the slots are split evenly, in order; the last node takes
// the remainder). Tests use it to place a key on a chosen primary.
func (c *Cluster) NodeOf(slot int) int {
	return min(slot/(clusterSlots/len(c.nodes)), len(c.nodes)-1)
}

// Nodes returns the cluster's servers in slot order: node i holds the i-th
// range of slots. Kill, Pause or Restart one to inject a shard fault. The
// slice is a copy; the Servers are owned by the Cluster.
func (c *Cluster) Nodes() []*Server {
	return append([]*Server(nil), c.nodes...)
}

// Addrs returns the nodes' addresses in slot order.
func (c *Cluster) Addrs() []string { return addrsOf(c.nodes) }

// addrsOf returns the servers' addresses, in order.
func addrsOf(servers []*Server) []string {
	addrs := make([]string, len(servers))
	for i, s := range servers {
		addrs[i] = s.Addr()
	}
	return addrs
}

// ClusterOptions returns fresh go-redis cluster options for all nodes, with
// the short timeouts and no retries of Server.ClientOptions. MaxRedirects
// stays at go-redis's default (3), so MOVED and ASK are still followed.
func (c *Cluster) ClusterOptions() *redis.ClusterOptions {
	return testOptions(c.Addrs()...).Cluster()
}

// Client returns a new go-redis cluster client built from ClusterOptions.
// The caller closes it.
func (c *Cluster) Client() *redis.ClusterClient {
	return redis.NewClusterClient(c.ClusterOptions())
}

// Stop stops every node concurrently and removes their directories. It is
// idempotent and safe from many goroutines, like Server.Stop.
func (c *Cluster) Stop() error {
	return c.stopOnce.Do(func() error {
		if err := stopAll(c.nodes); err != nil {
			return fmt.Errorf("redisserver: stop cluster: %w", err)
		}
		return nil
	})
}
