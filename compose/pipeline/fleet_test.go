package pipeline_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/aggregator"
	"github.com/tollgate/tollgate/compose/kafkabroker/kafkatest"
	"github.com/tollgate/tollgate/compose/natsserver"
	"github.com/tollgate/tollgate/compose/natsserver/natstest"
	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/gateway"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/internal/logtest"
	"github.com/tollgate/tollgate/internal/promtext"
	"github.com/tollgate/tollgate/internal/testnet"
	"github.com/tollgate/tollgate/internal/testwait"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// adminToken is the operator API's token in fleet tests.
const adminToken = "fleet-admin-token"

// fleetRules returns a ruleset whose rule "demo" gives sk_fleet_* keys a
// token bucket of the given capacity, refilling as slowly as a test needs
// (capacity per hour).
func fleetRules(capacity int) string {
	return fmt.Sprintf(`rules:
  - id: demo
    match: {api_key: "sk_fleet_*"}
    algorithm: token_bucket
    capacity: %d
    rate: %d/1h
`, capacity, capacity)
}

// fileCapacity is the capacity of rules_file's demo rule: what a gateway
// enforces before NATS has told it anything.
const fileCapacity = 3

// fleet is one control plane (NATS, a Kafka-protocol broker, an
// aggregator with its operator API), one Redis and gateways in fleet mode.
type fleet struct {
	t         testing.TB
	ns        *natsserver.Server
	redisAddr string
	rulesFile string
	dataDir   string
	admin     string // operator API address
	client    *http.Client
	gws       []*fleetGateway

	// For the penalty ladder's tests: the aggregator's ladder, and
	// gateways that stream their decisions to it through Kafka (brokers).
	penalty aggregator.PenaltyConfig
	brokers []string
	events  bool
	// gwConfig, when set, changes each gateway's configuration.
	gwConfig func(*gateway.Config)
}

// fleetGateway is a running gateway of the fleet, with its log.
type fleetGateway struct {
	id    string
	srv   *gateway.Server
	addrs gateway.Addrs
	run   *testnet.Running // srv.Run
	logs  *testnet.Buffer
}

// newFleet starts the control plane, Redis and n gateways, and waits
// until every gateway enforces the operator API's first ruleset (capacity
// 5).
func newFleet(t testing.TB, n int) *fleet {
	t.Helper()
	return newFleetWith(t, n, func(*fleet) {})
}

// newFleetWith is newFleet with the fleet's settings changed by mutate
// before anything starts.
func newFleetWith(t testing.TB, n int, mutate func(*fleet)) *fleet {
	t.Helper()
	f := &fleet{t: t, client: &http.Client{Timeout: 10 * time.Second}, dataDir: t.TempDir()}
	mutate(f)
	t.Cleanup(f.client.CloseIdleConnections)
	f.redisAddr = redistest.StartTB(t).Addr()
	f.ns = natstest.StartTB(t)
	f.rulesFile = filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(f.rulesFile, []byte(fleetRules(fileCapacity)), 0o600); err != nil {
		t.Fatal(err)
	}
	f.startAggregator()
	f.putRules(fleetRules(5))
	for i := range n {
		f.startGateway(fmt.Sprintf("gw%d", i+1))
	}
	f.waitRules(1, 5)
	return f
}

func (f *fleet) startAggregator() {
	t := f.t
	kb := kafkatest.StartTB(t)
	cfg := aggregator.Config{Listen: "127.0.0.1:0", MetricsListen: aggregator.Off, ID: "agg", DataDir: t.TempDir(),
		AdminToken: adminToken, KeySecret: secret, SessionTimeout: 2 * time.Second, Penalty: f.penalty}
	cfg.Kafka.Brokers = kb.Addrs()
	f.brokers = kb.Addrs()
	cfg.NATS.URL = f.ns.ClientURL()
	srv, _ := runAggregator(t, cfg, logtest.Warnings(t).With("part", "aggregator"))
	f.admin = srv.Addrs().API
	waitOperatorAPI(t, f.op)
}

// gatewayConfig is a fleet gateway's configuration: the check API and
// metrics on free ports, no proxy, no gRPC.
func (f *fleet) gatewayConfig(id string) gateway.Config {
	c := gateway.Config{
		APIListen:     "127.0.0.1:0",
		MetricsListen: "127.0.0.1:0",
		GRPCListen:    gateway.Off,
		RulesFile:     f.rulesFile,
		KeySecret:     secret,
		GatewayID:     id,
		DataDir:       f.dataDir,
		Redis:         configs.Redis{Addrs: []string{f.redisAddr}, Timeout: 2 * time.Second},
	}
	c.NATS.URL = f.ns.ClientURL()
	if f.events {
		c.Kafka.Brokers = f.brokers
	}
	if f.gwConfig != nil {
		f.gwConfig(&c)
	}
	return c
}

