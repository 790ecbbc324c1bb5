package aggregator

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tollgate/tollgate/aggregator/internal/audit"
	"github.com/tollgate/tollgate/aggregator/internal/windows"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/redisstore/regionstore"
	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/internal/fleetkv"
	"github.com/tollgate/tollgate/internal/regions"
	"github.com/tollgate/tollgate/internal/regions/regionwire"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// The regions agent: when the rules list more than one region, the
// aggregator that owns partition 0 of the decisions topic (one per region:
// the consumer group already elects it) runs one loop that owns the
// region's regions.Region over the share ledger in the region's Redis and,
// when the region stands for coordinator, a regions.Coordinator. It talks
// to the other regions over core NATS (package regionwire), reads time
// from the region's Redis (the clock the gateways admit by), and counts
// demand from the decisions this instance consumes.

const (
	// regionsInbox bounds the messages waiting for the loop; beyond it
	// they are dropped (the protocol survives loss).
	regionsInbox = 4096
	// regionsAuditEvery bounds the coordinator's plan summaries in the
	// audit log to one per interval; epoch changes are always written.
	regionsAuditEvery = time.Minute
	// auditKindRegions is the audit kind of the coordinator's decisions.
	auditKindRegions = "regions"
)

// demandKey is a counter as the decision stream names it.
type demandKey struct {
	counter string
	lim     regions.Limit
}

// demandSum is what the decisions of a counter asked for since the loop
// last took it, and when the latest was made (the gateway's clock, µs; 0
// when forwarded by another instance, which does not say).
type demandSum struct{ admitted, rejected, last int64 }

// regionAgent hosts the regions protocol in the aggregator.
type regionAgent struct {
	s   *Server
	cfg regions.Config
	log *slog.Logger
	// rules is the ruleset Observe reads when it has several regions, nil
	// otherwise (the loop sets it).
	rules atomic.Pointer[rules.Ruleset]

	mu     sync.Mutex
	demand map[demandKey]demandSum

	inbox    chan *nats.Msg
	messages *prometheus.CounterVec
	epoch    prometheus.Gauge

	// The loop's own state.
	nc        *nats.Conn
	fleet     regions.Fleet
	region    *regions.Region
	coord     *regions.Coordinator
	clockAt   time.Time // local monotonic time of the last Redis TIME
	clock     int64     // Redis TIME then, µs
	lastAudit time.Time
	plans     regions.PlanStats // summed since the last audit summary
	forwarded int64             // the period of the last forward
	// seen is the highest epoch any message named, kept across the
	// region's restarts in this process: a coordinator started here
	// never reuses an epoch (a restarted agent forgets its highest).
	seen      regions.Epoch
	lastRules *rules.Ruleset // the ruleset last read
	rulesAt   time.Time      // when
	received  []string       // counters whose share a transfer raised, to announce
}

// newRegionAgent registers the agent's metrics.
func newRegionAgent(s *Server, reg prometheus.Registerer) *regionAgent {
	a := &regionAgent{s: s, cfg: regions.Config{Period: s.cfg.RegionsPeriod.Microseconds()}.WithDefaults(),
		log: s.log.With(slog.String("component", "regions")), demand: map[demandKey]demandSum{},
		inbox: make(chan *nats.Msg, regionsInbox),
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_aggregator_region_messages_total",
			Help: "Messages of the regions protocol, by direction (sent; received; refused: malformed or refused by the protocol; dropped: the loop's inbox was full, or NATS refused the send) and type (report, order, give_result, transfer, heartbeat, fenced; demand: forwarded between the instances of a region; unknown when refused undecoded).",
		}, []string{"direction", "type"}),
		epoch: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tollgate_aggregator_region_coordinator_epoch",
			Help: "The epoch of the coordinator this instance runs, 0 when it runs none (the epoch's term is epoch ÷ 256; the rest is the region's place in the rules' regions list plus one).",
		}),
	}
	reg.MustRegister(a.messages, a.epoch)
	return a
}

