package deploy

import (
	"bufio"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/aggregator"
	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/gateway"
)

// pinnedImage matches an image with an exact version tag (three numbers,
// optionally a variant: redis:7.2.6-alpine) or a digest.
var pinnedImage = regexp.MustCompile(`^[a-z0-9]+(?:[._/-][a-z0-9]+)*(?::v?[0-9]+\.[0-9]+\.[0-9]+(?:[-.+][A-Za-z0-9.-]+)?|(?::[A-Za-z0-9._-]+)?@sha256:[0-9a-f]{64})$`)

// TestComposeImagesPinned: every pulled image names an exact version, so a
// deployment is the same tomorrow; the locally built image has a tag of its
// own (never latest).
func TestComposeImagesPinned(t *testing.T) {
	forDeployments(t, func(t *testing.T, c *compose) {
		for _, n := range c.names() {
			s := c.Services[n]
			switch {
			case s.Image == "":
				t.Errorf("service %s: no image (compose would build an image named after the project)", n)
			case s.Build != nil:
				if _, tag, ok := strings.Cut(s.Image, ":"); !ok || tag == "latest" {
					t.Errorf("service %s: built image %q needs a tag other than latest", n, s.Image)
				}
			case !pinnedImage.MatchString(s.Image):
				t.Errorf("service %s: image %q is not pinned to an exact version (name:1.2.3 or @sha256:…)", n, s.Image)
			}
		}
	})
}

// TestComposeTollgateVariables: every TOLLGATE_* variable a service sets is
// one its binary reads (gateway.Vars, aggregator.Vars) and is in the
// variable registry, whose CheckEnv the binaries run at start; and the
// service's whole environment loads into a valid configuration.
func TestComposeTollgateVariables(t *testing.T) {
	forDeployments(t, func(t *testing.T, c *compose) {
		valid := varNames(t)
		registry := configs.Registry()
		for _, n := range c.names() {
			s := c.Services[n]
			var environ []string
			for name := range s.Environment {
				if strings.HasPrefix(name, configs.Prefix) && !slices.Contains(registry, name) {
					t.Errorf("service %s: %s is not in the variable registry (configs.Registry)", n, name)
				}
				environ = append(environ, name+"="+s.Environment[name])
			}
			if err := configs.CheckEnv(environ, registry); err != nil {
				t.Errorf("service %s: %v", n, err)
			}
			bin := s.binary()
			if s.Build != nil && valid[bin] == nil {
				t.Errorf("service %s: runs %q, not one of the image's binaries (gateway, aggregator, loadtest)", n, bin)
				continue
			}
			for name := range s.Environment {
				if !strings.HasPrefix(name, configs.Prefix) {
					continue
				}
				if bin == "" {
					t.Errorf("service %s: sets %s but runs no Tollgate binary", n, name)
				} else if !valid[bin][name] {
					t.Errorf("service %s: %s is not a variable of %s (%s --help lists them)", n, name, bin, bin)
				}
			}
			lookup := func(name string) (string, bool) { v, ok := s.Environment[name]; return v, ok }
			var err error
			switch bin {
			case binGateway:
				_, err = gateway.LoadConfig("", lookup)
			case binAggregator:
				_, err = aggregator.LoadConfig("", lookup)
			}
			if err != nil {
				t.Errorf("service %s: its environment does not load:\n%v", n, err)
			}
		}
		if len(c.running(binGateway)) < 2 || len(c.running(binAggregator)) < 2 {
			t.Errorf("want at least two gateways and two aggregators, have %v and %v", c.running(binGateway), c.running(binAggregator))
		}
	})
}

// TestComposeListeners: a Tollgate service's listeners bind every interface
// of its container on the ports it exposes, and every exposed port has a
// listener behind it (the defaults are loopback: a listener left at its
// default is unreachable from other containers).
func TestComposeListeners(t *testing.T) {
	forDeployments(t, func(t *testing.T, c *compose) {
		for _, n := range append(c.running(binGateway), c.running(binAggregator)...) {
			s := c.Services[n]
			bound := map[string]string{}
			for name, v := range s.Environment {
				if !strings.HasPrefix(name, configs.Prefix) || !strings.HasSuffix(name, "_LISTEN") || v == "off" {
					continue
				}
				port, err := listenPort(v)
				if err != nil {
					t.Errorf("service %s: %s: %v", n, name, err)
					continue
				}
				bound[port] = name
				if !s.exposes(port) {
					t.Errorf("service %s: %s listens on port %s, which it does not expose (expose: %v)", n, name, port, s.Expose)
				}
			}
			for _, p := range s.Expose {
				if bound[p] == "" {
					t.Errorf("service %s: exposes port %s but no TOLLGATE_*_LISTEN variable binds it", n, p)
				}
			}
		}
	})
}