// startGateway starts a fleet gateway, stopped at cleanup.
func (f *fleet) startGateway(id string) *fleetGateway {
	f.t.Helper()
	g := &fleetGateway{id: id, logs: &testnet.Buffer{}}
	log := slog.New(slog.NewMultiHandler(logtest.Warnings(f.t).Handler(), slog.NewTextHandler(g.logs, nil))).With("gateway", id)
	srv, err := gateway.New(f.gatewayConfig(id), log)
	if err != nil {
		f.t.Fatal(err)
	}
	g.srv, g.addrs, g.run = srv, srv.Addrs(), testnet.Start(f.t, "gateway "+id, srv.Run)
	f.gws = append(f.gws, g)
	return g
}

// stop stops a gateway now (its cleanup then has nothing left to do).
func (g *fleetGateway) stop(t *testing.T) {
	t.Helper()
	if err := g.run.Stop(); err != nil {
		t.Fatal(err)
	}
}

// op calls the operator API.
func (f *fleet) op(method, path, body string) (int, []byte) {
	f.t.Helper()
	return operatorCall(f.t, f.client, f.admin, adminToken, method, path, body)
}

// putRules makes src the fleet's ruleset through the operator API and
// returns the version it assigned.
func (f *fleet) putRules(src string) int64 {
	f.t.Helper()
	code, b := f.op("PUT", "/admin/v1/rules", src)
	var out struct {
		Version int64 `json:"version"`
	}
	if code != 200 || json.Unmarshal(b, &out) != nil {
		f.t.Fatalf("PUT rules: %d %s", code, b)
	}
	return out.Version
}

// decision is the check API's answer.
type decision struct {
	Allowed   bool   `json:"allowed"`
	Status    int    `json:"status"`
	Limit     int64  `json:"limit"`
	Remaining int64  `json:"remaining"`
	Rule      string `json:"rule"`
	Error     struct {
		Code string `json:"code"`
	} `json:"error"`
}

// check asks a gateway's check API about key; cost 0 is a peek.
func (f *fleet) check(g *fleetGateway, key string, cost int) decision {
	f.t.Helper()
	body := fmt.Sprintf(`{"api_key":%q,"endpoint":"/v1/x","method":"GET","cost":%d}`, key, cost)
	resp, err := f.client.Post("http://"+g.addrs.API+"/v1/check", "application/json", strings.NewReader(body))
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	var d decision
	if err := json.NewDecoder(resp.Body).Decode(&d); err != nil {
		f.t.Fatalf("check API: %v", err)
	}
	return d
}

// readyz is the part of /readyz these tests read.
type readyz struct {
	Rules struct {
		Source  string `json:"source"`
		Version int64  `json:"version"`
	} `json:"rules"`
	NATS *struct {
		Status string `json:"status"`
		Synced bool   `json:"synced"`
	} `json:"nats"`
}

func (f *fleet) readyz(g *fleetGateway) readyz {
	f.t.Helper()
	resp, err := f.client.Get("http://" + g.addrs.Metrics + "/readyz")
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	var r readyz
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || resp.StatusCode != 200 {
		f.t.Fatalf("readyz: %d %v", resp.StatusCode, err)
	}
	return r
}

// metric returns the value of one series of a gateway's /metrics (see
// promtext.Samples.Value), -1 when absent.
func (f *fleet) metric(g *fleetGateway, series string) float64 {
	f.t.Helper()
	ss, err := promtext.Get(f.t.Context(), f.client, "http://"+g.addrs.Metrics+"/metrics")
	if err != nil {
		f.t.Fatal(err)
	}
	if v, ok := ss.Value(series); ok {
		return v
	}
	return -1
}

// waitRules waits until every gateway serves version from NATS with the
// demo rule's capacity, checking with a peek of a fresh key.
func (f *fleet) waitRules(version int64, capacity int) time.Duration {
	f.t.Helper()
	return testwait.Eventually(f.t, 5*time.Second, func() error {
		for _, g := range f.gws {
			if r := f.readyz(g); r.Rules.Source != "nats" || r.Rules.Version != version {
				return fmt.Errorf("%s: rules %+v, want version %d from nats", g.id, r.Rules, version)
			}
			if d := f.check(g, "sk_fleet_probe", 0); d.Limit != int64(capacity) {
				return fmt.Errorf("%s: limit %d, want %d", g.id, d.Limit, capacity)
			}
		}
		return nil
	})
}

