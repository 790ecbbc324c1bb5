package chaos

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tollgate/tollgate/compose/linkproxy"
	"github.com/tollgate/tollgate/internal/service"
	"github.com/tollgate/tollgate/loadtest/internal/chaos/history"
)

// recoveryWait is how long the harness watches a part recover after a
// heal before it records the recovery as failed: the checker's bound
// plus a margin, so a slow recovery is measured rather than cut off.
const recoveryWait = 90 * time.Second

// executor applies a schedule's faults at their times, heals each after
// its length, and measures each part's recovery.
type executor struct {
	f       *fleet
	rec     *recorder
	c       *client
	missing *counters // aggregators' missing events
	dropped *counters // gateways' dropped events

	wg sync.WaitGroup // fault and recovery goroutines

	mu      sync.Mutex
	cancel  map[int]context.CancelFunc // guarded by mu; ends a fault's wait: it heals now
	busy    map[string]bool            // guarded by mu; targets with a fault in force (busyKey)
	healing bool                       // guarded by mu; healAll was called: apply nothing more
}

func newExecutor(f *fleet, rec *recorder, c *client, missing, dropped *counters) *executor {
	return &executor{f: f, rec: rec, c: c, missing: missing, dropped: dropped,
		cancel: map[int]context.CancelFunc{}, busy: map[string]bool{}}
}

// run applies plan, each fault at phaseStart + At on a goroutine of its
// own (a slow fault never delays the next), until the plan is done or ctx
// ends; faults in force are healed by healAll, to be called after run
// returned.
func (e *executor) run(ctx context.Context, phaseStart time.Time, plan []Planned) {
	t := time.NewTimer(0)
	defer t.Stop()
	for _, p := range plan {
		t.Reset(time.Until(phaseStart.Add(p.At)))
		if !service.Wait(ctx, t.C) {
			return
		}
		e.wg.Add(1)
		go func() { defer e.wg.Done(); e.start(ctx, p) }()
	}
}

// start applies p, waits p.For (or until healAll), heals it and measures
// the recovery. A fault whose target has one in force already, or that
// comes once the heal began, is recorded as not applied.
func (e *executor) start(ctx context.Context, p Planned) {
	hf := history.Fault{ID: p.ID, Kind: p.Kind, Target: p.Target, Link: p.Link, Detail: p.Detail(),
		At: p.At.Microseconds(), For: p.For.Microseconds()}
	key := busyKey(p)
	e.mu.Lock()
	switch {
	case e.healing:
		e.mu.Unlock()
		return // the phase is over
	case e.busy[key]:
		e.mu.Unlock()
		hf.Error = "not applied: its target has a fault in force"
		e.rec.fault(hf)
		e.rec.logf("fault %s: not applied: %s busy", p, key)
		return
	}
	e.busy[key] = true
	e.mu.Unlock()
	release := sync.OnceFunc(func() {
		e.mu.Lock()
		delete(e.busy, key)
		e.mu.Unlock()
	})
	defer release()

	hf.Start = now()
	heal, target, err := e.apply(ctx, p)
	if target != "" {
		hf.Target = target
	}
	if err != nil {
		hf.Error = err.Error()
		hf.Start = 0 // not applied
		e.rec.fault(hf)
		e.rec.logf("fault %s: not applied: %v", p, err)
		return
	}
	idx := e.rec.fault(hf)
	e.rec.logf("fault %s on %s", p, hf.Target)
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	e.mu.Lock()
	if e.healing {
		cancel()
	} else {
		e.cancel[p.ID] = cancel
	}
	e.mu.Unlock()
	t := time.NewTimer(p.For)
	select {
	case <-t.C:
	case <-wctx.Done():
		t.Stop()
	}
	e.mu.Lock()
	delete(e.cancel, p.ID)
	e.mu.Unlock()
	hctx := context.WithoutCancel(ctx)
	var herr error
	if heal != nil {
		herr = heal(hctx)
	}
	end := now()
	errText := ""
	if herr != nil {
		errText = herr.Error()
		end = 0
		e.rec.logf("fault #%d %s on %s: heal failed: %v", p.ID, p.Kind, hf.Target, herr)
	}
	e.rec.ended(idx, end, errText)
	release() // healed: the target may take another fault while it recovers
	if herr == nil {
		e.recover(hctx, p, hf.Target, end)
	}
}

