package pipeline_test

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/aggregator"
	"github.com/tollgate/tollgate/compose/kafkabroker"
	"github.com/tollgate/tollgate/compose/kafkabroker/kafkatest"
	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/gateway"
	"github.com/tollgate/tollgate/internal/logtest"
	"github.com/tollgate/tollgate/internal/promtext"
	"github.com/tollgate/tollgate/internal/service"
	"github.com/tollgate/tollgate/internal/testnet"
	"github.com/tollgate/tollgate/internal/testwait"
)

var outage = flag.Duration("outage", 5*time.Second, "how long TestKafkaOutage keeps the broker down (the published figure uses 30s)")

const (
	secret = "pipeline-test-secret-0123456789"
	token  = "pipeline-admin-token"
	rules  = `
keys:
  sk_acme_1: {tenant: acme}
  sk_acme_2: {tenant: acme}
  sk_globex_1: {tenant: globex}
rules:
  - id: per-key
    algorithm: token_bucket
    capacity: 20
    rate: 20/1h
`
)

// tenants and their keys, the traffic of every test.
var keys = map[string][]string{"acme": {"sk_acme_1", "sk_acme_2"}, "globex": {"sk_globex_1"}}

// aggChildEnv makes the test binary run one aggregator as a child
// process (the throughput benchmark measures its CPU).
const aggChildEnv = "TOLLGATE_PIPELINE_AGGREGATOR_CHILD"

// TestMain runs one aggregator (aggChildEnv) or one gateway (childEnv)
// instead of the tests when the test binary is re-executed as a child
// process: it prints its addresses and runs until SIGTERM or SIGKILL.
func TestMain(m *testing.M) {
	var err error
	switch {
	case os.Getenv(aggChildEnv) == "1":
		err = runAggregatorChild()
	case os.Getenv(childEnv) == "1":
		err = runGatewayChild()
	default:
		os.Exit(m.Run())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// childLogger is a child process's log (a child has no test to give
// logtest.Verbose): on stderr from info with TOLLGATE_TEST_LOG, else none.
func childLogger() *slog.Logger {
	if os.Getenv("TOLLGATE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return slog.New(slog.DiscardHandler)
}

func runAggregatorChild() error {
	cfg, err := aggregator.LoadConfig("", nil)
	if err != nil {
		return err
	}
	srv, err := aggregator.New(cfg, childLogger())
	if err != nil {
		return err
	}
	fmt.Printf("api %s\n", srv.Addrs().API)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	return srv.Run(ctx)
}

// env is Redis, a Kafka-protocol broker on a fixed port (so it can go down
// and come back), a rules file and an aggregator.
type env struct {
	t       testing.TB
	redis   string
	broker  *kafkabroker.Broker
	rules   string
	agg     *aggregator.Server
	aggStop func()
}

func newEnv(t *testing.T) *env { return newEnvTB(t, true) }

// newEnvTB starts the env, the aggregator only when withAggregator.
func newEnvTB(t testing.TB, withAggregator bool) *env {
	e := &env{t: t, redis: redistest.StartTB(t).Addr()}
	e.broker = kafkatest.StartTB(t, kafkabroker.WithLogger(logtest.Verbose(t)))
	e.rules = filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(e.rules, []byte(rules), 0o600); err != nil {
		t.Fatal(err)
	}
	if !withAggregator {
		return e
	}
	cfg := aggregator.Config{Listen: "127.0.0.1:0", MetricsListen: aggregator.Off, ID: "agg", DataDir: t.TempDir(),
		AdminToken: token, KeySecret: secret, SessionTimeout: 2 * time.Second}
	cfg.Kafka.Brokers = e.broker.Addrs()
	cfg.Usage.Lateness = time.Second
	e.agg, e.aggStop = runAggregator(t, cfg, logtest.Verbose(t).With("part", "aggregator"))
	return e
}

// runAggregator creates an aggregator from cfg and runs it until the test
// ends or stop, which returns once Run has returned (30 s at most) and does
// nothing the second time.
func runAggregator(tb testing.TB, cfg aggregator.Config, log *slog.Logger) (srv *aggregator.Server, stop func()) {
	tb.Helper()
	srv, err := aggregator.New(cfg, log)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	run := service.Go(func() error { return srv.Run(ctx) })
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case <-run.Done():
				if err := run.Wait(); err != nil {
					tb.Errorf("aggregator: %v", err)
				}
			case <-time.After(30 * time.Second):
				tb.Error("aggregator did not stop within 30s")
			}
		})
	}
	tb.Cleanup(stop)
	return srv, stop
}

