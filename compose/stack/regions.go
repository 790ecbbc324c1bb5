package stack

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate/tollgate/compose/linkproxy"
	"github.com/tollgate/tollgate/compose/natsserver"
	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/internal/service"
)

// regionKey is the log attribute naming a line's region when the stack
// runs several.
const regionKey = "region"

// linkTimeout bounds the wait, at start, for the regions' leafnode
// connections.
const linkTimeout = 15 * time.Second

// region is one region of the stack: with one region, the stack itself.
type region struct {
	name      string // r1, r2, …; "" when the stack runs one region (the gateway's default region)
	cfg       Config // the stack's configuration with this region's listeners
	log       *slog.Logger
	dataDir   string
	rulesFile string // the rules the aggregator seeds NATS from

	// Written while the region starts, before Ready is closed.
	nats      *natsserver.Server
	leafAddr  string          // the hub's leafnode listener, host:port (r1 of several)
	link      *linkproxy.Link // this region's link to the others (several regions)
	addrs     Addrs
	redisKind string
	redisDL   string
	console   string
}

// id names the region's gateway and aggregator in metrics and logs.
func (r *region) id() string {
	if r.name == "" {
		return gatewayID
	}
	return r.name
}

// partName is how an error names one of the region's parts.
func (r *region) partName(p string) string {
	if r.name == "" {
		return p
	}
	return "region " + r.name + "'s " + p
}

// plan lays out the regions: with one, the stack as configured; with
// several, r1 on the configured addresses and the others on free ports,
// each with its own data directory, all seeding the rules from a copy of
// rules_file whose regions list names them.
func (s *Stack) plan(dataDir string) ([]*region, error) {
	if s.cfg.Regions <= 1 {
		return []*region{{cfg: s.cfg, log: s.log, dataDir: dataDir, rulesFile: s.cfg.RulesFile}}, nil
	}
	names := make([]string, s.cfg.Regions)
	for i := range names {
		names[i] = "r" + strconv.Itoa(i+1)
	}
	rules := filepath.Join(dataDir, "rules.yaml")
	if err := writeRegionRules(s.cfg.RulesFile, rules, names); err != nil {
		return nil, err
	}
	var out []*region
	for i, name := range names {
		c := s.cfg
		if i > 0 {
			free := "127.0.0.1:0"
			c.Listen, c.APIListen, c.MetricsListen, c.GRPCListen, c.DemoListen = free, free, free, free, free
			c.KafkaListen, c.NATSListen, c.AggregatorListen, c.AggregatorMetricsListen = free, "nats://"+free, free, free
		}
		dir := filepath.Join(dataDir, name)
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, fmt.Errorf("stack: data dir of region %s: %w", name, err)
		}
		out = append(out, &region{name: name, cfg: c, log: s.log.With(slog.String(regionKey, name)), dataDir: dir, rulesFile: rules})
	}
	return out, nil
}

// writeRegionRules copies the rules file src to dst with its top-level
// regions list replaced by names, equal weights (none given), so that a
// rule marked regions: global is split between the stack's regions. The
// rest of the file is copied as written.
func writeRegionRules(src, dst string, names []string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("stack: rules file: %w", err)
	}
	if err := os.WriteFile(dst, regionRules(b, names), 0o600); err != nil {
		return fmt.Errorf("stack: the regions' rules file: %w", err)
	}
	return nil
}

// regionRules is a rules file with its top-level regions list (the first,
// in whatever form) replaced by names, or the list added at its end.
func regionRules(b []byte, names []string) []byte {
	var list strings.Builder
	list.WriteString("regions:                         # written by make run for TOLLGATE_STACK_REGIONS: equal shares\n")
	for _, n := range names {
		fmt.Fprintf(&list, "  - {name: %s}\n", n)
	}
	lines := strings.SplitAfter(string(b), "\n")
	var out strings.Builder
	replaced, skipping := false, false
	var blanks strings.Builder // blank lines within or after the old list
	for _, line := range lines {
		blank := strings.TrimSpace(line) == ""
		top := !blank && line[0] != ' ' && line[0] != '\t'
		if skipping {
			switch {
			case blank:
				blanks.WriteString(line)
				continue
			case !top:
				blanks.Reset()
				continue // the old list's items
			}
			out.WriteString(blanks.String())
			blanks.Reset()
			skipping = false
		}
		if top && strings.HasPrefix(line, "regions:") && !replaced {
			out.WriteString(list.String())
			replaced, skipping = true, true
			continue
		}
		out.WriteString(line)
	}
	out.WriteString(blanks.String()) // the file ended in the list
	if !replaced {
		if out.Len() > 0 && !strings.HasSuffix(out.String(), "\n") {
			out.WriteString("\n")
		}
		out.WriteString("\n" + list.String())
	}
	return []byte(out.String())
}

