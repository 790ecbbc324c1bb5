package configs

import (
	"fmt"
	"slices"
	"strings"
)

// Tools lists the TOLLGATE_* variables read outside the binaries'
// configurations: by scripts, the local stack's starters and the tests.
// Binaries accept them so that one shell environment serves everything.
var tools = []string{
	"TOLLGATE_REDIS_SERVER",              // compose/redisserver: redis-server binary to run
	"TOLLGATE_NO_INSTALL",                // scripts/install-deps.sh: check only
	"TOLLGATE_TEST_LOG",                  // tests: log to stderr
	"TOLLGATE_AGGREGATOR_TEST_PROCESS",   // aggregator tests: child process
	"TOLLGATE_REDISSERVER_ORPHAN_HELPER", // compose/redisserver tests: child process
	"TOLLGATE_SPOOL_LOCK_HELPER",         // gateway/internal/spool tests: child process
	"TOLLGATE_EVENTS_CHILD",              // gateway/internal/events tests: child process
	"TOLLGATE_STACK_ENV_FILE",            // reserved: where make run writes bin/stack.env
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
		if !strings.HasPrefix(name, Prefix) || slices.Contains(known, name) || slices.Contains(tools, name) {
			continue
		}
		msg := fmt.Sprintf("unknown variable %s", name)
		if c := closest(name, append(slices.Clone(known), tools...)); c != "" {
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
