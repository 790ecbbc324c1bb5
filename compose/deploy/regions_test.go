package deploy

import (
	"net"
	"net/url"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/internal/testnet"
)

// natsConfig is one NATS service of a deployment started from a
// configuration file (--config), as nats-server reads it.
type natsConfig struct {
	service string
	file    string // local path, relative to this directory
	opts    *server.Options
}

// natsConfigs parses the configuration file of every NATS service that
// runs with --config, with nats-server's own parser.
func natsConfigs(t testing.TB, c *compose) []natsConfig {
	t.Helper()
	var out []natsConfig
	for _, n := range c.names() {
		s := c.Services[n]
		i := slices.Index(s.Command, "--config")
		if !strings.HasPrefix(s.Image, "nats:") || i < 0 {
			continue
		}
		if i+1 >= len(s.Command) {
			t.Errorf("service %s: --config names no file", n)
			continue
		}
		file := s.mountSource(s.Command[i+1])
		if file == "" {
			t.Errorf("service %s: --config %s is in no directory mounted from here", n, s.Command[i+1])
			continue
		}
		opts, err := server.ProcessConfigFile(file)
		if err != nil {
			t.Errorf("service %s: %s: %v", n, file, err)
			continue
		}
		out = append(out, natsConfig{service: n, file: file, opts: opts})
	}
	return out
}

// regionsDeployment loads the two-region deployment.
func regionsDeployment(t testing.TB) *compose {
	t.Helper()
	return loadCompose(t, testEnv(t), composeFile, regionsFile)
}

// TestComposeRegionsNATS: every NATS server of the two-region deployment
// is configured from a file nats-server parses, has a name of its own and
// runs JetStream in a domain of its own, on a volume of its own and on the
// ports its service exposes; one (the hub) listens for leafnode
// connections and every other links to it.
func TestComposeRegionsNATS(t *testing.T) {
	c := regionsDeployment(t)
	cfgs := natsConfigs(t, c)
	if len(cfgs) != 2 {
		t.Fatalf("want two NATS servers configured from files (one a region), have %d", len(cfgs))
	}
	domains, stores, names := map[string]string{}, map[string]string{}, map[string]string{}
	var hubs []natsConfig
	for _, nc := range cfgs {
		s, o := c.Services[nc.service], nc.opts
		where := "service " + nc.service + " (" + nc.file + ")"
		if !o.JetStream || o.JetStreamDomain == "" {
			t.Errorf("%s: want JetStream in a domain of its own, have jetstream %v, domain %q", where, o.JetStream, o.JetStreamDomain)
		} else if other := domains[o.JetStreamDomain]; other != "" {
			t.Errorf("%s: JetStream domain %s is %s's too", where, o.JetStreamDomain, other)
		}
		domains[o.JetStreamDomain] = nc.service
		if other := names[o.ServerName]; o.ServerName == "" || other != "" {
			t.Errorf("%s: server_name %q is empty or %s's too; want one of its own", where, o.ServerName, other)
		}
		names[o.ServerName] = nc.service
		switch src, _ := s.volumeAt(o.StoreDir); {
		case o.StoreDir == "" || src == "" || strings.HasPrefix(src, "."):
			t.Errorf("%s: store_dir %q is on no named volume", where, o.StoreDir)
		case stores[src] != "":
			t.Errorf("%s: store_dir is on volume %s, which %s uses too", where, src, stores[src])
		default:
			stores[src] = nc.service
		}
		for what, port := range map[string]int{"listen": o.Port, "http_port": o.HTTPPort, "leafnodes listen": o.LeafNode.Port} {
			if port != 0 && !s.exposes(strconv.Itoa(port)) {
				t.Errorf("%s: %s port %d is not exposed (expose: %v)", where, what, port, s.Expose)
			}
		}
		if o.Host != "0.0.0.0" {
			t.Errorf("%s: listens on %q; want 0.0.0.0 (reachable from the other containers)", where, o.Host)
		}
		if o.LeafNode.Port != 0 {
			hubs = append(hubs, nc)
		}
	}
	if len(hubs) != 1 {
		t.Fatalf("want one hub (a NATS server with a leafnode listener), have %d", len(hubs))
	}
	hub := hubs[0]
	for _, nc := range cfgs {
		if nc.service == hub.service {
			if len(nc.opts.LeafNode.Remotes) != 0 {
				t.Errorf("service %s: the hub has leafnode remotes too (leafnode links must form a tree)", nc.service)
			}
			continue
		}
		if len(nc.opts.LeafNode.Remotes) != 1 || len(nc.opts.LeafNode.Remotes[0].URLs) == 0 {
			t.Errorf("service %s (%s): want one leafnode remote, to the hub %s; have %d", nc.service, nc.file, hub.service, len(nc.opts.LeafNode.Remotes))
			continue
		}
		for _, u := range nc.opts.LeafNode.Remotes[0].URLs {
			checkLeafURL(t, c, nc, u, hub)
		}
	}
}

