package deploy

import (
	"bytes"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/tollgate/tollgate/aggregator"
	"github.com/tollgate/tollgate/gateway"
	"github.com/tollgate/tollgate/internal/testnet"
)

// Files of the deployment, relative to this directory (go test's working
// directory), and the repository root the Dockerfile builds from.
const (
	composeFile    = "docker-compose.yml"
	regionsFile    = "docker-compose.regions.yml" // the second region, over composeFile
	natsConfigDir  = "nats"                       // the regions' NATS configuration files
	regionsRules   = "regions/rules.yaml"         // the rules both regions read
	dockerfile     = "Dockerfile"
	exampleEnvFile = "example.env"
	prometheusFile = "prometheus/prometheus.yml"
	// Prometheus of the two-region deployment (regionsFile).
	prometheusRegionsFile = "prometheus/prometheus.regions.yml"
	alertsFile            = "prometheus/alerts.yml"
	alertsTestFile        = "prometheus/alerts_test.yml"
	datasourceDir         = "grafana/provisioning/datasources"
	providerDir           = "grafana/provisioning/dashboards"
	dashboardsDir         = "grafana/dashboards"
	repoRoot              = "../.."
)

// Prometheus job names the dashboards and alerts select on.
const (
	jobGateway    = "tollgate-gateway"
	jobAggregator = "tollgate-aggregator"
)

// The Tollgate binaries the image holds; a service runs one, named first
// in its command.
const (
	binGateway    = "gateway"
	binAggregator = "aggregator"
	binLoadtest   = "loadtest"
)

// compose is docker-compose.yml after interpolation (with the variables of
// example.env set to test values) and merge keys.
type compose struct {
	Services map[string]*service
	Volumes  map[string]any
	// refs are the variables the file interpolates: name → whether a
	// reference without a default (${X}, ${X:?msg}) needs it.
	refs map[string]bool
}

// service is one service, with the compose fields this deployment uses.
// Decoding refuses any other field, so a misspelt key (say "enviroment",
// which compose would reject too, or worse, a nested one it would ignore)
// fails the test; add a field here when the deployment needs a new key.
type service struct {
	Image       string       `yaml:"image"`
	Build       *build       `yaml:"build"`
	Hostname    string       `yaml:"hostname"`
	Command     stringList   `yaml:"command"`
	Entrypoint  stringList   `yaml:"entrypoint"`
	Environment envMap       `yaml:"environment"`
	Expose      stringList   `yaml:"expose"`
	Ports       stringList   `yaml:"ports"`
	Volumes     stringList   `yaml:"volumes"`
	DependsOn   dependsOn    `yaml:"depends_on"`
	Healthcheck *healthcheck `yaml:"healthcheck"`
	Profiles    stringList   `yaml:"profiles"`
	Restart     string       `yaml:"restart"`
	User        string       `yaml:"user"`
	ReadOnly    bool         `yaml:"read_only"`
	Tmpfs       stringList   `yaml:"tmpfs"`
	CapDrop     stringList   `yaml:"cap_drop"`
	SecurityOpt stringList   `yaml:"security_opt"`
}

type build struct {
	Context    string `yaml:"context"`
	Dockerfile string `yaml:"dockerfile"`
}

type healthcheck struct {
	Test        stringList `yaml:"test"`
	Interval    string     `yaml:"interval"`
	Timeout     string     `yaml:"timeout"`
	Retries     int        `yaml:"retries"`
	StartPeriod string     `yaml:"start_period"`
}

// stringList is a compose field written as one string or a list.
type stringList []string

func (l *stringList) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		*l = stringList{n.Value}
		return nil
	case yaml.SequenceNode:
		out := make(stringList, 0, len(n.Content))
		for _, c := range n.Content {
			if c.Kind != yaml.ScalarNode {
				return fmt.Errorf("line %d: list item is not a scalar", c.Line)
			}
			out = append(out, c.Value)
		}
		*l = out
		return nil
	}
	return fmt.Errorf("line %d: want a string or a list", n.Line)
}

// envMap is `environment`, written as a mapping or a list of NAME=value.
type envMap map[string]string

func (m *envMap) UnmarshalYAML(n *yaml.Node) error {
	out := envMap{}
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			out[n.Content[i].Value] = n.Content[i+1].Value
		}
	case yaml.SequenceNode:
		for _, c := range n.Content {
			k, v, _ := strings.Cut(c.Value, "=")
			out[k] = v
		}
	default:
		return fmt.Errorf("line %d: environment must be a mapping or a list", n.Line)
	}
	*m = out
	return nil
}