// regionLimit is a global rule's limit as the protocol and the share
// ledger see it: the kind of its algorithm, the rule's limit (a window's
// units or a bucket's capacity) and its window, or for a bucket the time
// an empty bucket takes to refill, rounded up to a microsecond.
func regionLimit(r *rules.Rule) (regions.Limit, bool) {
	k, err := regions.KindOf(string(r.Algorithm))
	if err != nil {
		return regions.Limit{}, false
	}
	p := r.Params
	w := p.Window
	if k == regions.Bucket {
		if p.FullDen <= 0 {
			return regions.Limit{}, false
		}
		w = (p.FullNum + p.FullDen - 1) / p.FullDen
	}
	lim := regions.Limit{Kind: k, Units: p.Limit, Window: w}
	return lim, lim.Units > 0 && lim.Window > 0
}

// observe counts one applied decision towards its counter's demand, when
// its deciding rule is a global one. It runs on the consuming goroutine:
// a map update under a lock, nothing else. A rejected decision carries no
// cost; it counts the rule's cost, else 1.
func (a *regionAgent) observe(ev *windows.Event) {
	rs := a.rules.Load()
	if rs == nil || ev.Rule == "" {
		return
	}
	r := rs.Rule(ev.Rule)
	if r == nil || r.Regions != rules.RegionsGlobal || r.Shadow || r.Block {
		return
	}
	lim, ok := regionLimit(r)
	if !ok {
		return
	}
	id := guard.CounterID{Rule: r.Tag, Scope: r.Scope}
	tenant := cmp.Or(ev.Tenant, ev.KeyID) // a key without a tenant is its own tenant
	switch r.Scope {
	case rules.ScopeKey:
		if ev.KeyID == "" {
			return // anonymous: counted per client IP, which the event does not carry
		}
		id.Tenant, id.KeyID = tenant, ev.KeyID
	case rules.ScopeTenant:
		if ev.KeyID == "" {
			return
		}
		id.Tenant = tenant
	case rules.ScopeIP:
		return
	}
	if r.ByEndpoint {
		id.Endpoint = ev.Endpoint
	}
	cost := ev.Cost
	if !ev.Allowed && cost == 0 {
		cost = max(r.Cost, 1)
	}
	k := demandKey{counter: a.s.store.CounterName(&id), lim: lim}
	a.mu.Lock()
	d := a.demand[k]
	if ev.Allowed {
		d.admitted += cost
	} else {
		d.rejected += cost
	}
	d.last = max(d.last, ev.TimeMicros)
	a.demand[k] = d
	a.mu.Unlock()
}

// takeDemand hands the demand counted since the last call to the region.
func (a *regionAgent) takeDemand() {
	a.mu.Lock()
	d := a.demand
	a.demand = make(map[demandKey]demandSum, len(d))
	a.mu.Unlock()
	if a.region == nil {
		return
	}
	for k, v := range d {
		// The decisions' time lets the region tell a demand that has
		// gone from one whose decisions are still on their way.
		if v.admitted > 0 {
			a.region.ObserveAt(k.counter, k.lim, v.admitted, true, v.last)
		}
		if v.rejected > 0 {
			a.region.ObserveAt(k.counter, k.lim, v.rejected, false, v.last)
		}
	}
}

// run is the agent's one loop; it returns when ctx is done. Every
// goroutine it starts (nats.go's) ends with the connection it closes.
func (a *regionAgent) run(ctx context.Context) error {
	me := a.s.cfg.Region
	nc, err := nats.Connect(a.s.cfg.NATS.URL, nats.Name("tollgate-aggregator-regions-"+a.s.cfg.ID),
		nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond), nats.RetryOnFailedConnect(true),
		nats.ReconnectBufSize(-1), nats.NoCallbacksAfterClientClose())
	if err != nil {
		return fmt.Errorf("aggregator: regions: connect %s: %w", fleetkv.RedactURL(a.s.cfg.NATS.URL), err)
	}
	defer nc.Close()
	a.nc = nc
	handler := func(m *nats.Msg) {
		select {
		case a.inbox <- m:
		default:
			a.messages.WithLabelValues("dropped", "unknown").Inc()
		}
	}
	for _, subj := range []string{regionwire.RegionSubject(me), regionwire.RegionsSubject, regionwire.CoordinatorsSubject,
		regionwire.DemandSubject(me)} {
		if _, err := nc.Subscribe(subj, handler); err != nil {
			return fmt.Errorf("aggregator: regions: subscribe %s: %w", subj, err)
		}
	}
	tick := time.NewTicker(time.Duration(a.cfg.Period/10) * time.Microsecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			a.stop("shutdown")
			return nil
		case m := <-a.inbox:
			switch {
			case a.region == nil:
			case m.Subject == regionwire.DemandSubject(me):
				a.merge(m.Data)
			default:
				a.handle(ctx, m.Data)
			}
		case <-tick.C:
			a.step(ctx)
		}
	}
}