// checkLeafURL: a spoke's leafnode remote u names the hub's service and
// its leafnode port.
func checkLeafURL(t *testing.T, c *compose, nc natsConfig, u *url.URL, hub natsConfig) {
	t.Helper()
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		t.Errorf("service %s: leafnode remote %s: %v", nc.service, u, err)
		return
	}
	if msg := c.checkAddr(nc.service, addr{host: host, port: port, where: "service " + nc.service + ": leafnode remote"}); msg != "" {
		t.Error(msg)
	}
	if name, _ := c.lookup(host); name != hub.service || port != strconv.Itoa(hub.opts.LeafNode.Port) {
		t.Errorf("service %s: leafnode remote %s is not the hub %s's leafnode listener (port %d)", nc.service, u, hub.service, hub.opts.LeafNode.Port)
	}
}

// TestComposeRegionsServices: in the two-region deployment every gateway
// and aggregator names its region, one the rules list; every region has a
// gateway and an aggregator; all use one TOLLGATE_REGIONS_PERIOD and one
// rules file; each reaches its own region's NATS (whose JetStream domain
// is the region's name), and no Redis or Kafka address is shared between
// regions. The operator and check APIs are published on loopback only.
func TestComposeRegionsServices(t *testing.T) {
	c := regionsDeployment(t)
	domainOf := map[string]string{} // NATS service → JetStream domain
	for _, nc := range natsConfigs(t, c) {
		domainOf[nc.service] = nc.opts.JetStreamDomain
	}
	listed := regionNames(t)
	periods, rulesFiles := map[string]bool{}, map[string]bool{}
	hosts := map[string]string{} // Redis or Kafka service → region
	have := map[string][]string{}
	for _, n := range append(c.running(binGateway), c.running(binAggregator)...) {
		s := c.Services[n]
		env := s.Environment
		region := env["TOLLGATE_REGION"]
		if !slices.Contains(listed, region) {
			t.Errorf("service %s: TOLLGATE_REGION %q is not in %s's regions %v", n, region, regionsRules, listed)
			continue
		}
		have[region] = append(have[region], s.binary())
		periods[env["TOLLGATE_REGIONS_PERIOD"]] = true
		rulesFiles[s.mountSource(env["TOLLGATE_RULES_FILE"])] = true
		if u, err := url.Parse(env["TOLLGATE_NATS_URL"]); err != nil {
			t.Errorf("service %s: TOLLGATE_NATS_URL: %v", n, err)
		} else if name, _ := c.lookup(u.Hostname()); domainOf[name] != region {
			t.Errorf("service %s: region %s, but its NATS %s runs JetStream domain %q (want the region's name)", n, region, name, domainOf[name])
		}
		for _, v := range []string{"TOLLGATE_REDIS_ADDRS", "TOLLGATE_KAFKA_BROKERS"} {
			for _, a := range addrs("", env[v]) {
				name, _ := c.lookup(a.host)
				if other, ok := hosts[name]; ok && other != region {
					t.Errorf("service %s: %s names %s, a service of region %s; want one of region %s's own", n, v, name, other, region)
				}
				hosts[name] = region
			}
		}
		for _, p := range s.Ports {
			parts := strings.Split(p, ":")
			if container := parts[len(parts)-1]; container != "8080" && parts[0] != "127.0.0.1" {
				t.Errorf("service %s: publishes %s on every interface; only the proxy is public", n, p)
			}
		}
	}
	for _, r := range listed {
		if !slices.Contains(have[r], binGateway) || !slices.Contains(have[r], binAggregator) {
			t.Errorf("region %s runs %v; want a gateway and an aggregator", r, have[r])
		}
	}
	if len(periods) != 1 || periods[""] {
		t.Errorf("TOLLGATE_REGIONS_PERIOD: want one value set everywhere, have %v", keys(periods))
	}
	if len(rulesFiles) != 1 || !rulesFiles[regionsRules] {
		t.Errorf("TOLLGATE_RULES_FILE: want %s mounted everywhere, have %v", regionsRules, keys(rulesFiles))
	}
}

