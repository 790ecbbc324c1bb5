package pipeline_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/aggregator"
	"github.com/tollgate/tollgate/compose/kafkabroker/kafkatest"
	"github.com/tollgate/tollgate/compose/natsserver/natstest"
	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/gateway"
	"github.com/tollgate/tollgate/internal/logtest"
	"github.com/tollgate/tollgate/internal/service"
	"github.com/tollgate/tollgate/internal/testwait"
)

// regionRules is the ruleset both regions run: the regions list tells
// each aggregator which other regions' global changes to read.
const regionRules = `
regions:
  - {name: eu}
  - {name: us}
rules:
  - id: demo
    match: {api_key: "sk_region_*"}
    algorithm: token_bucket
    capacity: 1000
    rate: 1000/1h
`

// regionSite is one region: its aggregator's operator API and, for us, a
// gateway's check API.
type regionSite struct {
	admin, check string
}

func startRegionSite(t *testing.T, region, natsURL string, withGateway bool) regionSite {
	t.Helper()
	redisAddr := redistest.StartTB(t).Addr()
	kb := kafkatest.StartTB(t)
	cfg := aggregator.Config{Listen: "127.0.0.1:0", MetricsListen: aggregator.Off, ID: "agg-" + region, DataDir: t.TempDir(),
		AdminToken: adminToken, KeySecret: secret, SessionTimeout: 2 * time.Second, Region: region}
	cfg.Kafka.Brokers = kb.Addrs()
	cfg.NATS.URL = natsURL
	cfg.Redis.Addrs = []string{redisAddr}
	srv, _ := runAggregator(t, cfg, logtest.Warnings(t).With("region", region))
	site := regionSite{admin: srv.Addrs().API}
	op := func(method, path, body string) (int, []byte) {
		return operatorCall(t, http.DefaultClient, site.admin, adminToken, method, path, body)
	}
	waitOperatorAPI(t, op)
	if code, b := op("PUT", "/admin/v1/rules", regionRules); code != 200 {
		t.Fatalf("PUT rules in %s: %d %s", region, code, b)
	}
	if !withGateway {
		return site
	}
	rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rulesFile, []byte(regionRules), 0o600); err != nil {
		t.Fatal(err)
	}
	gc := gateway.Config{APIListen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0", GRPCListen: gateway.Off, RulesFile: rulesFile,
		KeySecret: secret, GatewayID: "gw-" + region, DataDir: t.TempDir(), Region: region,
		Redis: configs.Redis{Addrs: []string{redisAddr}, Timeout: 2 * time.Second}}
	gc.NATS.URL = natsURL
	gw, err := gateway.New(gc, logtest.Warnings(t).With("gateway", region))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	task := service.Go(func() error { return gw.Run(ctx) })
	t.Cleanup(func() {
		cancel()
		if err := task.Wait(); err != nil {
			t.Errorf("gateway %s: %v", region, err)
		}
	})
	site.check = gw.Addrs().API
	return site
}

// waitCheck waits until the gateway answers key with status.
func waitCheck(t *testing.T, api, key string, status int) time.Duration {
	t.Helper()
	return testwait.Eventually(t, 30*time.Second, func() error {
		if got := check(t, api, key); got != status {
			return fmt.Errorf("%s: %d, want %d", key, got, status)
		}
		return nil
	})
}

// auditOf returns the audit entries of kind for key at admin.
func auditOf(t *testing.T, admin, kind, key string) []map[string]any {
	t.Helper()
	code, b := operatorCall(t, http.DefaultClient, admin, adminToken, "GET", "/admin/v1/audit?kind="+kind+"&key="+key, "")
	var out struct {
		Entries []map[string]any `json:"entries"`
	}
	if code != 200 || json.Unmarshal(b, &out) != nil {
		t.Fatalf("audit: %d %s", code, b)
	}
	return out.Entries
}

