package chaos

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/tollgate/tollgate/compose/linkproxy"
	"github.com/tollgate/tollgate/loadtest/internal/chaos/history"
)

// Fault kinds (docs/reliability.md lists what each does).
const (
	KindGatewayKill     = "gw-kill"
	KindGatewayStop     = "gw-stop"
	KindGatewayRestart  = "gw-restart"
	KindAggKill         = "agg-kill"
	KindAggStop         = "agg-stop"
	KindAggRestart      = "agg-restart"
	KindBrokerKill      = "broker-kill"
	KindBrokerStop      = "broker-stop"
	KindBrokerRestart   = "broker-restart"
	KindNATSKill        = "nats-kill"
	KindNATSStop        = "nats-stop"
	KindNATSRestart     = "nats-restart"
	KindRedisKill       = "redis-kill"
	KindRedisStop       = "redis-stop"
	KindReplicaKill     = "replica-kill"
	KindSentinelKill    = "sentinel-kill"
	KindLinkCut         = "link-cut"
	KindLinkStall       = "link-stall"
	KindLinkLatency     = "link-latency"
	KindLinkOneWay      = "link-oneway"
	KindSpoolFull       = "spool-full"
	defaultFaultSpacing = 6 * time.Second
)

// Kinds lists every fault kind, in a fixed order (the schedule draws from
// it by index, so this order is part of what a seed means).
var Kinds = []string{
	KindGatewayKill, KindGatewayStop, KindGatewayRestart,
	KindAggKill, KindAggStop, KindAggRestart,
	KindBrokerKill, KindBrokerStop, KindBrokerRestart,
	KindNATSKill, KindNATSStop, KindNATSRestart,
	KindRedisKill, KindRedisStop, KindReplicaKill, KindSentinelKill,
	KindLinkCut, KindLinkStall, KindLinkLatency, KindLinkOneWay,
	KindSpoolFull,
}

// Shape is what the schedule needs to know of the fleet.
type Shape struct {
	Gateways, Aggregators int
	// SpoolGateway is the gateway (1-based) with a small spool budget,
	// the target of spool-full.
	SpoolGateway int
	// RedisNodes are the Redis data nodes' names; Sentinels counts the
	// sentinels (0 on Cluster: no sentinel-kill is drawn).
	RedisNodes []string
	Sentinels  int
}

// Planned is one fault of a schedule.
type Planned struct {
	ID   int
	Kind string
	// Target is the process (gw2, agg1, broker, nats, redis-primary,
	// redis-replica, sentinel-3) or, for a link, its client.
	Target string
	Link   *history.Link
	Fault  linkproxy.Fault
	// At is the offset from the start of the fault phase; For how long
	// it lasts (a kill: until the restart; a restart: 0).
	At, For time.Duration
}

// Detail describes a link fault's parameters.
func (p Planned) Detail() string {
	switch p.Fault.Mode {
	case linkproxy.Latency:
		return p.Fault.Delay.String()
	case linkproxy.OneWay:
		if p.Fault.ToServer {
			return "to the server only"
		}
		return "to the client only"
	}
	return ""
}

func (p Planned) String() string {
	s := fmt.Sprintf("#%d %s %s at +%v for %v", p.ID, p.Kind, p.Target, p.At.Round(time.Millisecond), p.For.Round(time.Millisecond))
	if p.Link != nil {
		s = fmt.Sprintf("#%d %s %s→%s at +%v for %v", p.ID, p.Kind, p.Link.Client, p.Link.Server, p.At.Round(time.Millisecond), p.For.Round(time.Millisecond))
	}
	if d := p.Detail(); d != "" {
		s += " (" + d + ")"
	}
	return s
}