// TestComposeAddresses: every host:port in an environment value, a command
// or a healthcheck names a service (or the service itself) and a port that
// service exposes; published ports are exposed ones and never collide.
func TestComposeAddresses(t *testing.T) {
	forDeployments(t, func(t *testing.T, c *compose) {
		published := map[string]string{}
		for _, n := range c.names() {
			s := c.Services[n]
			var found []addr
			for k, v := range s.Environment {
				found = append(found, addrs("service "+n+": environment "+k, v)...)
			}
			found = append(found, addrs("service "+n+": command", s.Command...)...)
			found = append(found, addrs("service "+n+": entrypoint", s.Entrypoint...)...)
			if s.Healthcheck != nil {
				found = append(found, addrs("service "+n+": healthcheck", s.Healthcheck.Test...)...)
			}
			// redis-server --replicaof HOST PORT
			if i := slices.Index(s.Command, "--replicaof"); i >= 0 && i+2 < len(s.Command) {
				found = append(found, addr{host: s.Command[i+1], port: s.Command[i+2], where: "service " + n + ": --replicaof"})
			}
			for _, a := range found {
				if msg := c.checkAddr(n, a); msg != "" {
					t.Error(msg)
				}
			}
			for _, p := range s.Ports {
				parts := strings.Split(p, ":")
				container := parts[len(parts)-1]
				if !s.exposes(container) {
					t.Errorf("service %s: publishes container port %s, which it does not expose", n, container)
				}
				if len(parts) > 1 {
					host := strings.Join(parts[:len(parts)-1], ":")
					if other := published[host]; other != "" {
						t.Errorf("service %s: host port %s is published by %s too", n, host, other)
					}
					published[host] = n
				}
			}
		}
	})
}

// TestComposeDependsOn: dependencies name services, and a wait for
// service_healthy names one with a healthcheck.
func TestComposeDependsOn(t *testing.T) {
	forDeployments(t, func(t *testing.T, c *compose) {
		for _, n := range c.names() {
			for dep, cond := range c.Services[n].DependsOn {
				target, ok := c.Services[dep]
				switch {
				case !ok:
					t.Errorf("service %s: depends on %s, which is not a service", n, dep)
				case cond == "service_healthy" && target.Healthcheck == nil:
					t.Errorf("service %s: waits for %s to be healthy, but %s has no healthcheck", n, dep, dep)
				case !slices.Contains([]string{"service_started", "service_healthy", "service_completed_successfully"}, cond):
					t.Errorf("service %s: depends_on %s: unknown condition %q", n, dep, cond)
				}
			}
		}
	})
}

// TestComposeVolumes: bind mounts name files that exist here, named volumes
// are declared, and every declared volume is used.
func TestComposeVolumes(t *testing.T) {
	forDeployments(t, func(t *testing.T, c *compose) {
		used := map[string]bool{}
		for _, n := range c.names() {
			for _, v := range c.Services[n].Volumes {
				src, rest, ok := strings.Cut(v, ":")
				if !ok || rest == "" {
					t.Errorf("service %s: volume %q is not SOURCE:TARGET", n, v)
					continue
				}
				switch {
				case strings.HasPrefix(src, "/"):
					t.Errorf("service %s: volume %q mounts an absolute host path; use a path relative to compose/deploy", n, v)
				case strings.HasPrefix(src, "."):
					if _, err := os.Stat(src); err != nil {
						t.Errorf("service %s: volume %q: %v", n, v, err)
					}
				default:
					used[src] = true
					if _, ok := c.Volumes[src]; !ok {
						t.Errorf("service %s: named volume %q is not declared under volumes:", n, src)
					}
				}
			}
		}
		for v := range c.Volumes {
			if !used[v] {
				t.Errorf("volume %s is declared but no service mounts it", v)
			}
		}
	})
}