// dependsOn is `depends_on`: service name → condition.
type dependsOn map[string]string

func (d *dependsOn) UnmarshalYAML(n *yaml.Node) error {
	out := dependsOn{}
	switch n.Kind {
	case yaml.SequenceNode:
		for _, c := range n.Content {
			out[c.Value] = "service_started"
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			var v struct {
				Condition string `yaml:"condition"`
				Restart   bool   `yaml:"restart"`
				Required  *bool  `yaml:"required"`
			}
			if err := n.Content[i+1].Decode(&v); err != nil {
				return err
			}
			if v.Condition == "" {
				v.Condition = "service_started"
			}
			out[n.Content[i].Value] = v.Condition
		}
	default:
		return fmt.Errorf("line %d: depends_on must be a list or a mapping", n.Line)
	}
	*d = out
	return nil
}

// testEnv returns a value for every variable example.env names, as a user
// would set them in .env: long enough for every secret.
func testEnv(t testing.TB) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, name := range exampleEnvNames(t) {
		env[name] = "test-" + strings.ToLower(name) + "-0123456789abcdef"
	}
	return env
}

// exampleEnvNames returns the variables example.env names, in order.
func exampleEnvNames(t testing.TB) []string {
	t.Helper()
	names, _ := testnet.EnvFile(t, exampleEnvFile)
	return names
}

// loadCompose reads docker-compose.yml, or the files given, merged in order
// as docker compose -f a -f b merges them (mergeServices), with env as the
// variables compose interpolates (.env). It fails the test on anything
// compose would refuse that this model can see: an unknown top-level or
// service key, a required variable that is not set.
func loadCompose(t testing.TB, env map[string]string, files ...string) *compose {
	t.Helper()
	if len(files) == 0 {
		files = []string{composeFile}
	}
	c := &compose{refs: map[string]bool{}, Volumes: map[string]any{}}
	merged := map[string]any{}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var doc map[string]any
		if err := yaml.Unmarshal(data, &doc); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		for k := range doc {
			if !strings.HasPrefix(k, "x-") && !slices.Contains([]string{"name", "services", "volumes", "networks"}, k) {
				t.Errorf("%s: unknown top-level key %q", file, k)
			}
		}
		in := &interpolator{env: env, refs: c.refs}
		services, _ := in.walk(doc["services"]).(map[string]any)
		for _, err := range in.errs {
			t.Errorf("%s: %v", file, err)
		}
		mergeServices(merged, services)
		if vols, ok := doc["volumes"].(map[string]any); ok {
			maps.Copy(c.Volumes, vols)
		}
	}
	// Re-encode the interpolated, merged services and decode them strictly.
	raw, err := yaml.Marshal(merged)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(&c.Services); err != nil {
		t.Fatalf("%s: services: %v", strings.Join(files, " + "), err)
	}
	if len(c.Services) == 0 {
		t.Fatalf("%s: no services", strings.Join(files, " + "))
	}
	return c
}

// deployments are the ways this directory is started: the compose files
// each passes to docker compose -f, in order.
var deployments = []struct {
	name  string
	files []string
}{
	{"one region", []string{composeFile}},
	{"two regions", []string{composeFile, regionsFile}},
}

// forDeployments runs check on every deployment, each a subtest.
func forDeployments(t *testing.T, check func(t *testing.T, c *compose)) {
	t.Helper()
	for _, d := range deployments {
		t.Run(d.name, func(t *testing.T) { check(t, loadCompose(t, testEnv(t), d.files...)) })
	}
}

