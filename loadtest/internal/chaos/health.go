package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tollgate/tollgate/internal/promtext"
)

// probeClient is the harness's own HTTP client for health and metrics.
var probeClient = &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 4}}

// get fetches url and returns its status and body (at most 64 KiB).
func get(ctx context.Context, url string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := probeClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, b, err
}

// aggReady: the aggregator's /readyz answers 200 (state restored).
func (f *fleet) aggReady(ctx context.Context, a *aggregator) error {
	if !a.proc.running() {
		return fmt.Errorf("%s not running", a.name)
	}
	code, body, err := get(ctx, "http://"+a.metrics+"/readyz")
	if err != nil {
		return err
	}
	if code != 200 {
		return fmt.Errorf("%s /readyz %d: %s", a.name, code, strings.TrimSpace(string(body)))
	}
	return nil
}

// gatewayReadiness is what the harness reads of a gateway's /readyz.
type gatewayReadiness struct {
	Status string `json:"status"`
	Rules  struct {
		Source  string `json:"source"`
		Version int64  `json:"version"`
	} `json:"rules"`
	Redis struct {
		Status string `json:"status"`
	} `json:"redis"`
	NATS *struct {
		Status string `json:"status"`
		Synced bool   `json:"synced"`
	} `json:"nats"`
}

// gatewayReady: /readyz answers 200, the rules come from NATS, NATS is
// connected and Redis answers.
func (f *fleet) gatewayReady(ctx context.Context, g *gateway) error {
	r, err := f.readiness(ctx, g)
	if err != nil {
		return err
	}
	switch {
	case r.Rules.Source != "nats":
		return fmt.Errorf("%s follows rules from %q", g.name, r.Rules.Source)
	case r.NATS == nil || r.NATS.Status != "connected" || !r.NATS.Synced:
		return fmt.Errorf("%s: nats not connected and synced", g.name)
	case r.Redis.Status != "ok":
		return fmt.Errorf("%s: redis %s", g.name, r.Redis.Status)
	}
	return nil
}

func (f *fleet) readiness(ctx context.Context, g *gateway) (*gatewayReadiness, error) {
	if !g.proc.running() {
		return nil, fmt.Errorf("%s not running", g.name)
	}
	code, body, err := get(ctx, "http://"+g.metrics+"/readyz")
	if err != nil {
		return nil, err
	}
	if code != 200 {
		return nil, fmt.Errorf("%s /readyz %d", g.name, code)
	}
	var r gatewayReadiness
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("%s /readyz: %w", g.name, err)
	}
	return &r, nil
}

// liveSentinel returns a client of a running sentinel, on its own port.
func (f *fleet) liveSentinel() (*redis.SentinelClient, error) {
	for _, s := range f.sentinels {
		if s.srv.Pid() != 0 {
			return redis.NewSentinelClient(s.srv.ClientOptions()), nil
		}
	}
	return nil, errors.New("no sentinel running")
}

// sentinelMaster asks sentinel n what it knows of the primary (SENTINEL
// MASTER: its flags, port, replicas, the other sentinels).
func (n *redisNode) sentinelMaster(ctx context.Context) (map[string]string, error) {
	sc := redis.NewSentinelClient(n.srv.ClientOptions())
	defer sc.Close()
	m, err := sc.Master(ctx, masterName).Result()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", n.name, err)
	}
	return m, nil
}

// replication returns what data node n says of its replication (INFO
// replication: its role, its link to the primary).
func (n *redisNode) replication(ctx context.Context) (string, error) {
	cl := n.srv.Client()
	defer cl.Close()
	info, err := cl.Info(ctx, "replication").Result()
	if err != nil {
		return "", fmt.Errorf("%s: %w", n.name, err)
	}
	return info, nil
}

// primary returns the data node the sentinels name as primary.
func (f *fleet) primary(ctx context.Context) (*redisNode, error) {
	sc, err := f.liveSentinel()
	if err != nil {
		return nil, err
	}
	defer sc.Close()
	addr, err := sc.GetMasterAddrByName(ctx, masterName).Result()
	if err != nil {
		return nil, err
	}
	if len(addr) != 2 {
		return nil, fmt.Errorf("sentinel names %v", addr)
	}
	for _, n := range f.redisNodes {
		if strconv.Itoa(n.proxy.Port()) == addr[1] {
			return n, nil
		}
	}
	return nil, fmt.Errorf("sentinel names %v, which is no node's proxy", addr)
}

// other returns the data node that is not n.
func (f *fleet) other(n *redisNode) *redisNode {
	if f.redisNodes[0] == n {
		return f.redisNodes[1]
	}
	return f.redisNodes[0]
}