// gatewayConfig is a gateway of the env: check API only.
func (e *env) gatewayConfig(id, dataDir string) gateway.Config {
	c := gateway.Config{APIListen: "127.0.0.1:0", MetricsListen: gateway.Off, GRPCListen: gateway.Off,
		RulesFile: e.rules, KeySecret: secret, GatewayID: id, DataDir: dataDir,
		Redis: configs.Redis{Addrs: []string{e.redis}, Timeout: 2 * time.Second}}
	c.Kafka.Brokers = e.broker.Addrs()
	return c
}

// gw is a running gateway in this process.
type gw struct {
	api string
}

func (e *env) startGateway(id string) *gw {
	srv, err := gateway.New(e.gatewayConfig(id, e.t.TempDir()), logtest.Verbose(e.t).With("part", id))
	if err != nil {
		e.t.Fatal(err)
	}
	testnet.RunUntilCleanup(e.t, "gateway "+id, srv.Run)
	return &gw{api: srv.Addrs().API}
}

// counts are decisions made, per tenant.
type counts map[string]*struct{ allowed, rejected int64 }

func (c counts) add(tenant string, status int) {
	if c[tenant] == nil {
		c[tenant] = &struct{ allowed, rejected int64 }{}
	}
	switch status {
	case 200:
		c[tenant].allowed++
	case 429, 403:
		c[tenant].rejected++
	}
}

// check asks a gateway's check API and returns the status.
func check(t testing.TB, api, key string) int {
	body := fmt.Sprintf(`{"api_key":%q,"endpoint":"/v1/items","method":"GET","ip":"10.0.0.1"}`, key)
	resp, err := http.Post("http://"+api+"/v1/check", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// send makes n decisions through the gateways, round robin over tenants,
// keys and gateways, and counts them.
func send(t testing.TB, n int, made counts, apis ...string) {
	i := 0
	for i < n {
		for tenant, ks := range keys {
			for _, k := range ks {
				if i == n {
					return
				}
				made.add(tenant, check(t, apis[i%len(apis)], k))
				i++
			}
		}
	}
}

// report reads a tenant's totals from the aggregator.
func report(addr, tenant string) (allowed, rejected int64, err error) {
	q := url.Values{"granularity": {"day"}, "from": {time.Now().Add(-48 * time.Hour).Format(time.RFC3339)},
		"to": {time.Now().Add(time.Hour).Format(time.RFC3339)}}
	req, _ := http.NewRequest("GET", "http://"+addr+"/v1/usage/tenants/"+tenant+"?"+q.Encode(), nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	var a struct {
		Totals struct{ Allowed, Rejected int64 }
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return 0, 0, fmt.Errorf("report %d: %s", resp.StatusCode, b)
	}
	err = json.Unmarshal(b, &a)
	return a.Totals.Allowed, a.Totals.Rejected, err
}

// waitExact waits until every tenant's report equals the decisions made.
func (e *env) waitExact(made counts, timeout time.Duration) time.Duration {
	e.t.Helper()
	return testwait.Eventually(e.t, timeout, func() error {
		for tenant, c := range made {
			a, r, err := report(e.agg.Addrs().API, tenant)
			if err != nil {
				return err
			}
			if a != c.allowed || r != c.rejected {
				return fmt.Errorf("tenant %s: report %d allowed, %d rejected; gateways made %d and %d", tenant, a, r, c.allowed, c.rejected)
			}
		}
		return nil
	})
}

// TestReportEqualsDecisions: decisions through two gateways, admissions
// and rejections, show up in the per-tenant report exactly.
func TestReportEqualsDecisions(t *testing.T) {
	e := newEnv(t)
	a, b := e.startGateway("gw-a"), e.startGateway("gw-b")
	made := counts{}
	send(t, 150, made, a.api, b.api) // 50 per key: 20 admitted, 30 rejected
	if made["acme"].rejected == 0 || made["acme"].allowed == 0 {
		t.Fatalf("the traffic should mix admissions and rejections: %+v", *made["acme"])
	}
	took := e.waitExact(made, 30*time.Second)
	t.Logf("reports equal the %d decisions %v after the last one", 150, took)
}

// TestKafkaOutage: the broker goes down under load for -outage (5 s here,
// 30 s for the figure in docs/benchmarks.md) and comes back on the same port; gateways
// keep deciding (spooling), and afterwards every decision is in the report
// exactly once.
func TestKafkaOutage(t *testing.T) {
	e := newEnv(t)
	a, b := e.startGateway("gw-a"), e.startGateway("gw-b")
	made := counts{}
	send(t, 60, made, a.api, b.api)
	e.waitExact(made, 30*time.Second)
	if err := e.broker.Down(); err != nil {
		t.Fatal(err)
	}
	downAt := time.Now()
	n := 0
	for time.Since(downAt) < *outage {
		send(t, 30, made, a.api, b.api)
		n += 30
	}
	if err := e.broker.Up(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Logf("broker down %v; %d decisions made meanwhile", time.Since(downAt).Round(time.Millisecond), n)
	send(t, 30, made, a.api, b.api)
	took := e.waitExact(made, 90*time.Second)
	t.Logf("figure: Kafka down %v under load: reports exact %v after it came back (0 decisions lost)", *outage, took)
}

// childEnv makes the test binary run one gateway as a child process,
// configured by the variables the parent sets, printing its check API
// address; the parent SIGKILLs it.
const childEnv = "TOLLGATE_PIPELINE_GATEWAY_CHILD"

func runGatewayChild() error {
	cfg, err := gateway.LoadConfig("", nil)
	if err != nil {
		return err
	}
	srv, err := gateway.New(cfg, childLogger())
	if err != nil {
		return err
	}
	fmt.Printf("api %s %s\n", srv.Addrs().API, srv.Addrs().Metrics)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	return srv.Run(ctx)
}

// child is a gateway process.
type child struct {
	api, metrics string
	kill         func()
}

// metric returns the value of a metric of the child's /metrics (its one
// series, labelled by gateway only).
func (c *child) metric(name string) (float64, error) {
	ss, err := promtext.Get(context.Background(), http.DefaultClient, "http://"+c.metrics+"/metrics")
	if err != nil {
		return 0, err
	}
	return ss.Sum(name), nil
}

func (e *env) startChild(id, dataDir string) *child {
	e.t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"=1",
		"TOLLGATE_API_LISTEN=127.0.0.1:0", "TOLLGATE_METRICS_LISTEN=127.0.0.1:0", "TOLLGATE_GRPC_LISTEN=off",
		"TOLLGATE_RULES_FILE="+e.rules, "TOLLGATE_KEY_SECRET="+secret, "TOLLGATE_GATEWAY_ID="+id,
		"TOLLGATE_DATA_DIR="+dataDir, "TOLLGATE_REDIS_ADDRS="+e.redis, "TOLLGATE_REDIS_TIMEOUT=2s",
		"TOLLGATE_KAFKA_BROKERS="+strings.Join(e.broker.Addrs(), ","))
	out, err := cmd.StdoutPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	var once sync.Once
	c := &child{kill: func() {
		once.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGKILL)
			_ = cmd.Wait()
		})
	}}
	e.t.Cleanup(c.kill)
	line, err := bufio.NewReader(out).ReadString('\n')
	f := strings.Fields(line)
	if len(f) != 3 || f[0] != "api" {
		c.kill()
		e.t.Fatalf("gateway child printed %q: %v", line, err)
	}
	c.api, c.metrics = f[1], f[2]
	return c
}