// regionNames returns the regions regions/rules.yaml lists, after checking
// that the file loads and holds a global rule.
func regionNames(t testing.TB) []string {
	t.Helper()
	data, err := os.ReadFile(regionsRules)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rules.Load(data); err != nil {
		t.Fatalf("%s: %v", regionsRules, err)
	}
	doc, err := rules.Parse(data)
	if err != nil {
		t.Fatalf("%s: %v", regionsRules, err)
	}
	var names []string
	for _, r := range doc.Regions {
		names = append(names, r.Name)
	}
	if len(names) < 2 {
		t.Fatalf("%s: regions %v; want the deployment's two", regionsRules, names)
	}
	if !slices.ContainsFunc(doc.Rules, func(r rules.RuleSpec) bool { return r.Regions == "global" }) {
		t.Errorf("%s: no rule with regions: global; the README shows one limit held across regions", regionsRules)
	}
	return names
}

// TestComposeRegionsRules: regions/rules.yaml is the repository's
// configs/rules.yaml with only the top-level regions list changed, so the
// two-region deployment enforces the same rules as the one-region one.
func TestComposeRegionsRules(t *testing.T) {
	want, err := os.ReadFile(repoRoot + "/configs/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	have, err := os.ReadFile(regionsRules)
	if err != nil {
		t.Fatal(err)
	}
	if w, h := withoutRegionsList(string(want)), withoutRegionsList(string(have)); w != h {
		t.Errorf("%s differs from configs/rules.yaml beyond the regions list; copy configs/rules.yaml and change only its regions list\n%s", regionsRules, firstDiff(w, h))
	}
}

// withoutRegionsList drops a rules file's top-level regions list (the key
// and its indented items).
func withoutRegionsList(s string) string {
	var out []string
	skipping := false
	for _, line := range strings.Split(s, "\n") {
		top := line != "" && line[0] != ' ' && line[0] != '\t'
		if skipping && !top && strings.TrimSpace(line) != "" {
			continue
		}
		skipping = false
		if strings.HasPrefix(line, "regions:") {
			skipping = true
			continue
		}
		out = append(out, line)
	}
	return strings.Join(out, "\n")
}

// firstDiff names the first line where a and b differ.
func firstDiff(a, b string) string {
	_, x, y := testnet.FirstDiff(a, b)
	return "configs/rules.yaml: " + strconv.Quote(x) + "\n" + regionsRules + ": " + strconv.Quote(y)
}

// keys returns a set's members, sorted.
func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestPrometheusRegionsConfig: the two-region deployment's Prometheus file
// is prometheus.yml with more targets only (same jobs, rules, alerting and
// intervals).
func TestPrometheusRegionsConfig(t *testing.T) {
	var one, two map[string]any
	readYAML(t, prometheusFile, &one)
	readYAML(t, prometheusRegionsFile, &two)
	for _, cfg := range []map[string]any{one, two} {
		scs, _ := cfg["scrape_configs"].([]any)
		for _, sc := range scs {
			if m, ok := sc.(map[string]any); ok {
				delete(m, "static_configs")
			}
		}
	}
	if !reflect.DeepEqual(one, two) {
		t.Errorf("%s differs from %s beyond its scrape targets:\n%v\n%v", prometheusRegionsFile, prometheusFile, two, one)
	}
}