// redisHealthy: every node and sentinel runs, the node the sentinels name
// is a primary, the other one its replica with its link up, and every
// sentinel sees the others.
func (f *fleet) redisHealthy(ctx context.Context) error {
	if f.cfg.RedisMode == "cluster" {
		return f.clusterHealthy(ctx)
	}
	for _, n := range append(append([]*redisNode(nil), f.redisNodes...), f.sentinels...) {
		if n.srv.Pid() == 0 {
			return fmt.Errorf("%s not running", n.name)
		}
	}
	p, err := f.primary(ctx)
	if err != nil {
		return err
	}
	pc := p.srv.Client()
	defer pc.Close()
	role, err := pc.Do(ctx, "ROLE").Slice()
	if err != nil {
		return fmt.Errorf("%s: %w", p.name, err)
	}
	if len(role) == 0 || role[0] != "master" {
		return fmt.Errorf("%s named primary is a %v", p.name, role[0])
	}
	info, err := f.other(p).replication(ctx)
	if err != nil {
		return err
	}
	if !strings.Contains(info, "master_link_status:up") || !strings.Contains(info, "master_port:"+strconv.Itoa(p.proxy.Port())) {
		return fmt.Errorf("%s is not a replica of %s with its link up", f.other(p).name, p.name)
	}
	for _, s := range f.sentinels {
		m, err := s.sentinelMaster(ctx)
		if err != nil {
			return err
		}
		if m["flags"] != "master" || m["num-other-sentinels"] != strconv.Itoa(sentinels-1) || m["port"] != strconv.Itoa(p.proxy.Port()) {
			return fmt.Errorf("%s sees flags=%s port=%s other sentinels=%s", s.name, m["flags"], m["port"], m["num-other-sentinels"])
		}
	}
	return nil
}

// nodeHealthy: a data node runs and is the primary the sentinels name or
// a replica with its link up; a sentinel runs and names a primary.
func (f *fleet) nodeHealthy(ctx context.Context, n *redisNode) error {
	if n == nil {
		return errors.New("no such redis process")
	}
	if n.srv.Pid() == 0 {
		return fmt.Errorf("%s not running", n.name)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if strings.HasPrefix(n.name, "sentinel-") {
		sc := redis.NewSentinelClient(n.srv.ClientOptions())
		defer sc.Close()
		if _, err := sc.GetMasterAddrByName(ctx, masterName).Result(); err != nil {
			return fmt.Errorf("%s: %w", n.name, err)
		}
		return nil
	}
	info, err := n.replication(ctx)
	if err != nil {
		return err
	}
	if strings.Contains(info, "role:slave") {
		if !strings.Contains(info, "master_link_status:up") {
			return fmt.Errorf("%s: replica with its link down", n.name)
		}
		return nil
	}
	if f.cfg.RedisMode == "cluster" {
		return clusterOK(ctx, n, 0)
	}
	p, err := f.primary(ctx)
	if err != nil {
		return err
	}
	if p != n {
		return fmt.Errorf("%s is a primary the sentinels do not name (yet)", n.name)
	}
	return nil
}

// brokerReady: the broker answers a metadata request on its own port.
func (f *fleet) brokerReady(ctx context.Context) error {
	if !f.broker.proc.running() || f.broker.proc.isPaused() {
		return errors.New("broker not running")
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(f.broker.addr), kgo.DialTimeout(time.Second), kgo.RequestTimeoutOverhead(time.Second))
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	_, err = kadm.NewClient(cl).BrokerMetadata(ctx)
	return err
}

// natsReady: NATS answers a JetStream request on its own port.
func (f *fleet) natsReady(ctx context.Context) error {
	if !f.nats.proc.running() || f.nats.proc.isPaused() {
		return errors.New("nats not running")
	}
	nc, err := nats.Connect("nats://"+f.nats.addr, nats.Timeout(time.Second), nats.NoReconnect())
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := nc.JetStream(nats.MaxWait(2 * time.Second))
	if err != nil {
		return err
	}
	_, err = js.AccountInfo()
	return err
}

// counters follows a counter of the processes of one kind across their
// lives: each new pid starts from zero, the last value each life showed
// is kept.
type counters struct {
	metric string
	mu     sync.Mutex
	banked float64              // guarded by mu; the last values of ended lives
	cur    map[string]lifeCount // guarded by mu; by process name
	// lost: a life ended without its last value being read (its
	// count may be short).
	lost bool // guarded by mu
}

// lifeCount is the counter's value in one life of a process.
type lifeCount struct {
	pid   int
	value float64
}

func newCounters(metric string) *counters {
	return &counters{metric: metric, cur: map[string]lifeCount{}}
}

// markLost records that a life ended unread.
func (c *counters) markLost() {
	c.mu.Lock()
	c.lost = true
	c.mu.Unlock()
}

// complete reports whether every life's last value was read.
func (c *counters) complete() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.lost
}

// read scrapes url for process name at pid.
func (c *counters) read(ctx context.Context, name string, pid int, url string) error {
	if pid == 0 {
		return errors.New("not running")
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	ss, err := promtext.Get(ctx, probeClient, url)
	if err != nil {
		return err
	}
	v := ss.Sum(c.metric)
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.cur[name]
	if l.pid != pid {
		c.banked += l.value
		l = lifeCount{pid: pid}
	}
	l.value = max(l.value, v)
	c.cur[name] = l
	return nil
}

// total is the sum over every life.
func (c *counters) total() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.banked
	for _, l := range c.cur {
		t += l.value
	}
	return t
}