// TestComposeDataDirs: every gateway and aggregator sets TOLLGATE_DATA_DIR
// (the live test reads the compose environment, not the image's) to a
// named volume of its own: the root filesystem is read-only, and what is
// kept there — the gateway's event spool and last-known-good copy, the
// aggregator's Pebble state — must survive a restart and never be shared.
func TestComposeDataDirs(t *testing.T) {
	forDeployments(t, func(t *testing.T, c *compose) {
		owner := map[string]string{} // volume → service
		for _, n := range append(c.running(binGateway), c.running(binAggregator)...) {
			s := c.Services[n]
			dir := s.Environment["TOLLGATE_DATA_DIR"]
			if !filepath.IsAbs(dir) {
				t.Errorf("service %s: TOLLGATE_DATA_DIR %q: want an absolute path on a volume (the default, tollgate-data, is relative to the working directory)", n, dir)
				continue
			}
			src, _ := s.volumeAt(dir)
			switch {
			case src == "":
				t.Errorf("service %s: TOLLGATE_DATA_DIR %s is on no volume (read-only root filesystem: %v): mount one there", n, dir, s.ReadOnly)
			case strings.HasPrefix(src, "."):
				t.Errorf("service %s: TOLLGATE_DATA_DIR %s is the bind mount %s; want a named volume", n, dir, src)
			case owner[src] != "":
				t.Errorf("service %s: TOLLGATE_DATA_DIR is on volume %s, which %s uses too", n, src, owner[src])
			default:
				owner[src] = n
			}
		}
	})
}

// TestComposeExampleEnv: example.env lists exactly the variables compose
// needs from .env.
func TestComposeExampleEnv(t *testing.T) {
	forDeployments(t, func(t *testing.T, c *compose) {
		listed := map[string]bool{}
		for _, n := range exampleEnvNames(t) {
			listed[n] = true
			if _, ok := c.refs[n]; !ok {
				t.Errorf("%s: %s is not used by %s", exampleEnvFile, n, composeFile)
			}
		}
		for n, required := range c.refs {
			if required && !listed[n] {
				t.Errorf("%s: ${%s} has no default and %s does not list it", composeFile, n, exampleEnvFile)
			}
		}
	})
}

// TestComposeViewerToken: the optional read-only viewer token in .env
// reaches every aggregator's configuration and no gateway, and an empty
// one still starts the deployment, with no viewer token.
func TestComposeViewerToken(t *testing.T) {
	for _, c := range []struct {
		name, value string
	}{
		{"set", "viewer-token-0123456789abcdef"},
		{"empty", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := testEnv(t)
			env["TOLLGATE_VIEWER_TOKEN"] = c.value
			cm := loadCompose(t, env)
			if required := cm.refs["TOLLGATE_VIEWER_TOKEN"]; required {
				t.Errorf("%s requires TOLLGATE_VIEWER_TOKEN; it is optional", composeFile)
			}
			for _, n := range cm.running(binGateway) {
				if _, ok := cm.Services[n].Environment["TOLLGATE_VIEWER_TOKEN"]; ok {
					t.Errorf("service %s: a gateway gets TOLLGATE_VIEWER_TOKEN", n)
				}
			}
			aggs := cm.running(binAggregator)
			if len(aggs) == 0 {
				t.Fatal("no aggregator")
			}
			for _, n := range aggs {
				s := cm.Services[n]
				cfg, err := aggregator.LoadConfig("", func(name string) (string, bool) { v, ok := s.Environment[name]; return v, ok })
				if err != nil {
					t.Fatalf("service %s: %v", n, err)
				}
				if cfg.ViewerToken != c.value {
					t.Errorf("service %s: viewer token %q, want .env's %q", n, cfg.ViewerToken, c.value)
				}
			}
		})
	}
}