// TestFleetRuleChange raises a limit through the operator API: every
// gateway enforces it within 2 s, and the counter keeps what was consumed
// (raising a limit grants the difference at once).
func TestFleetRuleChange(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 3)
	for i := range 3 {
		if d := f.check(f.gws[0], "sk_fleet_a", 1); !d.Allowed {
			t.Fatalf("request %d: %+v", i+1, d)
		}
	}
	for _, g := range f.gws {
		// A peek answers what a request of cost 1 would get: 2 units are
		// left, 1 after that request.
		if d := f.check(g, "sk_fleet_a", 0); d.Limit != 5 || d.Remaining != 1 {
			t.Fatalf("%s before the change: limit %d remaining %d, want 5 and 1 (one counter for the fleet)", g.id, d.Limit, d.Remaining)
		}
	}
	v := f.putRules(fleetRules(10))
	answered := time.Now()
	took := testwait.Eventually(t, 2*time.Second, func() error {
		for _, g := range f.gws {
			if d := f.check(g, "sk_fleet_a", 0); d.Limit != 10 || d.Remaining != 6 {
				return fmt.Errorf("%s: limit %d remaining %d, want 10 and 6 (3 consumed carried over, 1 for the peek)", g.id, d.Limit, d.Remaining)
			}
		}
		return nil
	})
	t.Logf("version %d enforced by 3 gateways %v after the operator API answered (%v including this check)", v, took, time.Since(answered))
	// The difference, and no more, is granted: 7 pass, the 8th is refused.
	for i := range 8 {
		d := f.check(f.gws[2], "sk_fleet_a", 1)
		if want := i < 7; d.Allowed != want {
			t.Fatalf("request %d after the raise: allowed %v, want %v (%+v)", i+1, d.Allowed, want, d)
		}
	}
	for _, g := range f.gws {
		if r := f.readyz(g); r.Rules.Source != "nats" || r.Rules.Version != v {
			t.Errorf("%s: readyz rules %+v, want version %d from nats", g.id, r.Rules, v)
		}
		if m := f.metric(g, `tollgate_rules_version{gateway="`+g.id+`"}`); m != float64(v) {
			t.Errorf("%s: tollgate_rules_version %v, want %d", g.id, m, v)
		}
	}
}

// TestFleetBlocklistTTL blocks a key for 2 s through the operator API:
// every gateway answers 403 from memory (no Redis call), then lets the key
// through again by itself when the entry expires.
func TestFleetBlocklistTTL(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 3)
	code, b := f.op("PUT", "/admin/v1/blocklist/sk_fleet_b", `{"ttl":"2s","reason":"test"}`)
	if code != 200 {
		t.Fatalf("PUT blocklist: %d %s", code, b)
	}
	took := testwait.Eventually(t, 2*time.Second, func() error {
		for _, g := range f.gws {
			if d := f.check(g, "sk_fleet_b", 1); d.Status != 403 || d.Error.Code != guard.CodeKeyBlocked {
				return fmt.Errorf("%s: status %d %s, want 403 KEY_BLOCKED", g.id, d.Status, d.Error.Code)
			}
		}
		return nil
	})
	t.Logf("block enforced by 3 gateways within %v of the operator API's answer", took)
	g := f.gws[1]
	calls := `tollgate_redis_calls_total{gateway="` + g.id + `"}`
	before := f.metric(g, calls)
	for range 5 {
		if d := f.check(g, "sk_fleet_b", 1); d.Status != 403 {
			t.Fatalf("blocked key: status %d", d.Status)
		}
	}
	if after := f.metric(g, calls); after != before {
		t.Errorf("5 blocked checks made %v Redis calls, want 0 (answered from memory)", after-before)
	}
	if n := f.metric(g, `tollgate_controls_entries{gateway="`+g.id+`",kind="blocked"}`); n != 1 {
		t.Errorf("tollgate_controls_entries{kind=blocked} %v, want 1", n)
	}
	testwait.Eventually(t, 5*time.Second, func() error {
		for _, g := range f.gws {
			if d := f.check(g, "sk_fleet_b", 0); d.Status != 200 {
				return fmt.Errorf("%s: status %d after the entry's TTL", g.id, d.Status)
			}
		}
		return nil
	})
}