// mergeServices merges the services of a later compose file into dst the
// way docker compose merges -f files: a new service is added; for one that
// exists, mappings (environment, depends_on, healthcheck, build) are merged
// key by key, volumes by their target path, expose and ports appended
// without duplicates, and any other key replaced (command, image, …).
func mergeServices(dst, over map[string]any) {
	for name, v := range over {
		o, _ := v.(map[string]any)
		base, ok := dst[name].(map[string]any)
		if !ok || o == nil {
			dst[name] = v
			continue
		}
		out := maps.Clone(base)
		for k, ov := range o {
			bm, bok := base[k].(map[string]any)
			om, ook := ov.(map[string]any)
			switch {
			case k == "volumes":
				out[k] = mergeVolumes(base[k], ov)
			case k == "expose" || k == "ports":
				list, _ := base[k].([]any)
				list = slices.Clone(list)
				add, _ := ov.([]any)
				for _, x := range add {
					if !slices.Contains(list, x) {
						list = append(list, x)
					}
				}
				out[k] = list
			case bok && ook:
				m := maps.Clone(bm)
				maps.Copy(m, om)
				out[k] = m
			default:
				out[k] = ov
			}
		}
		dst[name] = out
	}
}

// mergeVolumes merges two services' volume lists: a later mount replaces
// the one at the same target.
func mergeVolumes(base, over any) []any {
	target := func(v any) string {
		s, _ := v.(string)
		_, dst, _ := strings.Cut(s, ":")
		dst, _, _ = strings.Cut(dst, ":")
		return dst
	}
	bl, _ := base.([]any)
	ol, _ := over.([]any)
	out := slices.Clone(bl)
	for _, v := range ol {
		if i := slices.IndexFunc(out, func(b any) bool { return target(b) == target(v) }); i >= 0 {
			out[i] = v
		} else {
			out = append(out, v)
		}
	}
	return out
}

// interpolator applies compose's variable syntax to every string: $$, $X,
// ${X}, ${X:-default}, ${X-default}, ${X:?message}, ${X?message}.
type interpolator struct {
	env  map[string]string
	refs map[string]bool
	errs []error
}

var varRef = regexp.MustCompile(`\$(?:(\$)|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))`)

func (in *interpolator) walk(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, x := range v {
			out[k] = in.walk(x)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = in.walk(x)
		}
		return out
	case string:
		return in.expand(v)
	}
	return v
}

func (in *interpolator) expand(s string) string {
	return varRef.ReplaceAllStringFunc(s, func(m string) string {
		g := varRef.FindStringSubmatch(m)
		if g[1] == "$" {
			return "$"
		}
		name, op, arg := g[2], g[3], g[4]
		if name == "" {
			name = g[5]
		}
		val, set := in.env[name]
		required := op == "" || op == ":?" || op == "?"
		in.refs[name] = in.refs[name] || required
		switch op {
		case ":-":
			if val == "" {
				return arg
			}
		case "-":
			if !set {
				return arg
			}
		case ":?", "?":
			if !set || (op == ":?" && val == "") {
				in.errs = append(in.errs, fmt.Errorf("variable %s is required: %s", name, arg))
			}
		}
		return val
	})
}

// binary returns the Tollgate binary a service runs ("" for other images).
func (s *service) binary() string {
	if s.Build == nil || len(s.Command) == 0 {
		return ""
	}
	return s.Command[0]
}

// exposes reports whether the service declares container port p.
func (s *service) exposes(p string) bool { return slices.Contains(s.Expose, p) }

// mountSource returns the local path (relative to this directory) that a
// bind mount puts at container path p, or "" when none does.
func (s *service) mountSource(p string) string {
	best, bestDst := "", ""
	for _, v := range s.Volumes {
		src, dst, _ := strings.Cut(v, ":")
		dst, _, _ = strings.Cut(dst, ":")
		if !strings.HasPrefix(src, ".") {
			continue
		}
		if (p == dst || strings.HasPrefix(p, strings.TrimSuffix(dst, "/")+"/")) && len(dst) > len(bestDst) {
			best, bestDst = filepath.Join(src, strings.TrimPrefix(p, dst)), dst
		}
	}
	return best
}

// volumeAt returns the source (a local path or a named volume) of the
// mount that holds container path p, and its target; "" when none does.
func (s *service) volumeAt(p string) (src, dst string) {
	for _, v := range s.Volumes {
		vs, vd, _ := strings.Cut(v, ":")
		vd, _, _ = strings.Cut(vd, ":")
		if (p == vd || strings.HasPrefix(p, strings.TrimSuffix(vd, "/")+"/")) && len(vd) > len(dst) {
			src, dst = vs, vd
		}
	}
	return src, dst
}