// TestComposeAggregatorsShareGateways: the aggregators reach their
// region's gateways' Redis with the gateways' settings (the operator API
// reads and resets their counters there) and read the rules file the
// gateways read, from the same mount (it seeds NATS's rules bucket, and
// keys/{key} decides by it while NATS holds no ruleset).
func TestComposeAggregatorsShareGateways(t *testing.T) {
	forDeployments(t, func(t *testing.T, c *compose) {
		gateways := map[string]*service{} // TOLLGATE_REGION → a gateway of that region
		for _, n := range c.running(binGateway) {
			if r := c.Services[n].Environment["TOLLGATE_REGION"]; gateways[r] == nil {
				gateways[r] = c.Services[n]
			}
		}
		for _, n := range c.running(binAggregator) {
			s := c.Services[n]
			gw := gateways[s.Environment["TOLLGATE_REGION"]]
			if gw == nil {
				t.Errorf("service %s: no gateway in its region %q", n, s.Environment["TOLLGATE_REGION"])
				continue
			}
			for name, v := range gw.Environment {
				if strings.HasPrefix(name, "TOLLGATE_REDIS_") && s.Environment[name] != v {
					t.Errorf("service %s: %s=%q, but the gateways' is %q", n, name, s.Environment[name], v)
				}
			}
			file := s.Environment["TOLLGATE_RULES_FILE"]
			if file == "" || s.mountSource(file) == "" || s.mountSource(file) != gw.mountSource(gw.Environment["TOLLGATE_RULES_FILE"]) {
				t.Errorf("service %s: TOLLGATE_RULES_FILE %q is mounted from %q, want the gateways' rules file %q", n, file,
					s.mountSource(file), gw.mountSource(gw.Environment["TOLLGATE_RULES_FILE"]))
			}
		}
	})
}

// TestComposeRedisSentinel: the gateways reach Redis through the sentinels
// under the master name the sentinels monitor, and the sentinels monitor a
// primary that exists, with a quorum a majority of them can reach.
func TestComposeRedisSentinel(t *testing.T) {
	c := loadCompose(t, testEnv(t))
	var sentinels []string
	for _, n := range c.names() {
		if slices.ContainsFunc(c.Services[n].Command, func(s string) bool { return strings.Contains(s, "redis-sentinel") }) {
			sentinels = append(sentinels, n)
		}
	}
	if len(sentinels) < 3 {
		t.Fatalf("want at least three sentinels, have %v", sentinels)
	}
	var master string
	for _, n := range sentinels {
		conf := c.Services[n].mountSource("/etc/redis/sentinel.conf")
		if conf == "" {
			t.Fatalf("service %s: no sentinel.conf mounted at /etc/redis/sentinel.conf", n)
		}
		name, host, port, quorum := sentinelMonitor(t, conf)
		if master != "" && name != master {
			t.Errorf("sentinels monitor different masters: %s and %s", master, name)
		}
		master = name
		if msg := c.checkAddr(n, addr{host: host, port: port, where: conf + ": sentinel monitor"}); msg != "" {
			t.Error(msg)
		}
		if quorum <= len(sentinels)/2 || quorum > len(sentinels) {
			t.Errorf("%s: quorum %d of %d sentinels is not a majority", conf, quorum, len(sentinels))
		}
	}
	for _, n := range c.running(binGateway) {
		env := c.Services[n].Environment
		if env["TOLLGATE_REDIS_MODE"] != "sentinel" {
			t.Errorf("service %s: TOLLGATE_REDIS_MODE is %q, want sentinel", n, env["TOLLGATE_REDIS_MODE"])
			continue
		}
		if env["TOLLGATE_REDIS_MASTER_NAME"] != master {
			t.Errorf("service %s: TOLLGATE_REDIS_MASTER_NAME %q, but the sentinels monitor %q", n, env["TOLLGATE_REDIS_MASTER_NAME"], master)
		}
		var named []string
		for _, a := range strings.Split(env["TOLLGATE_REDIS_ADDRS"], ",") {
			host, _, _ := strings.Cut(strings.TrimSpace(a), ":")
			named = append(named, host)
		}
		slices.Sort(named)
		if !slices.Equal(named, sentinels) {
			t.Errorf("service %s: TOLLGATE_REDIS_ADDRS names %v, want every sentinel %v", n, named, sentinels)
		}
	}
}

// sentinelMonitor reads the `sentinel monitor NAME HOST PORT QUORUM` line.
func sentinelMonitor(t testing.TB, path string) (name, host, port string, quorum int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) == 6 && fs[0] == "sentinel" && fs[1] == "monitor" {
			q, err := strconv.Atoi(fs[5])
			if err != nil {
				t.Fatalf("%s: quorum %q", path, fs[5])
			}
			return fs[2], fs[3], fs[4], q
		}
	}
	t.Fatalf("%s: no `sentinel monitor` line", path)
	return
}