// TestGlobalOperatorChanges: two regions, each its own NATS (its own
// JetStream domain, linked by a leafnode), Kafka, Redis and aggregator,
// and a gateway in us. A blocklist entry made global in eu is enforced by
// us's gateway, with an audit entry in us naming eu; with the link cut,
// us keeps enforcing what it has and eu's new change arrives after the
// heal; a change delivered twice is applied once.
func TestGlobalOperatorChanges(t *testing.T) {
	servers := natstest.StartRegionsTB(t, []string{"eu", "us"})
	eu := startRegionSite(t, "eu", servers[0].ClientURL(), false)
	us := startRegionSite(t, "us", servers[1].ClientURL(), true)
	euOp := func(method, path, body string) (int, []byte) {
		return operatorCall(t, http.DefaultClient, eu.admin, adminToken, method, path, body)
	}
	waitCheck(t, us.check, "sk_region_a", 200)

	if code, b := euOp("PUT", "/admin/v1/blocklist/sk_region_a?scope=global", `{"reason":"abuse seen in eu"}`); code != 200 {
		t.Fatalf("global blocklist PUT in eu: %d %s", code, b)
	}
	took := waitCheck(t, us.check, "sk_region_a", 403)
	t.Logf("eu's global block enforced by us's gateway after %v", took)
	entries := auditOf(t, us.admin, "blocklist", "sk_region_a")
	if len(entries) != 1 || entries[0]["origin_region"] != "eu" || entries[0]["reason"] != "abuse seen in eu" {
		t.Fatalf("us's audit of the block: %v, want one entry with origin_region eu", entries)
	}
	if e := auditOf(t, eu.admin, "blocklist", "sk_region_a"); len(e) != 1 || e[0]["origin_region"] != "eu" {
		t.Errorf("eu's audit of its own global change: %v, want origin_region eu", e)
	}
	// An override and a ruleset made global are enforced in us too.
	if code, b := euOp("PUT", "/admin/v1/overrides/sk_region_c?scope=global", `{"limit":1}`); code != 200 {
		t.Fatalf("global override PUT in eu: %d %s", code, b)
	}
	waitCheck(t, us.check, "sk_region_c", 429)
	tight := strings.Replace(regionRules, "rules:\n", "rules:\n  - {id: tight, match: {api_key: \"sk_region_t*\"}, algorithm: token_bucket, capacity: 1, rate: 1/1h}\n", 1)
	if code, b := euOp("PUT", "/admin/v1/rules?scope=global", tight); code != 200 {
		t.Fatalf("global rules PUT in eu: %d %s", code, b)
	}
	waitCheck(t, us.check, "sk_region_t1", 429)
	if e := auditOf(t, us.admin, "rules", ""); len(e) == 0 || e[len(e)-1]["origin_region"] != "eu" && e[0]["origin_region"] != "eu" {
		t.Errorf("us's audit of the global ruleset: %v, want an entry with origin_region eu", e)
	}
	// A regional change stays in its region.
	if code, b := euOp("PUT", "/admin/v1/blocklist/sk_region_local", `{}`); code != 200 {
		t.Fatalf("regional blocklist PUT in eu: %d %s", code, b)
	}

	// Cut us off: it keeps its copy; eu's next change waits for the heal.
	if err := servers[1].CutLinks(); err != nil {
		t.Fatal(err)
	}
	if code, b := euOp("PUT", "/admin/v1/blocklist/sk_region_b?scope=global", `{}`); code != 200 {
		t.Fatalf("global blocklist PUT in eu while us is cut off: %d %s", code, b)
	}
	if code, b := euOp("DELETE", "/admin/v1/blocklist/sk_region_a?scope=global&reason=cleared", ""); code != 204 {
		t.Fatalf("global blocklist DELETE in eu while us is cut off: %d %s", code, b)
	}
	if got := check(t, us.check, "sk_region_a"); got != 403 {
		t.Errorf("us cut off: sk_region_a %d, want 403 (its last copy)", got)
	}
	if got := check(t, us.check, "sk_region_b"); got != 200 {
		t.Errorf("us cut off: sk_region_b %d, want 200 (eu's change cannot have arrived)", got)
	}
	if err := servers[1].HealLinks(); err != nil {
		t.Fatal(err)
	}
	natstest.WaitLinkedTB(t, servers)
	took = waitCheck(t, us.check, "sk_region_b", 403)
	waitCheck(t, us.check, "sk_region_a", 200)
	t.Logf("eu's changes made during the cut enforced in us %v after the heal", took)
	if got := check(t, us.check, "sk_region_local"); got != 200 {
		t.Errorf("eu's regional block reached us: sk_region_local %d, want 200", got)
	}

	// Deliver eu's first change again (a duplicate in eu's journal, as a
	// publisher's retry would leave it), then a marker change: once the
	// marker is in force, the duplicate has been read.
	js := natstest.JetStream(t, servers[0].ClientURL())
	stream, err := js.Stream(t.Context(), "tollgate_global_eu")
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.GetMsg(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(first.Data), "sk_region_a") && !strings.Contains(string(first.Data), "kid:") {
		t.Fatalf("eu's first global change: %s", first.Data)
	}
	if _, err := js.Publish(t.Context(), first.Subject, first.Data); err != nil {
		t.Fatal(err)
	}
	if code, b := euOp("PUT", "/admin/v1/blocklist/sk_region_marker?scope=global", `{}`); code != 200 {
		t.Fatalf("marker: %d %s", code, b)
	}
	waitCheck(t, us.check, "sk_region_marker", 403)
	if got := check(t, us.check, "sk_region_a"); got != 200 {
		t.Errorf("a duplicate of eu's first change (the block) applied again in us: sk_region_a %d, want 200", got)
	}
	if e := auditOf(t, us.admin, "blocklist", "sk_region_a"); len(e) != 2 {
		t.Errorf("us's audit of sk_region_a: %d entries, want 2 (the block, the delete): %v", len(e), e)
	}
}
