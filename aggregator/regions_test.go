package aggregator_test

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/aggregator"
	"github.com/tollgate/tollgate/compose/natsserver"
	"github.com/tollgate/tollgate/compose/natsserver/natstest"
	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/redisstore"
	"github.com/tollgate/tollgate/guard/redisstore/regionstore"
	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/internal/promtest"
	"github.com/tollgate/tollgate/internal/regions"
	"github.com/tollgate/tollgate/internal/testwait"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// regionsPeriod is the test fleets' period: the shortest the skew bound
// allows is above 400ms.
const regionsPeriod = 500 * time.Millisecond

// regionsRules is a global token bucket of 100 (refilled in a minute)
// split between the regions.
func regionsRules(names ...string) string {
	var b strings.Builder
	b.WriteString("regions:\n")
	for _, n := range names {
		fmt.Fprintf(&b, "  - name: %s\n", n)
	}
	b.WriteString(`rules:
  - id: g
    algorithm: token_bucket
    capacity: 100
    rate: 100/1m
    regions: global
`)
	return b.String()
}

// region is one region of a test fleet: its Redis, NATS (linked to the
// others), Kafka, aggregator and a gateway's producer.
type region struct {
	name  string
	nats  *natsserver.Server
	redis redis.UniversalClient
	agg   *instance
	gw    *gateway
	store *regionstore.Store
	cfg   aggregator.Config
}

// regionFleet is a fleet of regions running one global rule.
type regionFleet struct {
	regions []*region
	nats    []*natsserver.Server
	counter string // the test key's counter of rule g
	tag     string // rule g's tag
	lim     regions.Limit
	static  int64 // each region's static share
}

const (
	regionsTenant = "t-regions"
	regionsKey    = "kid-regions"
)