// TestFleetNATSOutage takes NATS down: the gateways keep the rules and
// blocklist in force, and a change made after NATS is back reaches every
// gateway within 2 s (each gateway re-reads the buckets on reconnect).
func TestFleetNATSOutage(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 3)
	if code, b := f.op("PUT", "/admin/v1/blocklist/sk_fleet_c", `{"reason":"outage test"}`); code != 200 {
		t.Fatalf("PUT blocklist: %d %s", code, b)
	}
	testwait.Eventually(t, 2*time.Second, func() error {
		for _, g := range f.gws {
			if d := f.check(g, "sk_fleet_c", 0); d.Status != 403 {
				return fmt.Errorf("%s: not blocked yet", g.id)
			}
		}
		return nil
	})
	if err := f.ns.Down(); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 5*time.Second, func() error {
		for _, g := range f.gws {
			if r := f.readyz(g); r.NATS == nil || r.NATS.Status != "disconnected" {
				return fmt.Errorf("%s: readyz nats %+v", g.id, r.NATS)
			}
			if m := f.metric(g, `tollgate_nats_connected{gateway="`+g.id+`"}`); m != 0 {
				return fmt.Errorf("%s: tollgate_nats_connected %v", g.id, m)
			}
		}
		return nil
	})
	for _, g := range f.gws {
		if d := f.check(g, "sk_fleet_probe", 0); d.Limit != 5 {
			t.Errorf("%s during the outage: limit %d, want 5 (the rules in force)", g.id, d.Limit)
		}
		if d := f.check(g, "sk_fleet_c", 0); d.Status != 403 {
			t.Errorf("%s during the outage: blocked key answered %d", g.id, d.Status)
		}
	}
	if err := f.ns.Up(t.Context()); err != nil {
		t.Fatal(err)
	}
	// The aggregator reconnects too: its API answers 503/502 until then.
	var v int64
	testwait.Eventually(t, 10*time.Second, func() error {
		code, b := f.op("PUT", "/admin/v1/rules", fleetRules(8))
		if code != 200 {
			return fmt.Errorf("PUT rules after NATS came back: %d %s", code, b)
		}
		var out struct{ Version int64 }
		if err := json.Unmarshal(b, &out); err != nil {
			return err
		}
		v = out.Version
		return nil
	})
	answered := time.Now()
	took := testwait.Eventually(t, 2*time.Second, func() error {
		for _, g := range f.gws {
			if d := f.check(g, "sk_fleet_probe", 0); d.Limit != 8 {
				return fmt.Errorf("%s: limit %d, want 8", g.id, d.Limit)
			}
		}
		return nil
	})
	t.Logf("version %d, written after NATS came back, enforced by 3 gateways %v after the answer (%v with this check)", v, took, time.Since(answered))
	testwait.Eventually(t, 5*time.Second, func() error {
		if r := f.readyz(f.gws[0]); r.NATS == nil || r.NATS.Status != "connected" || !r.NATS.Synced {
			return fmt.Errorf("readyz nats %+v after the outage", r.NATS)
		}
		return nil
	})
}