// now is the region's clock: Redis TIME read at the last step, plus the
// local monotonic time since.
func (a *regionAgent) now() int64 { return a.clock + time.Since(a.clockAt).Microseconds() }

// step runs once per tick: it reads the clock, follows the ruleset and the
// leadership, feeds the demand in and ticks the region and the
// coordinator.
func (a *regionAgent) step(ctx context.Context) {
	me := a.s.cfg.Region
	// The ruleset is read once a period (a KV read); meanwhile, and when
	// it cannot be read (NATS or the rules file unavailable), the last
	// one holds.
	rs := a.lastRules
	if time.Since(a.rulesAt) >= time.Duration(a.cfg.Period)*time.Microsecond {
		if got, err := a.ruleset(ctx); err == nil {
			rs, a.lastRules, a.rulesAt = got, got, time.Now()
		}
	}
	var fleet regions.Fleet
	if rs != nil && len(rs.Regions()) > 1 && rs.HasRegion(me) {
		for _, r := range rs.Regions() {
			fleet.Members = append(fleet.Members, regions.Member{Name: r.Name, Weight: r.Weight})
		}
	}
	leader := slices.Contains(a.s.proc.Owned(), 0)
	switch {
	case len(fleet.Members) == 0:
		a.rules.Store(nil)
		a.stop("the rules list fewer than two regions, or not this one")
		return
	case !leader:
		// Count demand of the partitions this instance consumes, and
		// forward it to the instance that runs the agent.
		a.rules.Store(rs)
		a.stop("another instance of the region owns partition 0")
		a.forward(rs)
		return
	}
	a.rules.Store(rs)
	tctx, cancel := context.WithTimeout(ctx, time.Second)
	t, err := a.s.redis.Time(tctx).Result()
	cancel()
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		a.log.Debug("regions: Redis TIME failed; the region waits", slog.String("error", err.Error()))
		return
	}
	a.clock, a.clockAt = t.UnixMicro(), time.Now()
	now := a.clock
	if a.region == nil || !slices.Equal(a.fleet.Members, fleet.Members) {
		a.stop("the regions list changed")
		store, err := regionstore.New(a.s.redis, a.cfg, fleet, me, regionstore.WithKeyPrefix(a.s.cfg.Redis.KeyPrefix))
		if err == nil {
			a.region, err = regions.NewRegion(a.cfg, fleet, me, store, regions.TransportFunc(a.send), a.log, now)
		}
		if err != nil {
			a.log.Error("regions: cannot run the region's agent", slog.String("error", err.Error()))
			return
		}
		a.fleet = fleet
		a.log.Info("regions: the region's agent runs", slog.String("region", me), slog.Int("regions", len(fleet.Members)),
			slog.Duration("period", time.Duration(a.cfg.Period)*time.Microsecond))
	}
	a.takeDemand()
	if err := a.region.Tick(ctx, now); err != nil {
		a.log.Warn("regions: report failed", slog.String("error", err.Error()))
	}
	if a.coord == nil {
		if e, ok := a.region.Candidate(now); ok {
			if e <= a.seen {
				e = regions.NewEpoch(a.seen.Term()+1, e.Index())
			}
			c, err := regions.NewCoordinator(a.cfg, fleet, e, regions.TransportFunc(a.send), a.log)
			if err != nil {
				a.log.Error("regions: cannot start a coordinator", slog.String("error", err.Error()))
			} else {
				a.coord = c
				a.region.Lead(e, now)
				a.epoch.Set(float64(e))
				a.log.Info("regions: this region coordinates", slog.String("epoch", e.String()))
				a.audit(ctx, "coordinator started", e, nil)
			}
		}
	}
	if a.coord != nil {
		before := a.coord.LastPlan()
		a.coord.Tick(now)
		if p := a.coord.LastPlan(); p != before {
			a.plans.Counters += p.Counters
			a.plans.New += p.New
			a.plans.Extended += p.Extended
			a.plans.Lapsed += p.Lapsed
		}
		if a.coord.Deposed() {
			a.dropCoordinator(ctx, "deposed by a higher epoch")
		} else if time.Since(a.lastAudit) >= regionsAuditEvery && a.plans.New+a.plans.Extended+a.plans.Lapsed > 0 {
			p := a.plans
			a.audit(ctx, "plans", a.coord.Epoch(), &p)
			a.plans = regions.PlanStats{}
		}
	}
	a.announce()
}

