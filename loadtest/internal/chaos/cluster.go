package chaos

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate/tollgate/compose/redisserver"
)

// The Cluster mode: three shards, each a primary and a replica, every
// node's client port behind its proxy (the nodes announce their proxies,
// so MOVED answers and the replication links go through them too); the
// cluster bus is not proxied.
const (
	clusterShards = 3
	clusterSlots  = 16384
)

// clusterArgs make a node fail over fast and keep serving its own slots
// while another shard is down.
var clusterArgs = []string{
	"--cluster-enabled", "yes",
	"--cluster-config-file", "nodes.conf",
	"--cluster-node-timeout", "2000",
	"--cluster-require-full-coverage", "no",
	"--cluster-replica-validity-factor", "0",
}

// startCluster starts the six nodes, assigns the slots to the first
// three, joins them all, makes each of the others a replica of one, and
// waits until the cluster is whole.
func (f *fleet) startCluster(ctx context.Context) error {
	for i := range 2 * clusterShards {
		p, err := f.newProxy("redis")
		if err != nil {
			return err
		}
		args := append(slices.Clone(clusterArgs), "--cluster-announce-ip", "127.0.0.1",
			"--cluster-announce-port", strconv.Itoa(p.Port()))
		srv, err := redisserver.Start(ctx, redisserver.WithLogger(f.log), redisserver.WithArgs(args...))
		if err != nil {
			return err
		}
		p.SetTarget(srv.Addr())
		f.redisNodes = append(f.redisNodes, &redisNode{name: fmt.Sprintf("redis-%d", i+1), srv: srv, proxy: p})
	}
	per := clusterSlots / clusterShards
	for i, n := range f.redisNodes[:clusterShards] {
		cl := n.srv.Client()
		lo, hi := i*per, (i+1)*per-1
		if i == clusterShards-1 {
			hi = clusterSlots - 1
		}
		err := cl.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err()
		if err == nil {
			err = cl.ClusterAddSlotsRange(ctx, lo, hi).Err()
		}
		cl.Close()
		if err != nil {
			return fmt.Errorf("%s: slots: %w", n.name, err)
		}
	}
	first := f.redisNodes[0].srv.Client()
	defer first.Close()
	for _, n := range f.redisNodes[1:] {
		if err := first.Do(ctx, "CLUSTER", "MEET", "127.0.0.1", n.proxy.Port(), n.srv.BusPort()).Err(); err != nil {
			return fmt.Errorf("meet %s: %w", n.name, err)
		}
	}
	if err := pollUntil(ctx, 30*time.Second, func() error {
		for _, n := range f.redisNodes {
			if err := clusterOK(ctx, n, 2*clusterShards); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return err
	}
	for i, n := range f.redisNodes[clusterShards:] {
		pc := f.redisNodes[i].srv.Client()
		id, err := pc.Do(ctx, "CLUSTER", "MYID").Text()
		pc.Close()
		if err != nil {
			return err
		}
		cl := n.srv.Client()
		err = cl.Do(ctx, "CLUSTER", "REPLICATE", id).Err()
		cl.Close()
		if err != nil {
			return fmt.Errorf("%s: replicate %s: %w", n.name, f.redisNodes[i].name, err)
		}
	}
	return pollUntil(ctx, 30*time.Second, func() error { return f.redisHealthy(ctx) })
}

// clusterOK: the node answers cluster_state:ok and knows n nodes.
func clusterOK(ctx context.Context, n *redisNode, nodes int) error {
	cl := n.srv.Client()
	defer cl.Close()
	info, err := cl.ClusterInfo(ctx).Result()
	if err != nil {
		return fmt.Errorf("%s: %w", n.name, err)
	}
	if !strings.Contains(info, "cluster_state:ok") {
		return fmt.Errorf("%s: cluster state not ok", n.name)
	}
	if nodes > 0 && !strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(nodes)) {
		return fmt.Errorf("%s: does not know %d nodes yet", n.name, nodes)
	}
	return nil
}

// clusterRole is what CLUSTER NODES says of one node.
type clusterRole struct {
	node    *redisNode
	primary bool
	failed  bool
	slots   bool // owns slots
}

// clusterRoles asks a running node for every node's role.
func (f *fleet) clusterRoles(ctx context.Context) ([]clusterRole, error) {
	var lastErr error = errors.New("no redis node running")
	for _, n := range f.redisNodes {
		if n.srv.Pid() == 0 {
			continue
		}
		cl := n.srv.Client()
		out, err := cl.ClusterNodes(ctx).Result()
		cl.Close()
		if err != nil {
			lastErr = err
			continue
		}
		var roles []clusterRole
		for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
			fs := strings.Fields(line)
			if len(fs) < 8 {
				continue
			}
			addr, _, _ := strings.Cut(fs[1], "@")
			_, port, _ := strings.Cut(addr, ":")
			var node *redisNode
			for _, x := range f.redisNodes {
				if strconv.Itoa(x.proxy.Port()) == port {
					node = x
				}
			}
			if node == nil {
				continue
			}
			roles = append(roles, clusterRole{node: node, primary: strings.Contains(fs[2], "master"),
				failed: strings.Contains(fs[2], "fail"), slots: len(fs) > 8})
		}
		return roles, nil
	}
	return nil, lastErr
}

// clusterPick returns the seq-th (modulo) primary with slots, or replica,
// in name order.
func (f *fleet) clusterPick(ctx context.Context, primary bool, seq int) (*redisNode, error) {
	roles, err := f.clusterRoles(ctx)
	if err != nil {
		return nil, err
	}
	var pick []*redisNode
	for _, r := range roles {
		if r.failed || r.node.srv.Pid() == 0 {
			continue
		}
		if primary && r.primary && r.slots || !primary && !r.primary {
			pick = append(pick, r.node)
		}
	}
	if len(pick) == 0 {
		return nil, errors.New("no such node")
	}
	slices.SortFunc(pick, func(a, b *redisNode) int { return strings.Compare(a.name, b.name) })
	return pick[seq%len(pick)], nil
}

// clusterHealthy: every node runs and says the cluster is ok, each shard
// has a primary with slots and a replica with its link up.
func (f *fleet) clusterHealthy(ctx context.Context) error {
	for _, n := range f.redisNodes {
		if n.srv.Pid() == 0 {
			return fmt.Errorf("%s not running", n.name)
		}
		if err := clusterOK(ctx, n, 0); err != nil {
			return err
		}
		if err := f.nodeHealthy(ctx, n); err != nil {
			return err
		}
	}
	roles, err := f.clusterRoles(ctx)
	if err != nil {
		return err
	}
	primaries := 0
	for _, r := range roles {
		if r.primary && r.slots && !r.failed {
			primaries++
		}
	}
	if primaries != clusterShards {
		return fmt.Errorf("%d primaries with slots, want %d", primaries, clusterShards)
	}
	return nil
}