// TestGatewayKilledWithSpool: Kafka is down, a gateway process decides
// (its events spill to its spool), is SIGKILLed, and is started again on
// the same data directory once Kafka is back: the spool is replayed and the
// report is exact (the kill came after the flush interval, so nothing was
// only in memory).
func TestGatewayKilledWithSpool(t *testing.T) {
	e := newEnv(t)
	dataDir := t.TempDir()
	c := e.startChild("gw-child", dataDir)
	made := counts{}
	send(t, 30, made, c.api)
	e.waitExact(made, 30*time.Second)
	if err := e.broker.Down(); err != nil {
		t.Fatal(err)
	}
	c = e.startChild("gw-child-2", dataDir)
	send(t, 60, made, c.api)
	// Once the flush interval has passed, what Kafka did not take is on
	// disk: every event recorded is spooled (some stay in memory too,
	// waiting for Kafka, but a kill no longer loses them).
	testwait.Eventually(t, 20*time.Second, func() error {
		rec, err := c.metric("tollgate_events_recorded_total")
		if err != nil {
			return err
		}
		spooled, err := c.metric("tollgate_events_spooled_total")
		if err != nil {
			return err
		}
		if rec < 60 || spooled < rec {
			return fmt.Errorf("%v events recorded, %v spooled", rec, spooled)
		}
		return nil
	})
	c.kill()
	if err := e.broker.Up(context.Background()); err != nil {
		t.Fatal(err)
	}
	c = e.startChild("gw-child-2", dataDir)
	send(t, 15, made, c.api)
	took := e.waitExact(made, 60*time.Second)
	t.Logf("after a SIGKILL with a spool, reports exact %v after the restart", took)
}