// ParseKinds reads a comma-separated list of kinds ("" or "all": every
// kind); an unknown kind is an error naming the valid ones.
func ParseKinds(s string) ([]string, error) {
	if s == "" || s == "all" {
		return slices.Clone(Kinds), nil
	}
	var out []string
	for part := range strings.SplitSeq(s, ",") {
		k := strings.TrimSpace(part)
		if k == "" {
			continue
		}
		if !slices.Contains(Kinds, k) {
			return nil, fmt.Errorf("chaos: unknown fault kind %q (kinds: %s)", k, strings.Join(Kinds, ","))
		}
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("chaos: no fault kind in %q", s)
	}
	return out, nil
}

// maxConcurrent is the most faults in force at once.
const maxConcurrent = 3

// occupied is how long after its planned end a fault still occupies its
// target (and counts as in force).
const occupied = 3 * time.Second

// Plan draws a fault schedule from seed: n faults (0: one every 6 s on
// average) over the fault phase of length d, of the kinds allowed, for a
// fleet of shape. The same arguments give the same schedule. Faults start
// one after another at random gaps; at most three are in force at once,
// never two on one target, and at least one gateway stays up.
func Plan(seed uint64, d time.Duration, n int, kinds []string, shape Shape) []Planned {
	if n <= 0 {
		n = max(1, int(d/defaultFaultSpacing))
	}
	// The kinds drawn from, in Kinds order whatever order they were given.
	var allowed []string
	for _, k := range Kinds {
		if slices.Contains(kinds, k) && (k != KindSentinelKill || shape.Sentinels > 0) {
			allowed = append(allowed, k)
		}
	}
	if len(allowed) == 0 || d <= 2*time.Second {
		return nil
	}
	rng := rand.New(rand.NewPCG(seed, 0x7011_6a7e))
	gap := d / time.Duration(n)
	between := func(lo, hi time.Duration) time.Duration {
		return lo + time.Duration(rng.Int64N(int64(hi-lo)+1))
	}
	var out []Planned
	t := between(gap/4, gap)
	for len(out) < n && t < d-time.Second {
		var p Planned
		ok := false
		for range 16 {
			p = draw(rng, allowed, shape, between)
			p.At = t
			if p.For > d-t {
				p.For = d - t
			}
			if fits(out, p, shape) {
				ok = true
				break
			}
		}
		if ok {
			p.ID = len(out) + 1
			out = append(out, p)
		}
		t += between(gap/2, gap*3/2)
	}
	return out
}

// Actions of the faults on a process: a kill keeps it down, a stop
// keeps it paused, for a while; a restart takes no time.
const (
	faultRestart = iota
	faultKill
	faultStop
)

// processFaults are the faults that kill, stop or restart a process: the
// process ("gw" and "agg": a gateway or an aggregator drawn at random)
// and the action.
var processFaults = map[string]struct {
	target string
	action int
}{
	KindGatewayKill:    {"gw", faultKill},
	KindGatewayStop:    {"gw", faultStop},
	KindGatewayRestart: {"gw", faultRestart},
	KindAggKill:        {"agg", faultKill},
	KindAggStop:        {"agg", faultStop},
	KindAggRestart:     {"agg", faultRestart},
	KindBrokerKill:     {"broker", faultKill},
	KindBrokerStop:     {"broker", faultStop},
	KindBrokerRestart:  {"broker", faultRestart},
	KindNATSKill:       {"nats", faultKill},
	KindNATSStop:       {"nats", faultStop},
	KindNATSRestart:    {"nats", faultRestart},
	KindRedisKill:      {"redis-primary", faultKill},
	KindRedisStop:      {"redis-primary", faultStop},
	KindReplicaKill:    {"redis-replica", faultKill},
}