// healAll heals every fault in force now, applies no more, and waits for
// the heals and the recovery measurements.
func (e *executor) healAll() {
	e.mu.Lock()
	e.healing = true
	for _, c := range e.cancel {
		c()
	}
	e.mu.Unlock()
	e.wg.Wait()
}

// apply does p; it returns the heal and the target it acted on (for
// redis-primary, the node that was primary).
func (e *executor) apply(ctx context.Context, p Planned) (heal func(context.Context) error, target string, err error) {
	f := e.f
	switch p.Kind {
	case KindGatewayKill, KindGatewayStop, KindGatewayRestart:
		g := f.gateway(p.Target)
		return e.procFault(ctx, p.Kind, g.proc, func() { e.scrapeGateway(ctx, g) })
	case KindAggKill, KindAggStop, KindAggRestart:
		a := f.aggregator(p.Target)
		return e.procFault(ctx, p.Kind, a.proc, func() { e.scrapeAggregator(ctx, a) })
	case KindBrokerKill, KindBrokerStop, KindBrokerRestart:
		return e.procFault(ctx, p.Kind, f.broker.proc, nil)
	case KindNATSKill, KindNATSStop, KindNATSRestart:
		return e.procFault(ctx, p.Kind, f.nats.proc, nil)
	case KindRedisKill, KindRedisStop, KindReplicaKill:
		var n *redisNode
		var err error
		if f.cfg.RedisMode == "cluster" {
			// The shard is drawn from the fault's number.
			n, err = f.clusterPick(ctx, p.Kind != KindReplicaKill, p.ID)
		} else if n, err = f.primary(ctx); err == nil && p.Kind == KindReplicaKill {
			n = f.other(n)
		}
		if err != nil {
			return nil, "", err
		}
		if p.Kind == KindRedisStop {
			if err := n.srv.Pause(); err != nil {
				return nil, "", err
			}
			return func(context.Context) error { return n.srv.Resume() }, n.name, nil
		}
		return e.redisKill(n)
	case KindSentinelKill:
		i, _ := strconv.Atoi(strings.TrimPrefix(p.Target, "sentinel-"))
		if i < 1 || i > len(f.sentinels) {
			return nil, "", fmt.Errorf("no %s", p.Target)
		}
		return e.redisKill(f.sentinels[i-1])
	default: // link faults and spool-full
		if p.Link == nil {
			return nil, "", fmt.Errorf("fault kind %q has no link", p.Kind)
		}
		return e.linkFault(p.Link, p.Fault), p.Link.Client, nil
	}
}

// procFault kills, pauses or restarts a child process; before a kill or
// a restart, scrape reads its counters one last time.
func (e *executor) procFault(ctx context.Context, kind string, pr *proc, scrape func()) (func(context.Context) error, string, error) {
	// A process still coming back from an earlier fault is waited for.
	if err := pollUntil(ctx, 5*time.Second, func() error {
		if !pr.running() || pr.isStarting() {
			return errNotRunning
		}
		return nil
	}); err != nil {
		return nil, "", err
	}
	switch {
	case strings.HasSuffix(kind, "-kill"):
		if scrape != nil {
			scrape()
		}
		if err := pr.kill(); err != nil {
			return nil, "", err
		}
		return func(ctx context.Context) error { return startAgain(ctx, pr) }, pr.name, nil
	case strings.HasSuffix(kind, "-stop"):
		if err := pr.pause(); err != nil {
			return nil, "", err
		}
		return func(context.Context) error { return pr.resume() }, pr.name, nil
	default: // restart: a graceful stop, then a start
		if scrape != nil {
			scrape()
		}
		if err := pr.stop(15 * time.Second); err != nil {
			return nil, "", err
		}
		return func(ctx context.Context) error { return startAgain(ctx, pr) }, pr.name, nil
	}
}

// startAgain starts pr, trying again for a while if it fails (its port
// briefly taken, say); the last error is returned.
func startAgain(ctx context.Context, pr *proc) error {
	var err error
	for range 5 {
		if err = pr.start(ctx); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(2 * time.Second):
		}
	}
	return err
}