// startRegionFleet starts one region per name, each with its own
// redis-server, NATS (linked hub and spoke, the first the hub), Kafka
// and aggregator, all running regionsRules.
func startRegionFleet(t *testing.T, names ...string) *regionFleet {
	t.Helper()
	src := regionsRules(names...)
	file := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(file, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	rs, err := rules.Load([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	r := rs.Rule("g")
	f := &regionFleet{nats: natstest.StartRegionsTB(t, names),
		lim: regions.Limit{Kind: regions.Bucket, Units: 100, Window: 60_000_000}}
	f.static = rs.RegionShare(names[len(names)-1], 100)
	f.tag = r.Tag
	cfg := regions.Config{Period: regionsPeriod.Microseconds()}.WithDefaults()
	fleet := regions.EqualFleet(names...)
	for i, name := range names {
		rd := redistest.StartTB(t)
		client := redis.NewClient(&redis.Options{Addr: rd.Addr()})
		t.Cleanup(func() { _ = client.Close() })
		store, err := regionstore.New(client, cfg, fleet, name)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			// The counter's name as the gateways' guard (and the
			// aggregator) name it.
			f.counter = redisstore.New(client).CounterName(&guard.CounterID{Rule: r.Tag, Scope: rules.ScopeKey,
				Tenant: regionsTenant, KeyID: regionsKey})
		}
		brokers := startKafka(t)
		c := testConfig(brokers, "agg-"+name, t.TempDir())
		c.Region = name
		c.RegionsPeriod = regionsPeriod
		c.RulesFile = file
		c.NATS.URL = f.nats[i].ClientURL()
		c.Redis.Addrs = []string{rd.Addr()}
		f.regions = append(f.regions, &region{name: name, nats: f.nats[i], redis: client, store: store, cfg: c,
			agg: runAggregator(t, c), gw: newGateway(t, brokers, "gw-"+name, 1)})
	}
	return f
}

// demand emits n rejected decisions of the test key in region r, as a
// gateway far above its share does.
func (f *regionFleet) demand(t *testing.T, r *region, n int) { keyDemand(t, r, regionsKey, n, false) }

// keyDemand emits n decisions of rule g for key in region r.
func keyDemand(t *testing.T, r *region, key string, n int, allowed bool) {
	tenantDemand(t, r, regionsTenant, key, n, allowed)
}

// tenantDemand emits n decisions of rule g for tenant's key in region r.
func tenantDemand(t *testing.T, r *region, tenant, key string, n int, allowed bool) {
	for range n {
		r.gw.send(t, &tollgatev1.DecisionEvent{TimeUnixMicros: time.Now().UnixMicro(), Kind: tollgatev1.DecisionEvent_KIND_DECISION,
			KeyId: key, KeyPrefix: "sk_…", Tenant: tenant, Endpoint: "/v1/x", Method: "GET",
			RuleId: "g", Algorithm: "token_bucket", Allowed: allowed, Status: 429, Reason: "rate_limited"})
	}
}

// redisNow is region r's clock, in µs.
func redisNow(t *testing.T, r *region) int64 {
	tm, err := r.redis.Time(t.Context()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return tm.UnixMicro()
}

// share is the test counter's share in region r now, as its ledger in
// Redis holds it (the static share while it holds no loan).
func (f *regionFleet) share(t *testing.T, r *region) int64 {
	in, ok, err := r.store.Inspect(t.Context(), f.counter, redisNow(t, r))
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		return f.static
	}
	return in.Share
}

// waitLoan emits demand in r until its ledger holds more than its static
// share.
func (f *regionFleet) waitLoan(t *testing.T, r *region, timeout time.Duration) {
	t.Helper()
	took := testwait.Eventually(t, timeout, func() error {
		f.demand(t, r, 5)
		if s := f.share(t, r); s <= f.static {
			return fmt.Errorf("region %s: share %d, static %d: no loan yet", r.name, s, f.static)
		}
		return nil
	})
	t.Logf("region %s borrowed within %v (%.1f periods)", r.name, took, float64(took)/float64(regionsPeriod))
}

// gauge reads an unlabelled gauge of an aggregator's registry (0 when
// absent).
func gauge(t *testing.T, in *instance, name string) float64 {
	t.Helper()
	return promtest.Sum(t, in.srv.Registry(), name)
}

// TestRegionsLoanFollowsDemand: two regions, each its own Redis, NATS
// (linked by a leafnode), Kafka and aggregator; one region's demand far
// above its static share, the other idle: a loan lands in the busy
// region's ledger within a few periods, the coordinator's start is in the
// audit log, and the busy region's gateways are told. Cut the link: both
// regions fall back to at most their static shares within two periods
// and keep reporting; heal it: loans resume.
func TestRegionsLoanFollowsDemand(t *testing.T) {
	t.Parallel()
	f := startRegionFleet(t, "eu", "us")
	eu, us := f.regions[0], f.regions[1]
	nc := natstest.Connect(t, us.nats.ClientURL())
	changed, err := nc.SubscribeSync(tollgatev1.SubjectCounters)
	if err != nil {
		t.Fatal(err)
	}

	f.waitLoan(t, us, 30*time.Second)
	if s := f.share(t, eu); s >= f.static {
		t.Errorf("the idle region eu kept its share %d (static %d) while us borrowed", s, f.static)
	}
	testwait.Eventually(t, 10*time.Second, func() error {
		m, err := changed.NextMsg(10 * time.Millisecond)
		if err != nil {
			return fmt.Errorf("no counter change announced in us: %w", err)
		}
		if !strings.Contains(string(m.Data), `"kind":"loan"`) || !strings.Contains(string(m.Data), f.counter) {
			return fmt.Errorf("announcement %s does not name the loan's counter", m.Data)
		}
		return nil
	})
	testwait.Eventually(t, 10*time.Second, func() error {
		code, _, b := op(t, eu.agg.srv.Addrs().API, "GET", "/admin/v1/audit?kind=regions", "")
		if code != 200 || !strings.Contains(string(b), "coordinator started") {
			return fmt.Errorf("audit: %d %s", code, b)
		}
		return nil
	})

	// Cut us off: no more loans reach it, and what it borrowed ends.
	if err := us.nats.CutLinks(); err != nil {
		t.Fatal(err)
	}
	t0 := redisNow(t, us)
	testwait.Eventually(t, 20*time.Second, func() error {
		f.demand(t, us, 5)
		if s := f.share(t, us); s > f.static {
			return fmt.Errorf("us cut off still holds %d > its static share %d", s, f.static)
		}
		return nil
	})
	fell := time.Duration(redisNow(t, us)-t0) * time.Microsecond
	t.Logf("us fell back to its static share %v after the cut (%.1f periods)", fell, float64(fell)/float64(regionsPeriod))
	// Within two periods (a loan ends at the end of the period after the
	// one it was made or extended in), plus a second for the polls of a
	// loaded machine: a loan of the bucket's whole refill time would be
	// 60 s.
	if limit := 2*regionsPeriod + time.Second; fell > limit {
		t.Errorf("us fell back to its static share %v after the cut, beyond %v", fell, limit)
	}
	if s := f.share(t, eu); s > f.static {
		t.Errorf("eu holds %d > its static share %d while cut off", s, f.static)
	}
	// Both keep serving: each region's agent still reports (its demand is
	// counted and its ledger answers).
	if s := f.share(t, us); s <= 0 {
		t.Errorf("us cut off has no share left: %d", s)
	}

	if err := us.nats.HealLinks(); err != nil {
		t.Fatal(err)
	}
	natstest.WaitLinkedTB(t, f.nats)
	f.waitLoan(t, us, 30*time.Second)
}

// TestRegionsLoanUnderAnOverriddenLimit: the test key's limit cut by an
// override (or a penalty) in the busy region: its gateways decide it
// under the cut limit, so its ledger in Redis holds that limit, while the
// aggregator counts its demand under the rule's. The region reports it
// under the cut limit and a loan of that limit lands in its ledger. A
// penalty then cuts the key again while it holds the loan: the loan stops
// counting at once, and, once the idle region's loan made under the
// override has ended, a loan of the penalty's limit lands.
func TestRegionsLoanUnderAnOverriddenLimit(t *testing.T) {
	t.Parallel()
	f := startRegionFleet(t, "eu", "us")
	us := f.regions[1]
	cut := f.lim
	cut.Units = 40 // the override: 40 a minute
	static := regions.EqualFleet("eu", "us").Static(cut.Units)[1]
	// The gateways of us decide the key under the cut limit (the
	// ledger's admission, as their script runs it) until it is spent.
	for {
		a, err := us.store.Admit(t.Context(), f.counter, cut, 1, redisNow(t, us))
		if err != nil {
			t.Fatal(err)
		}
		if !a.Allowed {
			break
		}
	}
	took := testwait.Eventually(t, 30*time.Second, func() error {
		f.demand(t, us, 5)
		in, ok, err := us.store.Inspect(t.Context(), f.counter, redisNow(t, us))
		if err != nil {
			return err
		}
		if !ok || in.Share <= static {
			return fmt.Errorf("us holds %+v of the cut limit, static %d: no loan yet", in, static)
		}
		return nil
	})
	t.Logf("us borrowed under the cut limit within %v (%.1f periods)", took, float64(took)/float64(regionsPeriod))
	// The loan is of the cut limit: the ledger still holds it.
	if _, err := us.store.State(t.Context(), f.counter, cut, redisNow(t, us)); err != nil {
		t.Fatalf("us's ledger no longer holds the cut limit: %v", err)
	}
	// A penalty cuts it again while us holds the loan: the loan, made
	// under the override's limit, no longer counts there at once.
	penalty := cut
	penalty.Units = 10
	if _, err := us.store.Admit(t.Context(), f.counter, penalty, 0, redisNow(t, us)); err != nil {
		t.Fatal(err)
	}
	in, _, err := us.store.Inspect(t.Context(), f.counter, redisNow(t, us))
	if err != nil {
		t.Fatal(err)
	}
	penaltyStatic := regions.EqualFleet("eu", "us").Static(penalty.Units)[1]
	if in.Share > penaltyStatic {
		t.Fatalf("under the penalty us holds %d, above its static share %d of the penalty's limit: the loan made under the override still counts", in.Share, penaltyStatic)
	}
	// eu's loan, made under the override, ends unextended (the regions
	// report different limits); then eu, whose gateways never decided the
	// key, lends under the penalty's limit.
	took = testwait.Eventually(t, 30*time.Second, func() error {
		f.demand(t, us, 5)
		in, _, err := us.store.Inspect(t.Context(), f.counter, redisNow(t, us))
		if err != nil {
			return err
		}
		if in.Limit != penalty || in.Share <= penaltyStatic {
			return fmt.Errorf("us holds %+v under the penalty, static %d: no loan yet", in, penaltyStatic)
		}
		return nil
	})
	t.Logf("us borrowed under the penalty within %v (%.1f periods)", took, float64(took)/float64(regionsPeriod))
}

// TestRegionsCoordinatorFailover: three regions; the first coordinates.
// Its aggregator stops: another region takes over with a higher epoch and
// loans go on.
func TestRegionsCoordinatorFailover(t *testing.T) {
	t.Parallel()
	f := startRegionFleet(t, "eu", "us", "ap")
	eu, us, ap := f.regions[0], f.regions[1], f.regions[2]
	var first float64
	testwait.Eventually(t, 30*time.Second, func() error {
		if first = gauge(t, eu.agg, "tollgate_aggregator_region_coordinator_epoch"); first == 0 {
			return fmt.Errorf("eu does not coordinate")
		}
		return nil
	})
	f.waitLoan(t, ap, 30*time.Second)

	eu.agg.stop(t)
	// Another region takes over with a higher epoch (two may stand at
	// once on a loaded machine: the higher deposes the lower).
	coord := func() (*region, regions.Epoch) {
		for _, r := range []*region{us, ap} {
			if e := regions.Epoch(gauge(t, r.agg, "tollgate_aggregator_region_coordinator_epoch")); e != 0 {
				return r, e
			}
		}
		return nil, 0
	}
	testwait.Eventually(t, 30*time.Second, func() error {
		if r, e := coord(); r == nil || float64(e) <= first {
			return fmt.Errorf("no region but eu coordinates above epoch %s", regions.Epoch(first))
		}
		return nil
	})
	// Loans go on under the new coordinator: us lends to ap (eu is gone).
	testwait.Eventually(t, 30*time.Second, func() error {
		f.demand(t, ap, 5)
		st, err := us.store.State(t.Context(), f.counter, f.lim, redisNow(t, us))
		if err != nil {
			return err
		}
		for _, o := range st.Out {
			if float64(o.ID.Epoch) > first && o.To == "ap" && o.Units > 0 {
				return nil
			}
		}
		return fmt.Errorf("us holds no loan to ap of an epoch above %s: %+v", regions.Epoch(first), st.Out)
	})
	next, e := coord()
	t.Logf("region %s coordinates with epoch %s after eu's aggregator stopped (eu had %s)", next.name, e, regions.Epoch(first))
	us = next
	code, _, b := op(t, us.agg.srv.Addrs().API, "GET", "/admin/v1/audit?kind=regions", "")
	if code != 200 || !strings.Contains(string(b), "coordinator started") {
		t.Errorf("us's audit log: %d %s", code, b)
	}
}

// TestRegionsDemandOfEveryInstance: a region with two aggregators; the
// demand is in partitions the agent's instance does not consume. The other
// instance forwards it, and the loan lands.
func TestRegionsDemandOfEveryInstance(t *testing.T) {
	t.Parallel()
	f := startRegionFleet(t, "eu", "us")
	us := f.regions[1]
	c := us.cfg
	c.ID, c.DataDir = "agg-us-2", t.TempDir()
	us2 := runAggregator(t, c)
	var other *instance
	testwait.Eventually(t, 30*time.Second, func() error {
		a, b := us.agg.srv.Owned(), us2.srv.Owned()
		if len(a) == 0 || len(b) == 0 {
			return fmt.Errorf("partitions not shared yet: %v and %v", a, b)
		}
		other = us2
		if slices.Contains(b, 0) {
			other = us.agg
		}
		return nil
	})
	// A tenant in a partition of the instance that does not run the agent.
	var tenant string
	for i := 0; tenant == ""; i++ {
		if tn := fmt.Sprintf("t-%d", i); slices.Contains(other.srv.Owned(), partitionOf(tn)) {
			tenant = tn
		}
	}
	namer := redisstore.New(us.redis)
	counter := namer.CounterName(&guard.CounterID{Rule: f.tag, Scope: rules.ScopeKey, Tenant: tenant, KeyID: regionsKey})
	took := testwait.Eventually(t, 30*time.Second, func() error {
		tenantDemand(t, us, tenant, regionsKey, 5, false)
		in, ok, err := us.store.Inspect(t.Context(), counter, redisNow(t, us))
		if err != nil {
			return err
		}
		if !ok || in.Share <= f.static {
			return fmt.Errorf("no loan for demand counted by the other instance (share %d, held %v)", in.Share, ok)
		}
		return nil
	})
	t.Logf("demand of the other instance's partitions borrowed within %v", took)
}

var (
	regionsFigures = flag.Bool("regions.figures", false, "run TestRegionsMessageFigures: cross-region messages per second with hot and cold counters (about 40 s)")
	regionsCold    = flag.String("regions.cold", "2000", "TestRegionsMessageFigures: the numbers of cold counters to measure at, comma-separated, ascending (e.g. 1000,1000000)")
)

// TestRegionsMessageFigures measures the messages the regions protocol
// sends per second, over two regions, with 0, 1 and 10 hot counters (far
// above their share in one region) beside each number of cold ones of
// -regions.cold (a decision each, in both regions, made before the hot
// counters are measured). Behind -regions.figures.
func TestRegionsMessageFigures(t *testing.T) {
	if !*regionsFigures {
		t.Skip("figures: run with -regions.figures")
	}
	var colds []int
	for _, f := range strings.Split(*regionsCold, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 || len(colds) > 0 && n < colds[len(colds)-1] {
			t.Fatalf("-regions.cold %q: want ascending whole numbers", *regionsCold)
		}
		colds = append(colds, n)
	}
	f := startRegionFleet(t, "eu", "us")
	sum := func(in *instance, name, label, value string) float64 {
		return promtest.Sum(t, in.srv.Registry(), name, label, value)
	}
	sent := func() float64 {
		var n float64
		for _, r := range f.regions {
			n += sum(r.agg, "tollgate_aggregator_region_messages_total", "direction", "sent")
		}
		return n
	}
	const periods = 20
	loaded := 0
	for _, cold := range colds {
		// Cold counters: a decision each, in both regions, applied by
		// both aggregators before the hot ones are measured.
		start := time.Now()
		var sending time.Duration
		for _, r := range f.regions {
			before := sum(r.agg, "tollgate_aggregator_events_total", "result", "applied")
			t0 := time.Now()
			r.gw.sendBulk(t, cold-loaded, func(i int) *tollgatev1.DecisionEvent {
				return &tollgatev1.DecisionEvent{TimeUnixMicros: time.Now().UnixMicro(), Kind: tollgatev1.DecisionEvent_KIND_DECISION,
					KeyId: fmt.Sprintf("kid-cold-%d", loaded+i), KeyPrefix: "sk_…", Tenant: regionsTenant, Endpoint: "/v1/x", Method: "GET",
					RuleId: "g", Algorithm: "token_bucket", Allowed: true}
			})
			sending += time.Since(t0)
			testwait.Eventually(t, 10*time.Minute, func() error {
				if got := sum(r.agg, "tollgate_aggregator_events_total", "result", "applied"); got < before+float64(cold-loaded) {
					return fmt.Errorf("%v of %d cold decisions applied", got-before, cold-loaded)
				}
				return nil
			})
		}
		t.Logf("%d cold counters in both regions (%d new: sent in %v, sent and applied in %v)", cold, cold-loaded,
			sending.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
		loaded = cold
		for _, hot := range []int{0, 1, 10} {
			n0, t0 := sent(), time.Now()
			end := t0.Add(periods * regionsPeriod)
			testwait.Eventually(t, 2*periods*regionsPeriod, func() error {
				for i := range hot {
					keyDemand(t, f.regions[1], fmt.Sprintf("kid-hot-%d", i), 2, false)
				}
				if time.Now().Before(end) {
					return fmt.Errorf("measuring")
				}
				return nil
			})
			el := time.Since(t0)
			rate := (sent() - n0) / el.Seconds()
			t.Logf("FIGURE regions messages: %d hot counters, %d cold: %.1f messages/s over both regions (%.1f per period), over %v",
				hot, cold, rate, rate*regionsPeriod.Seconds(), el.Round(time.Millisecond))
		}
	}
}

// TestRegionsCoordinatorRestartNeverReusesAnEpoch: the coordinator
// region's aggregator restarts and stands again before any other region
// does; its new agent forgot the epochs it saw, but the other regions'
// reports name them, so its new coordinator's epoch is higher than the
// old one's (a reused epoch would reuse loan ids).
func TestRegionsCoordinatorRestartNeverReusesAnEpoch(t *testing.T) {
	t.Parallel()
	f := startRegionFleet(t, "eu", "us", "ap")
	eu := f.regions[0]
	var first float64
	testwait.Eventually(t, 30*time.Second, func() error {
		if first = gauge(t, eu.agg, "tollgate_aggregator_region_coordinator_epoch"); first == 0 {
			return fmt.Errorf("eu does not coordinate")
		}
		return nil
	})
	f.waitLoan(t, f.regions[2], 30*time.Second)
	eu.agg.stop(t)
	again := runAggregator(t, eu.cfg)
	var e regions.Epoch
	testwait.Eventually(t, 30*time.Second, func() error {
		for _, in := range []*instance{again, f.regions[1].agg, f.regions[2].agg} {
			if g := gauge(t, in, "tollgate_aggregator_region_coordinator_epoch"); g != 0 && g != first {
				e = regions.Epoch(g)
				return nil
			}
		}
		if g := gauge(t, again, "tollgate_aggregator_region_coordinator_epoch"); g == first {
			return nil // reused: checked below
		}
		return fmt.Errorf("no new coordinator yet")
	})
	if g := regions.Epoch(gauge(t, again, "tollgate_aggregator_region_coordinator_epoch")); g != 0 {
		e = g
	}
	t.Logf("after eu's restart the coordinator's epoch is %s (before: %s)", e, regions.Epoch(first))
	if float64(e) <= first {
		t.Fatalf("a coordinator reused epoch %s", e)
	}
}