// TestFleetRestartWithoutNATS restarts a gateway while NATS is down: it
// starts from its last-known-good copy (rules and blocklist), and a new
// gateway with no copy starts from rules_file; both follow NATS once it
// is back.
func TestFleetRestartWithoutNATS(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 1)
	v := f.putRules(fleetRules(7))
	if code, b := f.op("PUT", "/admin/v1/blocklist/sk_fleet_d", `{"reason":"restart test"}`); code != 200 {
		t.Fatalf("PUT blocklist: %d %s", code, b)
	}
	testwait.Eventually(t, 2*time.Second, func() error {
		if d := f.check(f.gws[0], "sk_fleet_d", 0); d.Status != 403 {
			return fmt.Errorf("not blocked yet: %d", d.Status)
		}
		if d := f.check(f.gws[0], "sk_fleet_probe", 0); d.Limit != 7 {
			return fmt.Errorf("limit %d, want 7", d.Limit)
		}
		return nil
	})
	f.gws[0].stop(t)
	if err := f.ns.Down(); err != nil {
		t.Fatal(err)
	}
	f.gws = f.gws[:0]
	again := f.startGateway("gw1")
	fresh := f.startGateway("gw-new")
	if r := f.readyz(again); r.Rules.Source != "lkg" || r.Rules.Version != v {
		t.Errorf("restarted gateway: rules %+v, want version %d from lkg", r.Rules, v)
	}
	if d := f.check(again, "sk_fleet_probe", 0); d.Limit != 7 {
		t.Errorf("restarted gateway: limit %d, want 7", d.Limit)
	}
	if d := f.check(again, "sk_fleet_d", 0); d.Status != 403 {
		t.Errorf("restarted gateway: the blocked key answered %d, want 403 from the copy", d.Status)
	}
	if !strings.Contains(again.logs.String(), "starting from the last-known-good copy") {
		t.Errorf("the restarted gateway's log does not say it starts from its copy:\n%s", again.logs)
	}
	if r := f.readyz(fresh); r.Rules.Source != "file" {
		t.Errorf("gateway without a copy: rules %+v, want rules_file", r.Rules)
	}
	if d := f.check(fresh, "sk_fleet_probe", 0); d.Limit != fileCapacity {
		t.Errorf("gateway without a copy: limit %d, want rules_file's %d", d.Limit, fileCapacity)
	}
	if !strings.Contains(fresh.logs.String(), "no last-known-good copy yet; starting from rules_file") {
		t.Errorf("the new gateway's log does not say it starts from rules_file:\n%s", fresh.logs)
	}
	if err := f.ns.Up(t.Context()); err != nil {
		t.Fatal(err)
	}
	f.waitRules(v, 7)
	if d := f.check(fresh, "sk_fleet_d", 0); d.Status != 403 {
		t.Errorf("gateway without a copy, after NATS came back: the blocked key answered %d", d.Status)
	}
}

// TestFleetRefusesInvalidRuleset writes an invalid ruleset straight into
// the rules bucket, bypassing the operator API's validation: every gateway
// refuses it, logs the rule, field and line, counts it, and keeps the
// ruleset in force.
func TestFleetRefusesInvalidRuleset(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 3)
	js := natstest.JetStream(t, f.ns.ClientURL())
	kv, err := js.KeyValue(t.Context(), tollgatev1.BucketRules)
	if err != nil {
		t.Fatal(err)
	}
	bad := "rules:\n  - id: broken\n    algorithm: token_bucket\n    capacity: 10\n    rate: 10/1h\n    window: 1m\n"
	entry, _ := json.Marshal(&tollgatev1.RulesEntry{Version: 99, Source: bad, Format: "yaml", Actor: "intruder", Time: time.Now()})
	if _, err := kv.Put(t.Context(), tollgatev1.RulesKey, entry); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 2*time.Second, func() error {
		for _, g := range f.gws {
			if m := f.metric(g, `tollgate_rules_reload_errors_total{gateway="`+g.id+`"}`); m != 1 {
				return fmt.Errorf("%s: reload errors %v, want 1", g.id, m)
			}
		}
		return nil
	})
	problem := regexp.MustCompile(`ruleset from NATS refused.*version=99.*problem_1\.rule=broken problem_1\.field=window problem_1\.line=6`)
	for _, g := range f.gws {
		if !problem.MatchString(g.logs.String()) {
			t.Errorf("%s: no refusal naming rule, field and line in the log:\n%s", g.id, g.logs)
		}
		if r := f.readyz(g); r.Rules.Version != 1 {
			t.Errorf("%s: version %d in force, want 1", g.id, r.Rules.Version)
		}
		if d := f.check(g, "sk_fleet_probe", 0); d.Limit != 5 {
			t.Errorf("%s: limit %d, want the running ruleset's 5", g.id, d.Limit)
		}
	}
}

// propagated is one change's timing: the operator API's own time (from
// the request sent to its answer), and the time from its answer until
// every gateway enforced the change (0 when all did before the answer:
// the API answers after its audit entry is written to Kafka).
type propagated struct {
	api, enforce time.Duration
}