// draw picks one fault.
func draw(rng *rand.Rand, kinds []string, shape Shape, between func(lo, hi time.Duration) time.Duration) Planned {
	kind := kinds[rng.IntN(len(kinds))]
	gw := fmt.Sprintf("gw%d", 1+rng.IntN(shape.Gateways))
	agg := fmt.Sprintf("agg%d", 1+rng.IntN(shape.Aggregators))
	down := between(500*time.Millisecond, 5*time.Second)
	pause := between(500*time.Millisecond, 6*time.Second)
	p := Planned{Kind: kind}
	if f, ok := processFaults[kind]; ok {
		p.Target = cmp.Or(map[string]string{"gw": gw, "agg": agg}[f.target], f.target)
		switch f.action {
		case faultKill:
			p.For = down
		case faultStop:
			p.For = pause
		}
		return p
	}
	switch kind {
	case KindSentinelKill:
		p.Target, p.For = fmt.Sprintf("sentinel-%d", 1+rng.IntN(shape.Sentinels)), down
	case KindSpoolFull:
		c := fmt.Sprintf("gw%d", shape.SpoolGateway)
		p.Target, p.Link, p.For = c, &history.Link{Client: c, Server: "kafka"}, between(20*time.Second, 30*time.Second)
		p.Fault = linkproxy.Fault{Mode: linkproxy.Cut}
	default: // links
		p.Link = drawLink(rng, shape)
		p.Target, p.For = p.Link.Client, between(time.Second, 8*time.Second)
		switch kind {
		case KindLinkCut:
			p.Fault = linkproxy.Fault{Mode: linkproxy.Cut}
		case KindLinkStall:
			p.Fault = linkproxy.Fault{Mode: linkproxy.Stall}
		case KindLinkLatency:
			p.Fault = linkproxy.Fault{Mode: linkproxy.Latency, Delay: between(20*time.Millisecond, 200*time.Millisecond).Round(time.Millisecond)}
		case KindLinkOneWay:
			p.Fault = linkproxy.Fault{Mode: linkproxy.OneWay, ToServer: rng.IntN(2) == 0}
		}
	}
	return p
}

// sentinels is the number of sentinels of the Sentinel fleet.
const sentinels = 3

// drawLink picks a link: a gateway or an aggregator to Redis, Kafka or
// NATS; the replication link; a sentinel to the Redis nodes.
func drawLink(rng *rand.Rand, shape Shape) *history.Link {
	servers := []string{"redis", "kafka", "nats"}
	switch rng.IntN(8) {
	case 0, 1, 2, 3:
		return &history.Link{Client: fmt.Sprintf("gw%d", 1+rng.IntN(shape.Gateways)), Server: servers[rng.IntN(3)]}
	case 4, 5:
		return &history.Link{Client: fmt.Sprintf("agg%d", 1+rng.IntN(shape.Aggregators)), Server: servers[rng.IntN(3)]}
	case 6:
		return &history.Link{Client: shape.RedisNodes[rng.IntN(len(shape.RedisNodes))], Server: "redis"}
	default:
		if shape.Sentinels == 0 {
			return &history.Link{Client: shape.RedisNodes[rng.IntN(len(shape.RedisNodes))], Server: "redis"}
		}
		return &history.Link{Client: fmt.Sprintf("sentinel-%d", 1+rng.IntN(shape.Sentinels)), Server: "redis"}
	}
}

// busyKey names what a fault occupies: two faults never share one.
func busyKey(p Planned) string {
	if p.Link != nil {
		return "link " + p.Link.Client + "→" + p.Link.Server
	}
	switch p.Target {
	case "redis-primary", "redis-replica":
		return "redis" // which process is which moves with failovers
	}
	return p.Target
}

// fits reports whether p may start at p.At given the faults planned
// before it.
func fits(planned []Planned, p Planned, shape Shape) bool {
	active := 0
	gwDown := map[string]bool{}
	if strings.HasPrefix(p.Kind, "gw-") {
		gwDown[p.Target] = true
	}
	for _, q := range planned {
		// A fault occupies its target a little past its end: a process
		// killed or restarted takes a moment to start and be ready.
		end := q.At + q.For + occupied
		if end <= p.At {
			continue
		}
		active++
		if busyKey(q) == busyKey(p) {
			return false
		}
		if strings.HasPrefix(q.Kind, "gw-") {
			gwDown[q.Target] = true
		}
	}
	return active < maxConcurrent && len(gwDown) < shape.Gateways
}