// redisKill SIGKILLs a Redis node or sentinel; the heal restarts it
// (empty: Redis keeps nothing across a restart here).
func (e *executor) redisKill(n *redisNode) (func(context.Context) error, string, error) {
	n.mu.Lock()
	n.killed = true
	n.mu.Unlock()
	if err := n.srv.Kill(); err != nil {
		return nil, "", err
	}
	e.rec.proc(history.Proc{Name: n.name, Kind: history.ProcExit, Planned: true, Detail: "SIGKILL"})
	return func(ctx context.Context) error {
		if err := n.srv.Restart(ctx); err != nil {
			return err
		}
		n.mu.Lock()
		n.killed = false
		n.mu.Unlock()
		e.rec.proc(history.Proc{Name: n.name, Kind: history.ProcStart, Detail: fmt.Sprintf("pid %d", n.srv.Pid())})
		return nil
	}, n.name, nil
}

// linkFault puts fault on the client's connections to every server of
// the link's group; a Redis node or sentinel as client is cut off both
// ways (its own proxy holds every client's connections too).
func (e *executor) linkFault(l *history.Link, fault linkproxy.Fault) func(context.Context) error {
	var undo []func()
	for _, p := range e.f.proxies[l.Server] {
		p.Set(l.Client, fault)
		undo = append(undo, func() { p.Clear(l.Client) })
	}
	if n := e.f.redisByName(l.Client); n != nil {
		n.proxy.Set(linkproxy.AnyClient, fault)
		undo = append(undo, func() { n.proxy.Clear(linkproxy.AnyClient) })
	}
	return func(context.Context) error {
		for _, u := range undo {
			u()
		}
		return nil
	}
}

// scrapeAggregator reads an aggregator's missing count before it goes.
func (e *executor) scrapeAggregator(ctx context.Context, a *aggregator) {
	if err := e.missing.read(ctx, a.name, a.proc.pid(), "http://"+a.metrics+"/metrics"); err != nil {
		e.missing.markLost()
		e.rec.logf("%s: missing count not read before it went: %v", a.name, err)
	}
}

// scrapeGateway reads a gateway's dropped count before it goes.
func (e *executor) scrapeGateway(ctx context.Context, g *gateway) {
	if err := e.dropped.read(ctx, g.name, g.proc.pid(), "http://"+g.metrics+"/metrics"); err != nil {
		e.dropped.markLost()
	}
}