// ruleset returns the fleet's active ruleset, as the operator API's key
// routes read it.
func (a *regionAgent) ruleset(ctx context.Context) (*rules.Ruleset, error) {
	g, err := a.s.keyGuard(ctx)
	if err != nil {
		return nil, err
	}
	return g.Rules(), nil
}

// stop drops the region's agent and coordinator, if any.
func (a *regionAgent) stop(why string) {
	if a.region == nil {
		return
	}
	if a.coord != nil {
		a.dropCoordinator(context.Background(), why)
	}
	a.region, a.fleet = nil, regions.Fleet{}
	a.log.Info("regions: the region's agent stopped", slog.String("why", why))
}

func (a *regionAgent) dropCoordinator(ctx context.Context, why string) {
	e := a.coord.Epoch()
	a.coord = nil
	a.epoch.Set(0)
	a.log.Info("regions: this region no longer coordinates", slog.String("epoch", e.String()), slog.String("why", why))
	a.audit(ctx, "coordinator stopped: "+why, e, nil)
}

// handle decodes one message and hands it to the region and, if it is
// for coordinators, the coordinator.
func (a *regionAgent) handle(ctx context.Context, b []byte) {
	_, m, err := regionwire.Decode(b, a.cfg)
	if err != nil {
		a.messages.WithLabelValues("refused", "unknown").Inc()
		a.log.Debug("regions: message refused", slog.String("error", err.Error()))
		return
	}
	typ := regions.TypeName(m)
	a.messages.WithLabelValues("received", typ).Inc()
	a.seen = max(a.seen, regions.EpochOf(m))
	now := a.now()
	switch m := m.(type) {
	case *regions.Report, *regions.GiveResult, *regions.Fenced:
		if a.coord != nil {
			if err := a.coord.Handle(m, now); err != nil {
				a.messages.WithLabelValues("refused", typ).Inc()
			}
		}
		return
	case *regions.Heartbeat:
		if a.coord != nil {
			_ = a.coord.Handle(m, now)
		}
	case *regions.Transfer:
		if m.Loan.To != a.s.cfg.Region {
			return
		}
		defer func() { a.received = append(a.received, m.Loan.Counter) }()
	}
	if err := a.region.Handle(ctx, m, now); err != nil {
		a.messages.WithLabelValues("refused", typ).Inc()
		a.log.Debug("regions: message refused", slog.String("type", typ), slog.String("error", err.Error()))
	}
}

// forward sends the demand this instance counted since the last period
// boundary to the region's agent (another instance), on the region's
// demand subject, as reports: only counters whose demand was rejected or
// above half of what the agent calls hot, so the traffic grows with hot
// counters, not keys.
func (a *regionAgent) forward(rs *rules.Ruleset) {
	k := time.Now().UnixMicro() / a.cfg.Period
	if k == a.forwarded {
		return
	}
	a.forwarded = k
	a.mu.Lock()
	d := a.demand
	a.demand = make(map[demandKey]demandSum, len(d))
	a.mu.Unlock()
	me := a.s.cfg.Region
	rep := &regions.Report{Region: me, Time: time.Now().UnixMicro()}
	flush := func() {
		if len(rep.Counters) == 0 {
			return
		}
		b, err := regionwire.Encode(me, rep)
		if err == nil {
			err = a.nc.Publish(regionwire.DemandSubject(me), b)
		}
		if err != nil {
			a.messages.WithLabelValues("dropped", "demand").Inc()
		} else {
			a.messages.WithLabelValues("sent", "demand").Inc()
		}
		rep = &regions.Report{Region: me, Time: rep.Time}
	}
	for key, v := range d {
		static := float64(rs.RegionShare(me, key.lim.Units))
		hot := static * a.cfg.HotFraction / 2 * float64(a.cfg.Period) / float64(key.lim.Window)
		if v.rejected == 0 && float64(v.admitted) <= hot {
			continue
		}
		rep.Counters = append(rep.Counters, regions.CounterReport{Counter: key.counter, Limit: key.lim,
			Demand: v.admitted + v.rejected, Rejected: v.rejected})
		if len(rep.Counters) == forwardChunk {
			flush()
		}
	}
	flush()
}