// names returns the service names in order.
func (c *compose) names() []string {
	out := make([]string, 0, len(c.Services))
	for n := range c.Services {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// running returns the names of the services that run binary bin.
func (c *compose) running(bin string) []string {
	var out []string
	for _, n := range c.names() {
		if c.Services[n].binary() == bin {
			out = append(out, n)
		}
	}
	return out
}

// lookup resolves a host name the way the compose network does: a service
// name or a service's hostname.
func (c *compose) lookup(host string) (string, *service) {
	if s, ok := c.Services[host]; ok {
		return host, s
	}
	for _, n := range c.names() {
		if c.Services[n].Hostname == host {
			return n, c.Services[n]
		}
	}
	return "", nil
}

// varNames returns the TOLLGATE_* variables each binary reads.
func varNames(t testing.TB) map[string]map[string]bool {
	t.Helper()
	out := map[string]map[string]bool{}
	gv, err := gateway.Vars()
	if err != nil {
		t.Fatal(err)
	}
	av, err := aggregator.Vars()
	if err != nil {
		t.Fatal(err)
	}
	out[binGateway], out[binAggregator] = map[string]bool{}, map[string]bool{}
	for _, v := range gv {
		out[binGateway][v.Name] = true
	}
	for _, v := range av {
		out[binAggregator][v.Name] = true
	}
	// loadtest reads the gateway's names for what it shares with it (the
	// check API token, Redis credentials), never names of its own.
	out[binLoadtest] = out[binGateway]
	return out
}

// hostPort matches host:port tokens in strings (URLs, address lists,
// quorum voters such as 1@kafka-1:9093).
var hostPort = regexp.MustCompile(`([A-Za-z0-9][A-Za-z0-9.-]*):([0-9]{1,5})\b`)

// serviceName matches what could be a compose service name (no dots: a
// host with dots is outside the deployment).
var serviceName = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)

// addr is one host:port found in a service's configuration.
type addr struct {
	host, port string
	where      string // for messages
}

// addrs returns the host:port tokens of strs.
func addrs(where string, strs ...string) []addr {
	var out []addr
	for _, s := range strs {
		for _, m := range hostPort.FindAllStringSubmatch(s, -1) {
			out = append(out, addr{host: m[1], port: m[2], where: where})
		}
	}
	return out
}

// checkAddr checks that a is reachable from service from: a loopback
// address is the service's own exposed port; a service name must exist and
// expose the port. It returns "" when a is fine or not in the deployment.
func (c *compose) checkAddr(from string, a addr) string {
	self := c.Services[from]
	ip := net.ParseIP(a.host)
	switch {
	case a.host == "localhost" || (ip != nil && ip.IsLoopback()):
		if !self.exposes(a.port) {
			return fmt.Sprintf("%s: %s:%s is this service's own port %s, which it does not expose (expose: %v)", a.where, a.host, a.port, a.port, self.Expose)
		}
	case ip != nil:
		// A listener's bind address (0.0.0.0:8080) or an outside address.
	case serviceName.MatchString(a.host):
		name, target := c.lookup(a.host)
		if target == nil {
			return fmt.Sprintf("%s: %s:%s names no service (services: %v)", a.where, a.host, a.port, c.names())
		}
		if !target.exposes(a.port) {
			return fmt.Sprintf("%s: %s:%s: service %s does not expose port %s (expose: %v)", a.where, a.host, a.port, name, a.port, target.Expose)
		}
	}
	return ""
}

// listenPort returns the port of a listen address bound to every
// interface, or an error.
func listenPort(v string) (string, error) {
	host, port, err := net.SplitHostPort(v)
	if err != nil {
		return "", err
	}
	if host != "" && host != "0.0.0.0" && host != "::" {
		return "", fmt.Errorf("%q binds %s only: other containers cannot reach it", v, host)
	}
	if _, err := strconv.Atoi(port); err != nil {
		return "", fmt.Errorf("%q: port %q", v, port)
	}
	return port, nil
}

// metricsTargets returns the host:port Prometheus should scrape for every
// service running bin: the service name and its metrics listener's port.
func (c *compose) metricsTargets(t testing.TB, bin, listenVar string) []string {
	t.Helper()
	var out []string
	for _, n := range c.running(bin) {
		port, err := listenPort(c.Services[n].Environment[listenVar])
		if err != nil {
			t.Errorf("service %s: %s: %v", n, listenVar, err)
			continue
		}
		out = append(out, n+":"+port)
	}
	return out
}

// readYAML decodes the YAML file at path into v.
func readYAML(t testing.TB, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