// recover measures how long after its heal (at healed) the part p acted
// on is ready again, and records it.
func (e *executor) recover(ctx context.Context, p Planned, target string, healed history.Micros) {
	if url := e.healthzURL(p, target); url != "" {
		e.healthz(ctx, p, target, url, healed)
	}
	check := e.recoveryCheck(p, target)
	pr := history.Probe{What: "recovery", Fault: p.ID, Kind: p.Kind, Target: target}
	ctx, cancel := context.WithTimeout(ctx, recoveryWait)
	defer cancel()
	for {
		err := check(ctx)
		if err == nil {
			pr.OK, pr.Took = true, max(0, now()-healed)
			break
		}
		pr.Detail = err.Error()
		select {
		case <-ctx.Done():
			pr.Took = now() - healed
			e.rec.probe(pr)
			e.rec.logf("fault #%d %s on %s: not recovered after %v: %s", p.ID, p.Kind, target, recoveryWait, pr.Detail)
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
	pr.Detail = ""
	e.rec.probe(pr)
}

// healthzURL is the /healthz of the gateway or aggregator p started
// again, or "".
func (e *executor) healthzURL(p Planned, target string) string {
	switch p.Kind {
	case KindGatewayKill, KindGatewayRestart:
		return "http://" + e.f.gateway(target).metrics + "/healthz"
	case KindAggKill, KindAggRestart:
		return "http://" + e.f.aggregator(target).metrics + "/healthz"
	}
	return ""
}

// healthz measures how soon a process started again answers /healthz —
// a process that runs must say so, whatever its dependencies do — and
// records what else was in force meanwhile.
func (e *executor) healthz(ctx context.Context, p Planned, target, url string, started history.Micros) {
	pr := history.Probe{What: "healthz", Fault: p.ID, Kind: p.Kind, Target: target}
	during := e.inForce()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		code, _, err := get(ctx, url)
		if err == nil && code == 200 {
			pr.OK, pr.Took = true, max(0, now()-started)
			break
		}
		pr.Detail = fmt.Sprintf("status %d %v", code, err)
		select {
		case <-ctx.Done():
			pr.Took = now() - started
			e.rec.probe(pr)
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
	if pr.Took > healthzBound.Microseconds() {
		pr.Detail = "faults in force when it started: " + during
	} else {
		pr.Detail = ""
	}
	e.rec.probe(pr)
}

// inForce names the faults in force now.
func (e *executor) inForce() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var keys []string
	for k := range e.busy {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return strings.Join(keys, ", ")
}

// recoveryCheck returns what "recovered" means for p: the part it hit
// works again (later faults elsewhere do not count against it).
func (e *executor) recoveryCheck(p Planned, target string) func(context.Context) error {
	f := e.f
	allUndegraded := func(ctx context.Context) error {
		for _, g := range f.gws {
			if err := e.undegraded(ctx, g); err != nil {
				return err
			}
		}
		return nil
	}
	switch {
	case strings.HasPrefix(p.Kind, "gw-"):
		g := f.gateway(target)
		return func(ctx context.Context) error {
			if err := f.gatewayReady(ctx, g); err != nil {
				return err
			}
			return e.undegraded(ctx, g)
		}
	case strings.HasPrefix(p.Kind, "agg-"):
		a := f.aggregator(target)
		return func(ctx context.Context) error { return f.aggReady(ctx, a) }
	case strings.HasPrefix(p.Kind, "broker-"):
		return f.brokerReady
	case strings.HasPrefix(p.Kind, "nats-"):
		return func(ctx context.Context) error {
			if err := f.natsReady(ctx); err != nil {
				return err
			}
			for _, g := range f.gws {
				if err := f.gatewayReady(ctx, g); err != nil {
					return err
				}
			}
			return nil
		}
	case p.Kind == KindRedisKill || p.Kind == KindRedisStop:
		// The primary's loss is over once every gateway decides through
		// Redis again.
		return allUndegraded
	case p.Kind == KindReplicaKill || p.Kind == KindSentinelKill:
		n := f.redisByName(target)
		return func(ctx context.Context) error { return f.nodeHealthy(ctx, n) }
	}
	l := p.Link
	switch {
	case strings.HasPrefix(l.Client, "gw"):
		g := f.gateway(l.Client)
		if l.Server == "redis" {
			return func(ctx context.Context) error { return e.undegraded(ctx, g) }
		}
		return func(ctx context.Context) error { return f.gatewayReady(ctx, g) }
	case strings.HasPrefix(l.Client, "agg"):
		a := f.aggregator(l.Client)
		return func(ctx context.Context) error { return f.aggReady(ctx, a) }
	}
	n := f.redisByName(l.Client)
	return func(ctx context.Context) error { return f.nodeHealthy(ctx, n) }
}

// undegraded peeks through g's check API: Redis decided it.
func (e *executor) undegraded(ctx context.Context, g *gateway) error {
	a := e.c.do(ctx, g, history.SurfaceCheck, e.f.key(probeKey), "/s/fw", 0)
	e.rec.answer(a)
	switch {
	case a.Status == 0:
		return fmt.Errorf("%s: no answer: %s", g.name, a.Err)
	case a.Degraded:
		return fmt.Errorf("%s answers degraded", g.name)
	case a.Status != 200 && a.Status != 429:
		return fmt.Errorf("%s answers %d", g.name, a.Status)
	}
	return nil
}

func (f *fleet) gateway(name string) *gateway {
	for _, g := range f.gws {
		if g.name == name {
			return g
		}
	}
	return f.gws[0]
}

func (f *fleet) aggregator(name string) *aggregator {
	for _, a := range f.aggs {
		if a.name == name {
			return a
		}
	}
	return f.aggs[0]
}

func (f *fleet) redisByName(name string) *redisNode {
	for _, n := range append(append([]*redisNode(nil), f.redisNodes...), f.sentinels...) {
		if n.name == name {
			return n
		}
	}
	return nil
}
