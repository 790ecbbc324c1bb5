package aggregator_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"github.com/tollgate/tollgate/aggregator"
	"github.com/tollgate/tollgate/compose/kafkabroker"
	"github.com/tollgate/tollgate/compose/kafkabroker/kafkatest"
	"github.com/tollgate/tollgate/internal/logtest"
	"github.com/tollgate/tollgate/internal/testnet"
	"github.com/tollgate/tollgate/internal/testwait"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

const (
	partitions = 6
	token      = "test-admin-token"
	secret     = "0123456789abcdef-secret"
)

func startKafka(t testing.TB) []string { return startKafkaBroker(t).Addrs() }

// startKafkaBroker starts a broker with the decisions topic; its Cluster
// serves fault injection.
func startKafkaBroker(t testing.TB) *kafkabroker.Broker {
	t.Helper()
	return kafkatest.StartTB(t, kafkabroker.WithPartitions(partitions), kafkabroker.WithSeedTopics(tollgatev1.TopicDecisions))
}

type instance struct {
	srv *aggregator.Server
	run *testnet.Running
}

func startAggregator(t testing.TB, brokers []string, id, dir string) *instance {
	t.Helper()
	return runAggregator(t, testConfig(brokers, id, dir))
}

// testConfig is the configuration of a test instance: free loopback
// ports, a short session timeout and lateness.
func testConfig(brokers []string, id, dir string) aggregator.Config {
	cfg := aggregator.Config{
		Listen:         "127.0.0.1:0",
		MetricsListen:  "127.0.0.1:0",
		ID:             id,
		DataDir:        dir,
		AdminToken:     token,
		KeySecret:      secret,
		SessionTimeout: 2 * time.Second,
	}
	cfg.Kafka.Brokers = brokers
	cfg.Kafka.Partitions = partitions
	cfg.Usage.Lateness = time.Second
	return cfg
}

// runAggregator starts an instance with cfg; Cleanup stops it and
// expects Run to return nil.
func runAggregator(t testing.TB, cfg aggregator.Config) *instance {
	t.Helper()
	return runWith(t, cfg, logtest.Verbose(t).With("aggregator", cfg.ID))
}

// runWith creates an aggregator from cfg logging to log and runs it until
// the test ends; the cleanup expects Run to return nil.
func runWith(t testing.TB, cfg aggregator.Config, log *slog.Logger) *instance {
	t.Helper()
	srv, err := aggregator.New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	return &instance{srv: srv, run: testnet.Start(t, "aggregator "+cfg.ID, srv.Run)}
}

// stop stops the instance before the test ends; Run must return nil.
func (in *instance) stop(t testing.TB) {
	t.Helper()
	in.run.StopNow(t)
}

// gateway emits numbered decision events as a gateway's producer does.
type gateway struct {
	mu    sync.Mutex
	cl    *kgo.Client
	id    string
	epoch uint64
	seq   map[int32]uint64
	sent  []*kgo.Record
}

func newGateway(t testing.TB, brokers []string, id string, epoch uint64) *gateway {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &gateway{cl: cl, id: id, epoch: epoch, seq: map[int32]uint64{}}
}

func partitionOf(tenant string) int32 { return tollgatev1.PartitionOf(tenant, partitions) }

func (g *gateway) emit(t testing.TB, tenant, key string, allowed bool, at time.Time) {
	g.send(t, &tollgatev1.DecisionEvent{TimeUnixMicros: at.UnixMicro(), Kind: tollgatev1.DecisionEvent_KIND_DECISION,
		KeyId: key, KeyPrefix: "sk_…", Tenant: tenant, Endpoint: "/v1/x", Method: "GET", Cost: 1, RuleId: "r", Allowed: allowed})
}

// emitCounted emits a decision as emit does and counts it in want, by
// tenant.
func (g *gateway) emitCounted(t testing.TB, want map[string]*counts, tenant, key string, allowed bool, at time.Time) {
	g.emit(t, tenant, key, allowed, at)
	w := want[tenant]
	if w == nil {
		w = &counts{}
		want[tenant] = w
	}
	if allowed {
		w.allowed++
	} else {
		w.rejected++
	}
}

// send numbers ev as the gateway's next event of its tenant's partition
// and produces it. Safe for concurrent use.
func (g *gateway) send(t testing.TB, ev *tollgatev1.DecisionEvent) {
	g.mu.Lock()
	r, err := g.record(ev)
	if err != nil {
		g.mu.Unlock()
		t.Error(err)
		return
	}
	g.sent = append(g.sent, r)
	// Produced under the lock, so each partition's sequence reaches Kafka
	// in order, as a gateway's producer guarantees.
	err = g.cl.ProduceSync(context.Background(), r).FirstErr()
	g.mu.Unlock()
	if err != nil {
		t.Error(err)
	}
}

// record numbers ev as the gateway's next event of its tenant's partition
// and encodes it as its record; g.mu is held.
func (g *gateway) record(ev *tollgatev1.DecisionEvent) (*kgo.Record, error) {
	p := partitionOf(ev.Tenant)
	g.seq[p]++
	ev.GatewayId, ev.Epoch, ev.Partition, ev.Seq = g.id, g.epoch, p, g.seq[p]
	v, err := proto.Marshal(ev)
	if err != nil {
		return nil, err
	}
	return &kgo.Record{Topic: tollgatev1.TopicDecisions, Partition: p, Key: []byte(ev.Tenant), Value: v}, nil
}