// startLink starts region r's link proxy, forwarding to target (the hub's
// leafnode listener for r1, r1's link for the others), and appends its
// stop.
func (s *Stack) startLink(ctx context.Context, r *region, target string, stops *[]func() error) error {
	p, err := linkproxy.Start(ctx, linkproxy.Config{Name: r.name, Listen: "127.0.0.1:0", Target: target,
		ControlListen: "127.0.0.1:0", Logger: r.log.With(slog.String(partKey, "link"))})
	if err != nil {
		return fmt.Errorf("stack: region %s's link: %w", r.name, err)
	}
	*stops = append(*stops, p.Close)
	r.link = p
	return nil
}

// waitLinked waits until the hub's NATS server (r1's) has a leafnode
// connection from every other region's.
func (s *Stack) waitLinked(ctx context.Context, regions []*region) error {
	ctx, cancel := context.WithTimeout(ctx, linkTimeout)
	defer cancel()
	want := len(regions) - 1
	err := service.Poll(ctx, pollEvery, func() (bool, error) {
		n := regions[0].nats.Leafnodes()
		return n >= want, fmt.Errorf("%d of %d regions linked to r1", n, want)
	})
	if err != nil {
		return fmt.Errorf("stack: regions not linked within %v: %w", linkTimeout, err)
	}
	return nil
}

// Region is one region of a stack of several, as Regions reports it.
type Region struct {
	Name  string // r1, r2, …
	Addrs Addrs
	// Link is the control API of the region's link to the others
	// ("127.0.0.1:port"; docs/local-stack.md), LinkAddr the link itself.
	Link, LinkAddr string
	// Console is the region's console sign-in link.
	Console string
}

// Regions returns the regions once Ready is closed (one, named "", when
// the stack runs one region), and nil before.
func (s *Stack) Regions() []Region {
	select {
	case <-s.ready:
	default:
		return nil
	}
	var out []Region
	for _, r := range s.regions {
		reg := Region{Name: r.name, Addrs: r.addrs, Console: r.console}
		if r.link != nil {
			reg.Link, reg.LinkAddr = r.link.ControlAddr(), r.link.Addr()
		}
		out = append(out, reg)
	}
	return out
}

// envLines are a join file's lines for region r (the join variables).
func (s *Stack) joinLines(r *region) []string {
	lines := []string{
		configs.EnvName("redis.addrs") + "=" + r.addrs.Redis,
		configs.EnvName("redis.timeout") + "=" + r.redisDL,
		configs.EnvName("kafka.brokers") + "=" + dialable(r.addrs.Kafka),
		configs.EnvName("nats.url") + "=" + r.addrs.NATS,
		configs.EnvName("key_secret") + "=" + s.cfg.KeySecret,
		configs.EnvName("admin_token") + "=" + s.cfg.AdminToken,
		configs.EnvName("viewer_token") + "=" + s.cfg.ViewerToken,
	}
	if r.name != "" {
		lines = append(lines, configs.EnvName("region")+"="+r.name)
	}
	return lines
}

// regionLines are the per-region addresses bin/stack.env adds when the
// stack runs several regions: TOLLGATE_STACK_R1_PROXY and the like.
func (s *Stack) regionLines() []string {
	if len(s.regions) < 2 {
		return nil
	}
	var lines []string
	for _, r := range s.regions {
		v := configs.Prefix + "STACK_" + strings.ToUpper(r.name) + "_"
		lines = append(lines,
			v+"PROXY=http://"+dialable(r.addrs.Proxy),
			v+"CHECK_API=http://"+dialable(r.addrs.API),
			v+"AGGREGATOR=http://"+dialable(r.addrs.Aggregator),
			v+"LINK=http://"+r.link.ControlAddr())
	}
	return lines
}

// RegionEnvFile returns the join file of region name beside envFile
// (stack_env_file): bin/stack.env, r2: bin/stack.r2.env.
func RegionEnvFile(envFile, name string) string {
	ext := filepath.Ext(envFile)
	return strings.TrimSuffix(envFile, ext) + "." + name + ext
}

// natsOptions are the region's NATS options beyond its address and
// store: with several regions, its own server name and JetStream domain,
// and its leafnode link: r1 accepts the others' leafnode connections,
// which each makes through its own link proxy (then r1's).
func (r *region) natsOptions() []natsserver.Option {
	if r.name == "" {
		return nil
	}
	opts := []natsserver.Option{natsserver.WithDomain(r.name)}
	if r.link == nil { // r1, the hub
		return append(opts, natsserver.WithLeafnodeListen("127.0.0.1:0"))
	}
	return append(opts, natsserver.WithLeafnodeRemotes("nats-leaf://"+r.link.Addr()))
}
