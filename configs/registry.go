package configs

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// Tool is a TOLLGATE_* variable read outside the binaries' configurations.
type Tool struct {
	Name string
	// Doc says who reads it and what for.
	Doc string
}

// tools lists the TOLLGATE_* variables read outside the binaries'
// configurations: by scripts, the local stack's starters and the tests.
// Binaries accept them so that one shell environment serves everything.
// A test scans the repository: a TOLLGATE_* name read anywhere that is
// neither here nor in the registry fails it, and so does an entry here
// that nothing reads.
var tools = []Tool{
	{"TOLLGATE_REDIS_SERVER", "The redis-server binary tests and `make run` start (compose/redisserver); default: redis-server on PATH."},
	{"TOLLGATE_CHROMIUM", "The Chromium binary the browser tests drive; default: chromium on PATH."},
	{"TOLLGATE_NO_INSTALL", "Set: scripts/install-deps.sh (`make deps`, `make test`) only checks what is missing and prints the install command."},
	{"TOLLGATE_TEST_LOG", "Set: tests log to stderr instead of discarding their logs."},
	{"TOLLGATE_TEST_REPORT_DIR", "A directory where the loadtest report test keeps its HTML page and screenshot."},
	{"TOLLGATE_AGGREGATOR_TEST_PROCESS", "Internal: marks the aggregator tests' child processes."},
	{"TOLLGATE_REDISSERVER_ORPHAN_HELPER", "Internal: marks compose/redisserver's test child processes."},
	{"TOLLGATE_SPAWN_ORPHAN_HELPER", "Internal: marks internal/spawn's test child processes."},
	{"TOLLGATE_SPOOL_LOCK_HELPER", "Internal: marks gateway/internal/spool's test child processes."},
	{"TOLLGATE_EVENTS_HELPER", "Internal: marks gateway/internal/events' test child processes."},
	{"TOLLGATE_EVENTS_BROKERS", "Internal: the brokers gateway/internal/events' test child processes produce to."},
	{"TOLLGATE_EVENTS_SPOOL", "Internal: the spool directory of gateway/internal/events' test child processes."},
	{"TOLLGATE_PIPELINE_GATEWAY_CHILD", "Internal: marks compose/pipeline's gateway child processes."},
	{"TOLLGATE_PIPELINE_AGGREGATOR_CHILD", "Internal: marks compose/pipeline's aggregator child processes."},
}

// Tools returns the variables read outside the binaries' configurations
// (scripts, starters, tests), which every binary accepts too.
func Tools() []Tool { return slices.Clone(tools) }

// Family is a family of TOLLGATE_* variables that no binary reads but
// every binary accepts, one per region, say: bin/stack.env's per-region
// addresses.
type Family struct {
	// Name is the family as the docs write it: TOLLGATE_STACK_<R>_PROXY.
	Name string
	// Doc says what each member holds.
	Doc string
	re  *regexp.Regexp
}

// Match reports whether name is a member of the family.
func (f Family) Match(name string) bool { return f.re.MatchString(name) }

// region is a region of the local stack in a variable's name: R1, R2, …
const region = `R[1-9][0-9]*`

// families lists the families of variables. The local stack writes them
// into bin/stack.env for scripts and people (curl "$TOLLGATE_STACK_R2_PROXY/…"):
// the variable registry does not hold them, as their names depend on how
// many regions the stack runs.
var families = []Family{
	{"TOLLGATE_STACK_<R>_PROXY", "Written by `make run` into bin/stack.env, one per region (R1, R2, …): the base URL of region R's gateway proxy.",
		regexp.MustCompile(`^TOLLGATE_STACK_` + region + `_PROXY$`)},
	{"TOLLGATE_STACK_<R>_CHECK_API", "Written by `make run` into bin/stack.env, one per region: the base URL of region R's gateway check API (POST /v1/check).",
		regexp.MustCompile(`^TOLLGATE_STACK_` + region + `_CHECK_API$`)},
	{"TOLLGATE_STACK_<R>_AGGREGATOR", "Written by `make run` into bin/stack.env, one per region: the base URL of region R's aggregator (operator API, usage reports, console).",
		regexp.MustCompile(`^TOLLGATE_STACK_` + region + `_AGGREGATOR$`)},
	{"TOLLGATE_STACK_<R>_LINK", "Written by `make run` into bin/stack.env, one per region: the base URL of the control API of region R's link to the other regions (GET / its state, POST /latency?ms=N, POST /cut, POST /heal).",
		regexp.MustCompile(`^TOLLGATE_STACK_` + region + `_LINK$`)},
}

// Families returns the families of variables every binary accepts.
func Families() []Family { return slices.Clone(families) }

// inFamily reports whether name is a member of a family.
func inFamily(name string) bool {
	return slices.ContainsFunc(families, func(f Family) bool { return f.Match(name) })
}

// Accepted reports whether a binary accepts name in its environment,
// given the registry (known): a binary's variable, a tool's or a
// family's member.
func Accepted(name string, known []string) bool {
	return slices.Contains(known, name) || isTool(name) || inFamily(name)
}

func isTool(name string) bool {
	return slices.ContainsFunc(tools, func(t Tool) bool { return t.Name == name })
}

// CheckEnv refuses TOLLGATE_* variables in environ (os.Environ) that no
// Tollgate binary or tool knows — known lists the variables of every
// binary (the registry: see Registry) — naming the variable and the
// closest valid name, as the YAML loader refuses unknown fields. A
// variable meant for another binary is accepted: one environment
// (bin/stack.env) serves the gateway and the aggregator alike.
func CheckEnv(environ []string, known []string) error {
	var bad []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, Prefix) || Accepted(name, known) {
			continue
		}
		msg := fmt.Sprintf("unknown variable %s", name)
		candidates := slices.Clone(known)
		for _, t := range tools {
			candidates = append(candidates, t.Name)
		}
		if c := closest(name, candidates); c != "" {
			msg += fmt.Sprintf(" (did you mean %s?)", c)
		}
		bad = append(bad, msg)
	}
	if len(bad) == 0 {
		return nil
	}
	slices.Sort(bad)
	return fmt.Errorf("configs: %s; no Tollgate binary reads it, so a typo would silently change nothing (--help lists every variable)", strings.Join(bad, "; "))
}

// closest returns the known name nearest to name by edit distance, if it
// is near enough to be a likely typo.
func closest(name string, known []string) string {
	best, bestD := "", len(name)/2+1
	for _, k := range known {
		if d := distance(name, k); d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

// distance is the Levenshtein distance between a and b.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// Registry returns every variable the Tollgate binaries read (gateway,
// aggregator, the local stack), sorted. It is generated from their Config
// structs (registry_gen.go); a test in this package regenerates it and
// fails when it is stale (go test ./configs -run TestRegistry -update).
func Registry() []string { return slices.Clone(registry) }