// forwardChunk bounds the counters of one forwarded demand message, well
// within NATS's maximum payload.
const forwardChunk = 1000

// merge adds demand another instance of the region forwarded.
func (a *regionAgent) merge(b []byte) {
	from, m, err := regionwire.Decode(b, a.cfg)
	rep, ok := m.(*regions.Report)
	if err != nil || !ok || from != a.s.cfg.Region {
		a.messages.WithLabelValues("refused", "demand").Inc()
		return
	}
	a.messages.WithLabelValues("received", "demand").Inc()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range rep.Counters {
		k := demandKey{counter: c.Counter, lim: c.Limit}
		d := a.demand[k]
		d.admitted += c.Demand - c.Rejected
		d.rejected += c.Rejected
		// A forward does not say when its decisions were made: as late
		// as now, so that they never look older than they are.
		d.last = max(d.last, a.now())
		a.demand[k] = d
	}
}

// announce tells the region's gateways which counters a loan landed on,
// so that their fast paths drop what they derived from the smaller share
// (the negative cache), on the subject the operator API's quota grants
// use.
func (a *regionAgent) announce() {
	if len(a.received) == 0 {
		return
	}
	names := a.received
	a.received = nil
	slices.Sort(names)
	names = slices.Compact(names)
	kv := a.s.kv.Load()
	if kv == nil {
		return
	}
	if err := kv.CountersChanged(tollgatev1.CountersLoan, "", names); err != nil {
		a.log.Debug("regions: announcing loans failed", slog.String("error", err.Error()))
	}
}

// send is the protocol's transport: encode and publish, never waiting. A
// report too large for one message (many long counter names) goes in
// parts with the same time, which the coordinator merges.
func (a *regionAgent) send(to regions.Node, m regions.Message) {
	typ := regions.TypeName(m)
	b, err := regionwire.Encode(a.s.cfg.Region, m)
	if rep, ok := m.(*regions.Report); ok && errors.Is(err, regionwire.ErrTooLarge) && len(rep.Counters) > 1 {
		half := len(rep.Counters) / 2
		first, second := *rep, *rep
		first.Counters, second.Counters = rep.Counters[:half], rep.Counters[half:]
		a.send(to, &first)
		a.send(to, &second)
		return
	}
	if err == nil {
		err = a.nc.Publish(regionwire.SubjectOf(to), b)
	}
	if err != nil {
		a.messages.WithLabelValues("dropped", typ).Inc()
		a.log.Debug("regions: send failed", slog.String("type", typ), slog.String("error", err.Error()))
		return
	}
	a.messages.WithLabelValues("sent", typ).Inc()
}

// coordinatorState is the JSON of a coordinator audit entry.
type coordinatorState struct {
	Region string `json:"region"`
	Epoch  string `json:"epoch"`
	// Plans sums the plans since the last summary: counters planned, new
	// loans ordered, extensions ordered, loans left to lapse.
	Plans *regions.PlanStats `json:"plans,omitempty"`
}

// audit appends a coordinator's decision to the audit log without
// waiting (the loop never blocks on Kafka); a failed write is logged.
func (a *regionAgent) audit(ctx context.Context, what string, e regions.Epoch, plans *regions.PlanStats) {
	a.lastAudit = time.Now()
	after, _ := json.Marshal(coordinatorState{Region: a.s.cfg.Region, Epoch: e.String(), Plans: plans})
	entry := &tollgatev1.AuditEntry{Actor: "coordinator", Kind: auditKindRegions, Subject: "regions", Reason: what, After: after}
	audit.Complete(entry, time.Now())
	rec, err := audit.Record(a.s.cfg.Kafka.AuditTopic, entry)
	if err != nil {
		a.log.Warn("regions: audit entry", slog.String("error", err.Error()))
		return
	}
	log := a.log
	a.s.kafka.Produce(context.WithoutCancel(ctx), rec, func(_ *kgo.Record, err error) {
		if err != nil {
			log.Warn("regions: audit entry not written", slog.String("reason", what), slog.String("error", err.Error()))
		}
	})
}