// sendBulk sends n events, made by ev, numbered as send numbers them,
// waiting once for all of them rather than once per event. They are not
// kept for replay: it is for figures that need many events.
func (g *gateway) sendBulk(t testing.TB, n int, ev func(i int) *tollgatev1.DecisionEvent) {
	g.mu.Lock()
	defer g.mu.Unlock()
	var (
		wg       sync.WaitGroup
		errMu    sync.Mutex
		firstErr error
	)
	for i := range n {
		r, err := g.record(ev(i))
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		// One client, one partition each: franz-go keeps each partition's
		// records in the order produced, as a gateway's producer does.
		g.cl.Produce(context.Background(), r,
			func(_ *kgo.Record, err error) {
				defer wg.Done()
				if err != nil {
					errMu.Lock()
					firstErr = cmp.Or(firstErr, err)
					errMu.Unlock()
				}
			})
	}
	wg.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
}

// replay sends already-sent records again, in order (a spool replay).
func (g *gateway) replay(t testing.TB, recs []*kgo.Record) {
	for _, r := range recs {
		c := *r
		c.Offset, c.Timestamp = 0, time.Time{}
		if err := g.cl.ProduceSync(context.Background(), &c).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}

type answer struct {
	Rows   []map[string]any `json:"rows"`
	Totals struct {
		Allowed, Rejected, Cost int64
	} `json:"totals"`
}

func report(t testing.TB, addr, tenant string) (answer, error) {
	q := url.Values{"granularity": {"minute"}, "from": {time.Now().Add(-time.Hour).Format(time.RFC3339)},
		"to": {time.Now().Add(time.Minute).Format(time.RFC3339)}}
	code, _, b, err := exchange(http.DefaultClient, "GET", "http://"+addr+"/v1/usage/tenants/"+url.PathEscape(tenant)+"?"+q.Encode(), "",
		"Authorization", "Bearer "+token)
	if err != nil {
		return answer{}, err
	}
	if code != 200 {
		return answer{}, fmt.Errorf("report %s: %d %s", tenant, code, b)
	}
	var a answer
	return a, json.Unmarshal(b, &a)
}

type counts struct{ allowed, rejected int64 }

func waitTotals(t testing.TB, addr string, want map[string]*counts) {
	t.Helper()
	took := testwait.Eventually(t, 60*time.Second, func() error {
		for tenant, w := range want {
			a, err := report(t, addr, tenant)
			if err != nil {
				return err
			}
			if a.Totals.Allowed != w.allowed || a.Totals.Rejected != w.rejected {
				return fmt.Errorf("tenant %s: report %d allowed %d rejected, decisions made %d and %d",
					tenant, a.Totals.Allowed, a.Totals.Rejected, w.allowed, w.rejected)
			}
		}
		return nil
	})
	t.Logf("reports exact after %v", took)
}

// TestExactlyOnceAcrossRebalances sends decisions while a second instance
// joins and the first leaves, replays a prefix of them (a spool replay
// after a reconnect), and checks every tenant's report equals the
// decisions made, on both instances.
func TestExactlyOnceAcrossRebalances(t *testing.T) {
	brokers := startKafka(t)
	a := startAggregator(t, brokers, "a", t.TempDir())
	gw := newGateway(t, brokers, "gw-1", 42)
	want := map[string]*counts{}
	now := time.Now()
	send := func(n int) {
		for i := range n {
			tenant := fmt.Sprint("tenant-", i%7)
			allowed := i%5 != 0
			gw.emitCounted(t, want, tenant, fmt.Sprint("key-", i%13), allowed, now)
		}
	}
	send(300)
	waitTotals(t, a.srv.Addrs().API, want)
	b := startAggregator(t, brokers, "b", t.TempDir())
	send(300)
	gw.replay(t, gw.sent[100:400])
	send(300)
	a.stop(t)
	send(300)
	waitTotals(t, b.srv.Addrs().API, want)
	if got := len(b.srv.Owned()); got != partitions {
		t.Errorf("survivor owns %d partitions, want %d", got, partitions)
	}
}

// TestUsageTopic checks that closed windows are published to the usage
// topic with their totals, and republished with a new revision when a late
// event arrives, read_committed.
func TestUsageTopic(t *testing.T) {
	brokers := startKafka(t)
	startAggregator(t, brokers, "a", t.TempDir())
	gw := newGateway(t, brokers, "gw-1", 1)
	past := time.Now().Add(-10 * time.Minute).Truncate(time.Minute)
	for range 5 {
		gw.emit(t, "acme", "key-1", true, past)
	}
	gw.emit(t, "acme", "key-1", false, past)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(tollgatev1.TopicUsage),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	latest := map[tollgatev1.Granularity]*tollgatev1.UsageRollup{}
	poll := func(want func() error) {
		testwait.Eventually(t, 30*time.Second, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
				var u tollgatev1.UsageRollup
				if err := proto.Unmarshal(r.Value, &u); err != nil {
					t.Errorf("usage record: %v", err)
					return
				}
				if old := latest[u.Granularity]; old == nil || u.Revision > old.Revision {
					latest[u.Granularity] = &u
				}
			})
			return want()
		})
	}
	minute := tollgatev1.Granularity_GRANULARITY_MINUTE
	poll(func() error {
		u := latest[minute]
		if u == nil || u.Allowed != 5 || u.Rejected != 1 || u.Revision != 1 || u.WindowStartUnix != past.Unix() {
			return fmt.Errorf("minute rollup %v, want 5 allowed, 1 rejected, revision 1", u)
		}
		return nil
	})
	gw.emit(t, "acme", "key-1", true, past) // late
	poll(func() error {
		if u := latest[minute]; u.Allowed != 6 || u.Revision != 2 {
			return fmt.Errorf("after a late event: %v, want 6 allowed, revision 2", u)
		}
		return nil
	})
}