// propagation measures, n times each, a rule change (a new limit of rule
// demo: enforced once every gateway's guard decides a peek with it) and a
// blocklist entry (every gateway answers a peek of the key 403) on the
// gateways of f. The gateways are polled in process, through their
// guards, every 200µs.
func propagation(tb testing.TB, f *fleet, n int) (ruleChange, block []propagated) {
	ctx := context.Background()
	enforced := func(cond func(*guard.Decision) bool, req *guard.Request) time.Time {
		tick := time.NewTicker(200 * time.Microsecond)
		defer tick.Stop()
		deadline := time.Now().Add(5 * time.Second)
		pending := slices.Clone(f.gws)
		for len(pending) > 0 {
			pending = slices.DeleteFunc(pending, func(g *fleetGateway) bool {
				d, err := g.srv.Guard().Peek(ctx, req)
				return err == nil && cond(d)
			})
			if time.Now().After(deadline) {
				tb.Fatalf("%d gateways do not enforce the change after 5s", len(pending))
			}
			if len(pending) > 0 {
				<-tick.C
			}
		}
		return time.Now()
	}
	timing := func(sent, answered, at time.Time) propagated {
		return propagated{api: answered.Sub(sent), enforce: max(0, at.Sub(answered))}
	}
	for i := range n {
		limit := int64(100 + i)
		sent := time.Now()
		f.putRules(fleetRules(int(limit)))
		answered := time.Now()
		at := enforced(func(d *guard.Decision) bool { return d.Deciding >= 0 && d.Rules[d.Deciding].Limit == limit },
			&guard.Request{Key: "sk_fleet_probe", Path: "/v1/x"})
		ruleChange = append(ruleChange, timing(sent, answered, at))

		key := fmt.Sprintf("sk_fleet_blk%d", i)
		sent = time.Now()
		if code, b := f.op("PUT", "/admin/v1/blocklist/"+key, `{"ttl":"1m","reason":"propagation"}`); code != 200 {
			tb.Fatalf("PUT blocklist: %d %s", code, b)
		}
		answered = time.Now()
		at = enforced(func(d *guard.Decision) bool { return d.Status == 403 }, &guard.Request{Key: key, Path: "/v1/x"})
		block = append(block, timing(sent, answered, at))
	}
	return ruleChange, block
}

// field returns one field of every timing.
func field(ps []propagated, f func(propagated) time.Duration) []time.Duration {
	out := make([]time.Duration, len(ps))
	for i, p := range ps {
		out[i] = f(p)
	}
	return out
}

func enforceTime(p propagated) time.Duration { return p.enforce }
func apiTime(p propagated) time.Duration     { return p.api }

// TestFleetPropagationFigures logs the propagation figure (< 2 s, aim < 100 ms): three
// gateways, from the operator API's answer to enforcement on every one,
// for a rule change and a blocklist entry; and checks the 2 s contract.
// docs/benchmarks.md records the figures (BenchmarkFleetPropagation gives
// them without the race detector).
func TestFleetPropagationFigures(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 3)
	rc, bl := propagation(t, f, 20)
	for _, m := range []struct {
		what string
		ps   []propagated
	}{{"rule change", rc}, {"blocklist entry", bl}} {
		ds := field(m.ps, enforceTime)
		p50, p99 := nearestRank(ds, 50), nearestRank(ds, 99)
		t.Logf("%s, 3 gateways, %d changes: from the API's answer to enforcement everywhere p50 %v, p99 %v, max %v; the API's own answer p50 %v",
			m.what, len(ds), p50, p99, slices.Max(ds), nearestRank(field(m.ps, apiTime), 50))
		if p99 > 2*time.Second {
			t.Errorf("%s: p99 %v, want < 2s (the propagation bound)", m.what, p99)
		}
	}
}

// BenchmarkFleetPropagation reports the propagation figure
// (docs/benchmarks.md):
//
//	go test ./gateway -run '^$' -bench FleetPropagation -benchtime 100x
//
// Each iteration changes a rule's limit and blocks a key through the
// operator API, and waits until all three gateways enforce each. Metrics,
// in milliseconds: <kind>-p50-ms and -p99-ms from the API's answer to
// enforcement on every gateway (0 when they all enforced it before the
// answer), and <kind>-api-p50-ms, the API's own time to answer.
func BenchmarkFleetPropagation(b *testing.B) {
	f := newFleet(b, 3)
	b.ReportAllocs()
	b.ResetTimer()
	rc, bl := propagation(b, f, b.N)
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	for _, m := range []struct {
		name string
		ps   []propagated
	}{{"rule", rc}, {"block", bl}} {
		ds := field(m.ps, enforceTime)
		b.ReportMetric(ms(nearestRank(ds, 50)), m.name+"-p50-ms")
		b.ReportMetric(ms(nearestRank(ds, 99)), m.name+"-p99-ms")
		b.ReportMetric(ms(nearestRank(field(m.ps, apiTime), 50)), m.name+"-api-p50-ms")
	}
}