// TestComposeKafka: in each Kafka cluster (a region's; CLUSTER_ID) the
// brokers' node ids are unique, the controller quorum names each of them
// under its own id, and replication fits the brokers; every gateway and
// aggregator names every broker of one cluster.
func TestComposeKafka(t *testing.T) {
	forDeployments(t, func(t *testing.T, c *compose) {
		// Every cluster (CLUSTER_ID) on its own: a region's brokers.
		clusters := map[string][]string{} // cluster id → its nodes' services
		for _, n := range c.names() {
			if _, ok := c.Services[n].Environment["KAFKA_NODE_ID"]; ok {
				id := c.Services[n].Environment["CLUSTER_ID"]
				clusters[id] = append(clusters[id], n)
			}
		}
		if len(clusters[kafkaCluster]) < 3 {
			t.Fatalf("want at least three Kafka nodes in cluster %s (docker-compose.yml), have %v", kafkaCluster, clusters[kafkaCluster])
		}
		for cluster, brokers := range clusters {
			checkKafkaCluster(t, c, cluster, brokers)
		}
		for _, bin := range []string{binGateway, binAggregator} {
			for _, n := range c.running(bin) {
				var named []string
				for _, a := range strings.Split(c.Services[n].Environment["TOLLGATE_KAFKA_BROKERS"], ",") {
					host, _, _ := strings.Cut(a, ":")
					named = append(named, host)
				}
				slices.Sort(named)
				if !slices.ContainsFunc(slices.Collect(maps.Values(clusters)), func(b []string) bool { return slices.Equal(named, b) }) {
					t.Errorf("service %s: TOLLGATE_KAFKA_BROKERS names %v, want every node of one cluster %v", n, named, clusters)
				}
			}
		}
	})
}

// kafkaCluster is the CLUSTER_ID of docker-compose.yml's brokers.
const kafkaCluster = "boNMwQtBR2yMH4Nkq6i10g"

// checkKafkaCluster: the nodes of one Kafka cluster (brokers, sorted
// service names) have ids of their own, list each other as quorum voters
// and replicate no more than they can.
func checkKafkaCluster(t *testing.T, c *compose, cluster string, brokers []string) {
	t.Helper()
	ids := map[string]string{} // node id → service
	for _, n := range brokers {
		id := c.Services[n].Environment["KAFKA_NODE_ID"]
		if other := ids[id]; other != "" {
			t.Errorf("cluster %s: services %s and %s share KAFKA_NODE_ID %s", cluster, other, n, id)
		}
		ids[id] = n
	}
	for _, n := range brokers {
		env := c.Services[n].Environment
		voters := strings.Split(env["KAFKA_CONTROLLER_QUORUM_VOTERS"], ",")
		if len(voters) != len(brokers) {
			t.Errorf("service %s: quorum voters %v, want one per node %v", n, voters, brokers)
		}
		for _, v := range voters {
			id, hp, _ := strings.Cut(v, "@")
			host, _, _ := strings.Cut(hp, ":")
			if ids[id] != host {
				t.Errorf("service %s: voter %s: node %s is service %q", n, v, id, ids[id])
			}
		}
		for _, k := range []string{"KAFKA_DEFAULT_REPLICATION_FACTOR", "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"} {
			if rf, err := strconv.Atoi(env[k]); err != nil || rf > len(brokers) {
				t.Errorf("service %s: %s=%q: want at most %d (the nodes)", n, k, env[k], len(brokers))
			}
		}
	}
}

