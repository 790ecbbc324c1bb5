package stack_test

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/compose/redisserver"
	"github.com/tollgate/tollgate/compose/stack"
)

// localStackDoc is the page that documents make run.
const localStackDoc = "../../docs/local-stack.md"

// docSection returns the lines of a page's section, from its heading to
// the next heading of its level or above (headings in code blocks do not
// count).
func docSection(t *testing.T, page, heading string) []string {
	t.Helper()
	level := strings.Index(heading, " ")
	var out []string
	in, block := false, false
	for _, line := range strings.Split(page, "\n") {
		if strings.HasPrefix(line, "```") {
			block = !block
		}
		if !block {
			if line == heading {
				in = true
				continue
			}
			if h := len(line) - len(strings.TrimLeft(line, "#")); in && h >= 1 && h <= level && strings.HasPrefix(line[h:], " ") {
				break
			}
		}
		if in {
			out = append(out, line)
		}
	}
	if !in {
		t.Fatalf("no %q section", heading)
	}
	return out
}

var (
	varRE     = regexp.MustCompile("`(TOLLGATE_[A-Z0-9_]+\\*?)`")
	literalRE = regexp.MustCompile("`([^`]*)`")
)

// TestLocalStackDocVariables checks that docs/local-stack.md's table of
// the variables make run reads lists them all, and no other, with their
// defaults: it names the stack's configuration (stack.Vars) and the
// redis-server path, a wildcard standing for every variable it prefixes.
func TestLocalStackDocVariables(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile(localStackDoc)
	if err != nil {
		t.Fatal(err)
	}
	vars, err := stack.Vars()
	if err != nil {
		t.Fatal(err)
	}
	defaults := map[string]string{redisserver.EnvServer: ""}
	for _, v := range vars {
		defaults[v.Name] = v.Default
	}
	documented := map[string]bool{}
	for _, line := range docSection(t, string(src), "## Variables") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(line, "|")
		if len(cells) < 4 {
			t.Fatalf("table row %q has fewer than three cells", line)
		}
		var names []string
		for _, m := range varRE.FindAllStringSubmatch(cells[1], -1) {
			name := m[1]
			if prefix, ok := strings.CutSuffix(name, "*"); ok {
				n := 0
				for v := range defaults {
					if strings.HasPrefix(v, prefix) {
						documented[v] = true
						n++
					}
				}
				if n == 0 {
					t.Errorf("%s stands for no variable of make run", name)
				}
				continue
			}
			if _, ok := defaults[name]; !ok {
				t.Errorf("%s is documented but make run does not read it", name)
			}
			documented[name] = true
			names = append(names, name)
		}
		// Literal defaults, one per variable of the row, must be the
		// configuration's.
		lits := literalRE.FindAllStringSubmatch(cells[2], -1)
		if len(lits) != len(names) {
			continue // prose: generated, the aggregator's, …
		}
		for i, name := range names {
			if want := defaults[name]; want != "" && lits[i][1] != want {
				t.Errorf("%s: documented default %q, make run's is %q", name, lits[i][1], want)
			}
		}
	}
	var missing []string
	for v := range defaults {
		if !documented[v] {
			missing = append(missing, v)
		}
	}
	slices.Sort(missing)
	if len(missing) > 0 {
		t.Errorf("docs/local-stack.md's variables table misses %v", missing)
	}
}

// checkBannerSample checks that the banner docs/local-stack.md shows is
// the one a stack prints, up to its "Try it:" line: r's banner with its
// addresses put back to make run's defaults, its rules file and join file
// to make run's, its secrets and Redis port to the page's.
func checkBannerSample(t *testing.T, r *running, cfg stack.Config) {
	t.Helper()
	src, err := os.ReadFile(localStackDoc)
	if err != nil {
		t.Fatal(err)
	}
	var sample []string
	lines := docSection(t, string(src), "## Try it")
	for i, line := range lines {
		if line == "```" && i+1 < len(lines) && strings.HasPrefix(lines[i+1], "Tollgate is running.") {
			for _, l := range lines[i+1:] {
				if l == "```" {
					break
				}
				sample = append(sample, l)
			}
			break
		}
	}
	if len(sample) < 2 || (sample[len(sample)-1] != "…" && sample[len(sample)-1] != "...") {
		t.Fatalf("docs/local-stack.md: no banner sample (a code block from \"Tollgate is running.\" to \"Try it:\" and \"…\"): %q", sample)
	}
	sample = sample[:len(sample)-1]
	value := func(label string) string {
		for _, l := range sample {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(l), label); ok {
				return strings.Fields(rest)[0]
			}
		}
		t.Fatalf("the banner sample has no %q line", label)
		return ""
	}
	var def stack.Config
	def.SetDefaults()
	host := func(a string) string { return strings.TrimPrefix(a, "nats://") }
	ports := map[string]string{
		r.addrs.Proxy: def.Listen, r.addrs.API: def.APIListen, r.addrs.Metrics: def.MetricsListen, r.addrs.GRPC: def.GRPCListen,
		r.addrs.Demo: def.DemoListen, r.addrs.Kafka: def.KafkaListen, host(r.addrs.NATS): host(def.NATSListen),
		r.addrs.Aggregator: def.AggregatorListen, r.addrs.AggregatorMetrics: def.AggregatorMetricsListen, r.addrs.Redis: value("redis"),
	}
	banner := loopbackRE.ReplaceAllStringFunc(r.banner.String(), func(a string) string {
		if d, ok := ports[a]; ok {
			return d
		}
		return a
	})
	banner = strings.NewReplacer(
		bannerValue(t, banner, "key secret"), value("key secret"), bannerValue(t, banner, "admin token"), value("admin token"),
		bannerValue(t, banner, "viewer token"), value("viewer token"), bannerValue(t, banner, "console"), value("console"),
		cfg.RulesFile, def.RulesFile, cfg.EnvFile, def.EnvFile,
	).Replace(banner)
	head, _, ok := strings.Cut(strings.TrimLeft(banner, "\n"), "\nTry it:\n")
	if !ok {
		t.Fatalf("the banner has no \"Try it:\" line:\n%s", banner)
	}
	if got, want := head+"\nTry it:", strings.Join(sample, "\n"); got != want {
		t.Errorf("docs/local-stack.md's banner sample is not the banner make run prints; with make run's addresses it is:\n%s\n\nthe page shows:\n%s", got, want)
	}
}
