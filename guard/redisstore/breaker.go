package redisstore

import (
	"context"
	"errors"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/guard/breaker"
)

// node is one Redis node (standalone: the server; Sentinel: the current
// primary; Cluster: one primary) with its circuit breaker.
type node struct {
	name string
	b    *breaker.Breaker
	// answered and failed count the calls the node answered (a reply, an
	// error reply included) and those that failed for want of the node,
	// since the start (Store.Outcomes).
	answered atomic.Uint64
	failed   atomic.Uint64
}

// BreakerState is a snapshot of one node's circuit breaker.
type BreakerState struct {
	// Node is the node's address ("host:port"); for a Sentinel-managed
	// primary, "sentinel:" and the master name.
	Node  string
	State breaker.State
}

// nodes holds the breakers by node. Standalone and Sentinel stores have
// one; Cluster stores create one per primary address as calls reach it.
type nodes struct {
	cfg      breaker.Config
	log      *slog.Logger
	onChange func(node string, from, to breaker.State)

	single *node // standalone and Sentinel
	// cluster: by primary address, copy-on-write under mu, so lookups take
	// no lock. unknown takes the calls whose primary cannot be found (the
	// cluster's slot map cannot be loaded).
	byAddr  atomic.Pointer[map[string]*node]
	unknown *node
	mu      sync.Mutex
}

func (ns *nodes) init(client redis.UniversalClient) {
	empty := map[string]*node{}
	ns.byAddr.Store(&empty)
	switch c := client.(type) {
	case *redis.ClusterClient:
		ns.unknown = ns.newNode("cluster")
	case *redis.Client:
		name := c.Options().Addr
		if name == "FailoverClient" {
			name = "sentinel"
		}
		ns.single = ns.newNode(name)
	default:
		ns.single = ns.newNode("redis")
	}
}

func (ns *nodes) newNode(name string) *node {
	n := &node{name: name}
	cfg := ns.cfg
	user := cfg.OnStateChange
	// What the breaker uses, defaults applied (cfg's zero OpenFor means the
	// default); set below, before any change of state.
	var openFor time.Duration
	cfg.OnStateChange = func(from, to breaker.State) {
		switch {
		case from == breaker.Closed:
			ns.log.Warn("redis circuit breaker open: checks degrade without calling this node; one probe call is let through after open_for, and each failed probe keeps it open that long again",
				"node", n.name, "open_for", openFor)
		case to == breaker.Closed:
			ns.log.Info("redis circuit breaker closed: node answers again", "node", n.name)
		default:
			ns.log.Debug("redis circuit breaker", "node", n.name, "from", from.String(), "to", to.String())
		}
		if user != nil {
			user(from, to)
		}
		if ns.onChange != nil {
			ns.onChange(n.name, from, to)
		}
	}
	b, err := breaker.New(cfg)
	if err != nil {
		// WithBreaker validated the configuration in New.
		b, _ = breaker.New(breaker.Config{OnStateChange: cfg.OnStateChange})
	}
	n.b = b
	openFor = b.Config().OpenFor
	return n
}

// forKey returns the node that holds key.
func (ns *nodes) forKey(ctx context.Context, cc *redis.ClusterClient, key string) *node {
	if ns.single != nil {
		return ns.single
	}
	// The client's slot map is cached and reloaded on MOVED (and
	// periodically); the lookup does no I/O once it is loaded.
	c, err := cc.MasterForKey(ctx, key)
	if err != nil {
		return ns.unknown
	}
	addr := c.Options().Addr
	if n := (*ns.byAddr.Load())[addr]; n != nil {
		return n
	}
	ns.mu.Lock()
	defer ns.mu.Unlock()
	cur := *ns.byAddr.Load()
	if n := cur[addr]; n != nil {
		return n
	}
	next := make(map[string]*node, len(cur)+1)
	for k, v := range cur {
		next[k] = v
	}
	n := ns.newNode(addr)
	next[addr] = n
	ns.byAddr.Store(&next)
	return n
}

// outcomes sums the nodes' answered and failed calls.
func (ns *nodes) outcomes() (answered, failed uint64) {
	if ns.single != nil {
		return ns.single.answered.Load(), ns.single.failed.Load()
	}
	for _, n := range *ns.byAddr.Load() {
		answered += n.answered.Load()
		failed += n.failed.Load()
	}
	return answered + ns.unknown.answered.Load(), failed + ns.unknown.failed.Load()
}

func (ns *nodes) states() []BreakerState {
	var out []BreakerState
	if ns.single != nil {
		return append(out, BreakerState{Node: ns.single.name, State: ns.single.b.State()})
	}
	for _, n := range *ns.byAddr.Load() {
		out = append(out, BreakerState{Node: n.name, State: n.b.State()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	if st := ns.unknown.b.State(); st != breaker.Closed {
		out = append(out, BreakerState{Node: ns.unknown.name, State: st})
	}
	return out
}

// record gives a call's outcome to n's breaker: failures are errors that
// say the node cannot answer (timeouts, refused or broken connections,
// a loading, busy or read-only node); an error reply to the script itself
// shows a live node. A call whose caller went away says nothing.
func (n *node) record(err error) {
	switch {
	case err == nil:
		n.b.Record(true)
		n.answered.Add(1)
	case errors.Is(err, context.Canceled), errors.Is(err, ErrClosed):
	case nodeFailure(err):
		n.b.Record(false)
		n.failed.Add(1)
	default:
		n.b.Record(true)
		n.answered.Add(1)
	}
}

// nodeFailure reports whether err means the node could not answer.
func nodeFailure(err error) bool {
	var re redis.Error
	if errors.As(err, &re) {
		for _, p := range unavailablePrefixes {
			if redis.HasErrorPrefix(err, p) {
				return true
			}
		}
		return false
	}
	return !errors.Is(err, ErrReply)
}

// unavailablePrefixes are the reply errors of a node that cannot decide
// now, whatever the request.
var unavailablePrefixes = []string{"LOADING", "BUSY", "MASTERDOWN", "CLUSTERDOWN", "READONLY", "TRYAGAIN", "OOM", "MISCONF"}