// promConfig is the part of prometheus.yml the tests read.
type promConfig struct {
	RuleFiles []string `yaml:"rule_files"`
	Alerting  struct {
		Alertmanagers []struct {
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"alertmanagers"`
	} `yaml:"alerting"`
	ScrapeConfigs []struct {
		JobName       string `yaml:"job_name"`
		StaticConfigs []struct {
			Targets []string `yaml:"targets"`
		} `yaml:"static_configs"`
	} `yaml:"scrape_configs"`
}

// TestPrometheusConfig: Prometheus scrapes every gateway and aggregator on
// its metrics port under the job names the dashboards use, its rule files
// and Alertmanager exist, and promtool accepts the file.
func TestPrometheusConfig(t *testing.T) {
	forDeployments(t, func(t *testing.T, c *compose) {
		prom := c.Services["prometheus"]
		if prom == nil {
			t.Fatal("no prometheus service")
		}
		var prometheusFile string
		for _, arg := range prom.Command {
			if p, ok := strings.CutPrefix(arg, "--config.file="); ok {
				prometheusFile = prom.mountSource(p)
			}
		}
		if prometheusFile == "" {
			t.Fatal("the prometheus service's --config.file is not mounted from this directory")
		}
		var pc promConfig
		readYAML(t, prometheusFile, &pc)
		for _, rf := range pc.RuleFiles {
			local := prom.mountSource(rf)
			if local == "" {
				t.Errorf("%s: rule file %s is not mounted into the prometheus service", prometheusFile, rf)
			} else if _, err := os.Stat(local); err != nil {
				t.Errorf("%s: rule file %s: %v", prometheusFile, rf, err)
			}
		}
		if !slices.ContainsFunc(pc.RuleFiles, func(rf string) bool { return prom.mountSource(rf) == filepath.Clean(alertsFile) }) {
			t.Errorf("%s does not load %s", prometheusFile, alertsFile)
		}
		jobs := map[string][]string{}
		for _, sc := range pc.ScrapeConfigs {
			for _, st := range sc.StaticConfigs {
				for _, tg := range st.Targets {
					jobs[sc.JobName] = append(jobs[sc.JobName], tg)
					host, port, _ := strings.Cut(tg, ":")
					if msg := c.checkAddr("prometheus", addr{host: host, port: port, where: prometheusFile + ": job " + sc.JobName}); msg != "" {
						t.Error(msg)
					}
				}
			}
		}
		for _, am := range pc.Alerting.Alertmanagers {
			for _, st := range am.StaticConfigs {
				for _, tg := range st.Targets {
					host, port, _ := strings.Cut(tg, ":")
					if msg := c.checkAddr("prometheus", addr{host: host, port: port, where: prometheusFile + ": alertmanagers"}); msg != "" {
						t.Error(msg)
					}
				}
			}
		}
		for _, want := range []struct{ job, bin, listen string }{
			{jobGateway, binGateway, "TOLLGATE_METRICS_LISTEN"},
			{jobAggregator, binAggregator, "TOLLGATE_AGGREGATOR_METRICS_LISTEN"},
		} {
			got := slices.Sorted(slices.Values(jobs[want.job]))
			exp := c.metricsTargets(t, want.bin, want.listen)
			if !slices.Equal(got, exp) {
				t.Errorf("%s: job %s scrapes %v, want every %s's metrics listener %v", prometheusFile, want.job, got, want.bin, exp)
			}
		}
		runTool(t, requireTool(t, "promtool"), nil, "check", "config", "--syntax-only", writeTemp(t, "prometheus.yml", prometheusConfigOf(t, c, prometheusFile, nil, "")))
	})
}

// TestAlertmanagerConfig: Alertmanager's file is mounted and routes to a
// receiver it defines.
func TestAlertmanagerConfig(t *testing.T) {
	c := loadCompose(t, testEnv(t))
	am := c.Services["alertmanager"]
	if am == nil {
		t.Fatal("no alertmanager service")
	}
	path := am.mountSource("/etc/alertmanager/alertmanager.yml")
	if path == "" {
		t.Fatal("alertmanager.yml is not mounted at /etc/alertmanager/alertmanager.yml")
	}
	var cfg struct {
		Route struct {
			Receiver string `yaml:"receiver"`
		} `yaml:"route"`
		Receivers []struct {
			Name string `yaml:"name"`
		} `yaml:"receivers"`
	}
	readYAML(t, path, &cfg)
	if !slices.ContainsFunc(cfg.Receivers, func(r struct {
		Name string `yaml:"name"`
	}) bool {
		return r.Name == cfg.Route.Receiver
	}) {
		t.Errorf("%s: route receiver %q is not among the receivers", path, cfg.Route.Receiver)
	}
}

// TestDockerfile: the image builds every binary from pinned bases, runs as
// a non-root user, and compose builds it from the repository root.
func TestDockerfile(t *testing.T) {
	data, err := os.ReadFile(dockerfile)
	if err != nil {
		t.Fatal(err)
	}
	var stages []string
	var lastUser, buildLine string
	var envNames []string
	// Join continuation lines, drop comments.
	text := strings.ReplaceAll(string(data), "\\\n", " ")
	for _, line := range strings.Split(text, "\n") {
		fs := strings.Fields(line)
		if len(fs) == 0 || strings.HasPrefix(fs[0], "#") {
			continue
		}
		switch strings.ToUpper(fs[0]) {
		case "FROM":
			if len(fs) < 2 {
				t.Fatalf("%s: %q", dockerfile, line)
			}
			if img := fs[1]; !slices.Contains(stages, img) && !pinnedImage.MatchString(img) {
				t.Errorf("%s: FROM %s is not pinned to an exact version", dockerfile, img)
			}
			if len(fs) == 4 && strings.EqualFold(fs[2], "AS") {
				stages = append(stages, fs[3])
			}
			lastUser = ""
		case "USER":
			lastUser = fs[1]
		case "RUN":
			if slices.Contains(fs, "go") && slices.Contains(fs, "build") {
				buildLine = line
			}
		case "COPY":
			if strings.HasPrefix(fs[1], "--from") {
				continue
			}
			for _, src := range fs[1 : len(fs)-1] {
				if strings.HasPrefix(src, "--") {
					continue
				}
				if _, err := os.Stat(filepath.Join(repoRoot, src)); err != nil {
					t.Errorf("%s: COPY %s: %v", dockerfile, src, err)
				}
			}
		case "ENV":
			for _, f := range fs[1:] {
				if name, _, ok := strings.Cut(f, "="); ok && strings.HasPrefix(name, configs.Prefix) {
					envNames = append(envNames, name)
				}
			}
		}
	}
	if user, _, _ := strings.Cut(lastUser, ":"); user == "" || user == "root" || user == "0" {
		t.Errorf("%s: the final stage runs as %q; want a non-root USER", dockerfile, lastUser)
	}
	for _, pkg := range []string{"./gateway/cmd/gateway", "./aggregator/cmd/aggregator", "./loadtest/cmd/loadtest"} {
		if !strings.Contains(buildLine, pkg) {
			t.Errorf("%s: the go build line does not build %s: %q", dockerfile, pkg, buildLine)
		}
		if files, _ := filepath.Glob(filepath.Join(repoRoot, pkg, "*.go")); len(files) == 0 {
			t.Errorf("%s builds %s, which holds no Go files", dockerfile, pkg)
		}
	}
	valid := varNames(t)
	for _, n := range envNames {
		if !valid[binGateway][n] && !valid[binAggregator][n] {
			t.Errorf("%s: ENV %s is a variable of neither the gateway nor the aggregator", dockerfile, n)
		}
	}
	c := loadCompose(t, testEnv(t))
	for _, n := range c.names() {
		b := c.Services[n].Build
		if b == nil {
			continue
		}
		if filepath.Clean(b.Context) != filepath.Clean(repoRoot) || filepath.Clean(filepath.Join(b.Context, b.Dockerfile)) != filepath.Clean(filepath.Join(repoRoot, "compose/deploy", dockerfile)) {
			t.Errorf("service %s: builds %s from %s, want compose/deploy/%s from the repository root %s", n, b.Dockerfile, b.Context, dockerfile, repoRoot)
		}
	}
	// The build context keeps what the build needs.
	ignore, err := os.ReadFile(dockerfile + ".dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	for _, pat := range strings.Split(string(ignore), "\n") {
		pat = strings.TrimSpace(pat)
		if pat == "" || strings.HasPrefix(pat, "#") || strings.HasPrefix(pat, "!") {
			continue
		}
		for _, need := range []string{"go.mod", "go.sum", "configs/rules.yaml", "gateway/cmd/gateway/main.go", "guard/redisstore/lua"} {
			if ok, _ := filepath.Match(pat, need); ok || strings.HasPrefix(need, strings.TrimSuffix(pat, "/")+"/") {
				t.Errorf("%s.dockerignore: %q excludes %s, which the build needs", dockerfile, pat, need)
			}
		}
	}
}

// writeTemp writes data to a new file named name in a temporary directory
// and returns its path.
func writeTemp(t testing.TB, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
