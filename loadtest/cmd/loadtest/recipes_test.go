package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/compose/stack"
	"github.com/tollgate/tollgate/gateway"
	"github.com/tollgate/tollgate/internal/testnet"
	"github.com/tollgate/tollgate/loadtest"
)

// recipeDocs are the docs whose load-test recipes TestDocRecipes runs,
// from this package's directory.
var recipeDocs = []string{"../../../README.md", "../../../loadtest/README.md", "../../../docs/benchmarks.md"}

// recipeCheck is what one documented recipe must give: its headline,
// checked functionally (never a rate or a CPU figure: the machine is
// shared).
type recipeCheck struct {
	doc   string // the doc's path in the repository
	match string // a part of the command that names it in its doc
	// long runs the recipe for longer than documented instead of
	// shorter: the ladder needs seconds to climb, more on a loaded
	// machine under the race detector.
	long  bool
	check func(t checkT, r *recipeRun)
}

// checkT is what a headline check reports to: the test, or a first
// attempt's record.
type checkT interface {
	Helper()
	Errorf(format string, args ...any)
}

// attempt records a first attempt's failures instead of failing the test.
type attempt struct{ errs []string }

func (*attempt) Helper() {}
func (a *attempt) Errorf(format string, args ...any) {
	a.errs = append(a.errs, fmt.Sprintf(format, args...))
}

// recipeChecks holds every load-test recipe of the docs. A recipe in a
// doc without an entry here, or an entry without its recipe, fails the
// test: add the recipe's headline check when adding a recipe.
var recipeChecks = []recipeCheck{
	// README.md: the penalty ladder through make run.
	{doc: "README.md", match: `storm -pid "$STACK"`, check: stormReachesTop},

	// loadtest/README.md
	{doc: "loadtest/README.md", match: "-paths /v1/items,/v1/search -duration 5s -keys 10000 -dist zipf", check: all(noRejection, measured)},
	{doc: "loadtest/README.md", match: "-target check -workers 50 -keys 10000 -duration 30s", check: all(noRejection, measured)},
	{doc: "loadtest/README.md", match: "-target grpc -addr 127.0.0.1:8089 -domain edge", check: all(noRejection, measured)},
	{doc: "loadtest/README.md", match: "-rate 2000 -duration 20s -keys 100000 -dist zipf", check: noRejection},
	{doc: "loadtest/README.md", match: "-keys 1 -workers 20 -requests 500", check: all(noRejection, answered(500), fromLeases)},
	{doc: "loadtest/README.md", match: "-target check -requests 10000 -json -quiet", check: all(noRejection, latencyReported)},
	{doc: "loadtest/README.md", match: "-keys 200 -dist zipf -duration 10s -report run.html", check: all(noRejection, reportDrawn)},
	{doc: "loadtest/README.md", match: `-method POST -body '{"q":"x"}' -paths /v1/orders -requests 1000`, check: all(noRejection, answered(1000))},
	{doc: "loadtest/README.md", match: "-key-prefix sk_free_load_ -keys 1 -duration 10s", long: true, check: penalised},

	// docs/benchmarks.md
	{doc: "docs/benchmarks.md", match: "-target check -url http://127.0.0.1:8082 -workers 50", check: all(noRejection, measured)},
	{doc: "docs/benchmarks.md", match: "-target grpc -addr 127.0.0.1:8089 -domain tollgate", check: all(noRejection, measured)},
	{doc: "docs/benchmarks.md", match: "-url http://127.0.0.1:9000/v1/users/1 -rate 500", check: noRejection},
	{doc: "docs/benchmarks.md", match: "-url http://127.0.0.1:8080/v1/users/1 -rate 500", check: noRejection},
	{doc: "docs/benchmarks.md", match: "storm -url http://127.0.0.1:18080", check: stormReachesTop},
	{doc: "docs/benchmarks.md", match: "-duration 10s -pid <pid> -redis <redis> -quiet -report run.html", check: all(throttledNotPenalised, measured, reportDrawn)},
	{doc: "docs/benchmarks.md", match: "-duration 10s -quiet -report ladder.html", long: true, check: all(penalised, reportDrawn)},
}

// TestDocRecipes runs every load-test recipe of README.md,
// loadtest/README.md and docs/benchmarks.md as written — against a stack
// started in process as the recipe's block starts make run (its variables
// included, every listener on a free port), with a second gateway where
// the block starts one — shortened to seconds (those that show the
// penalty ladder lengthened, as it climbs by the clock), and checks each
// one's headline. Addresses the docs give as make run's defaults are mapped to
// the stack's; -pid gets this process (the stack runs in it).
func TestDocRecipes(t *testing.T) {
	var recipes []docRecipe
	for _, doc := range recipeDocs {
		rs, err := readRecipes(doc)
		if err != nil {
			t.Fatal(err)
		}
		recipes = append(recipes, rs...)
	}
	used := make([]bool, len(recipeChecks))
	for _, r := range recipes {
		var found []int
		for i, c := range recipeChecks {
			if strings.TrimPrefix(r.doc, "../../../") == c.doc && strings.Contains(r.cmd, c.match) {
				found = append(found, i)
			}
		}
		name := fmt.Sprintf("%s:%d", strings.TrimPrefix(r.doc, "../../../"), r.line)
		switch len(found) {
		case 0:
			t.Errorf("%s: a load-test recipe without a check in recipeChecks: %s", name, r.cmd)
			continue
		case 1:
		default:
			t.Errorf("%s: matches %d checks: %s", name, len(found), r.cmd)
			continue
		}
		used[found[0]] = true
		c := recipeChecks[found[0]]
		t.Run(name, func(t *testing.T) {
			// A recipe is run a second time when its first run misses
			// its headline: on a machine busy with other tests, a
			// seconds-long run can fall short of the load that shows it
			// (too few requests to reach a limit, answers timed out). A
			// recipe that is wrong misses it twice.
			run := runRecipe(t, r, c.long)
			first := &attempt{}
			c.check(first, run)
			if len(first.errs) == 0 {
				return
			}
			t.Logf("first run missed its headline; running it again: %s", strings.Join(first.errs, "; "))
			run = runRecipe(t, r, c.long)
			c.check(t, run)
			if t.Failed() {
				t.Logf("command: %s\nargs: %q\nexit %d\nstdout:\n%s\nstderr (last 4 KB):\n%s", r.cmd, run.args, run.code, run.stdout, tail(run.stderr, 4096))
			}
		})
	}
	for i, c := range recipeChecks {
		if !used[i] {
			t.Errorf("recipeChecks[%d] (%s %q) matches no recipe of the docs", i, c.doc, c.match)
		}
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// recipeRun is one recipe's run.
type recipeRun struct {
	args           []string
	code           int
	stdout, stderr string
	sum            *loadtest.Summary      // a plain run's JSON summary
	storm          *loadtest.StormSummary // a storm's
	report         string                 // the -report file, "" when none
	redis          string                 // the stack's Redis
}

// Bounds of a recipe's run: short ones, and the least a long one gets.
const (
	shortDuration = 3 * time.Second
	maxRequests   = 2000
	longDuration  = 30 * time.Second
)

// runRecipe starts what the recipe's block starts and runs its command.
func runRecipe(t *testing.T, r docRecipe, long bool) *recipeRun {
	dir := t.TempDir()
	// Files the block writes, at paths of the test's own.
	paths := map[string]string{}
	for p, body := range r.files {
		local := filepath.Join(dir, filepath.Base(p))
		if err := os.WriteFile(local, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		paths[p] = local
	}
	st := startRecipeStack(t, r.stackEnv, paths)
	addrs := map[string]string{ // make run's defaults, as the docs write them
		"127.0.0.1:8080": st.addrs.Proxy, "127.0.0.1:8082": st.addrs.API, "127.0.0.1:9091": st.addrs.Metrics,
		"127.0.0.1:8089": st.addrs.GRPC, "127.0.0.1:9000": st.addrs.Demo, "127.0.0.1:8081": st.addrs.Aggregator,
	}
	proxy, metrics := st.addrs.Proxy, st.addrs.Metrics
	if r.gatewayEnv != nil {
		gw := startRecipeGateway(t, r.gatewayEnv, st, dir)
		for docAddr, bound := range gw {
			addrs[docAddr] = bound
		}
	}

	// The command's words, with the shell's expansions done as the docs
	// mean them.
	cmd := r.cmd
	pid := strconv.Itoa(os.Getpid())
	for _, v := range r.pidVars {
		cmd = strings.ReplaceAll(cmd, `"$`+v+`"`, pid)
	}
	for from, to := range map[string]string{
		`<pid>`: pid, `$!`: pid, `"$TOLLGATE_REDIS_ADDRS"`: st.addrs.Redis, `$TOLLGATE_REDIS_ADDRS`: st.addrs.Redis, `<redis>`: st.addrs.Redis,
	} {
		cmd = strings.ReplaceAll(cmd, from, to)
	}
	if strings.Contains(cmd, "$") || strings.Contains(cmd, "<") {
		t.Fatalf("unexpanded shell in %q: teach runRecipe what it means", cmd)
	}
	words, err := shellWords(cmd)
	if err != nil {
		t.Fatal(err)
	}
	if words[0] != "bin/loadtest" && words[0] != "loadtest" {
		t.Fatalf("not a loadtest command: %q", cmd)
	}
	args := words[1:]
	storm := len(args) > 0 && args[0] == "storm"
	for i, a := range args {
		args[i] = mapAddrs(a, addrs)
	}
	rr := &recipeRun{redis: st.addrs.Redis}
	args = setFlag(args, "json", "")
	if i := flagIndex(args, "report"); i >= 0 && i+1 < len(args) {
		rr.report = filepath.Join(dir, filepath.Base(args[i+1]))
		args[i+1] = rr.report
	}
	if storm {
		// The ladder's climb takes what it takes; hold the top briefly.
		args = setFlag(args, "hold", "5s")
		args = setFlag(args, "settle", "2s")
		args = setFlag(args, "duration", "2m")
		args = defaultFlag(args, "url", "http://"+proxy)
		args = defaultFlag(args, "metrics", "http://"+metrics+"/metrics")
		args = defaultFlag(args, "admin", "http://"+st.addrs.Aggregator)
		t.Setenv("TOLLGATE_ADMIN_TOKEN", st.adminToken)
	} else {
		if i := flagIndex(args, "duration"); long && i >= 0 && i+1 < len(args) {
			if d, err := time.ParseDuration(args[i+1]); err == nil && d < longDuration {
				args[i+1] = longDuration.String()
			}
		}
		if !long {
			if i := flagIndex(args, "duration"); i >= 0 && i+1 < len(args) {
				if d, err := time.ParseDuration(args[i+1]); err == nil && d > shortDuration {
					args[i+1] = shortDuration.String()
				}
			}
			if i := flagIndex(args, "requests"); i >= 0 && i+1 < len(args) {
				if n, err := strconv.Atoi(args[i+1]); err == nil && n > maxRequests {
					args[i+1] = strconv.Itoa(maxRequests)
				}
			}
		}
		switch target := flagValue(args, "target"); target {
		case "check":
			args = defaultFlag(args, "url", "http://"+st.addrs.API+"/v1/check")
		case "grpc":
			args = defaultFlag(args, "addr", st.addrs.GRPC)
		default:
			args = defaultFlag(args, "url", "http://"+st.addrs.Proxy)
		}
		t.Setenv("TOLLGATE_API_TOKEN", "")
	}
	rr.args = args

	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	rr.code = run(ctx, args, &stdout, &stderr)
	rr.stdout, rr.stderr = stdout.String(), stderr.String()
	if rr.code != exitOK {
		t.Fatalf("exit %d", rr.code)
	}
	if storm {
		rr.storm = &loadtest.StormSummary{}
		if err := json.Unmarshal(stdout.Bytes(), rr.storm); err != nil {
			t.Fatalf("storm summary: %v", err)
		}
	} else {
		rr.sum = &loadtest.Summary{}
		if err := json.Unmarshal(stdout.Bytes(), rr.sum); err != nil {
			t.Fatalf("summary: %v", err)
		}
	}
	return rr
}

// mapAddrs replaces make run's default addresses in s by the test's.
var hostPortRe = regexp.MustCompile(`127\.0\.0\.1:\d+`)

func mapAddrs(s string, addrs map[string]string) string {
	return hostPortRe.ReplaceAllStringFunc(s, func(hp string) string {
		if a, ok := addrs[hp]; ok {
			return a
		}
		return hp
	})
}

// flagIndex returns the index of flag -name (or --name) in args, -1 when
// absent; a -name=value form is split first by normFlags.
func flagIndex(args []string, name string) int {
	for i, a := range args {
		if a == "-"+name || a == "--"+name {
			return i
		}
	}
	return -1
}

func flagValue(args []string, name string) string {
	if i := flagIndex(args, name); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "-"+name+"="); ok {
			return v
		}
	}
	return ""
}

// setFlag sets -name to value (a boolean flag when value is "").
func setFlag(args []string, name, value string) []string {
	if i := flagIndex(args, name); i >= 0 {
		if value != "" && i+1 < len(args) {
			args[i+1] = value
		}
		return args
	}
	if value == "" {
		return append(args, "-"+name)
	}
	return append(args, "-"+name, value)
}

// defaultFlag sets -name to value unless the command gives it.
func defaultFlag(args []string, name, value string) []string {
	if flagIndex(args, name) >= 0 || flagValue(args, name) != "" {
		return args
	}
	return append(args, "-"+name, value)
}

// recipeStack is a stack started in process for one recipe.
type recipeStack struct {
	addrs      stack.Addrs
	keySecret  string
	adminToken string
}

// The stack's listener variables: every one on a free port.
var stackListeners = []string{
	"TOLLGATE_LISTEN", "TOLLGATE_API_LISTEN", "TOLLGATE_METRICS_LISTEN", "TOLLGATE_GRPC_LISTEN", "TOLLGATE_DEMO_LISTEN",
	"TOLLGATE_STACK_KAFKA_LISTEN", "TOLLGATE_STACK_NATS_LISTEN", "TOLLGATE_AGGREGATOR_LISTEN", "TOLLGATE_AGGREGATOR_METRICS_LISTEN",
}

// startRecipeStack starts the stack with the recipe's variables (paths
// mapped to the test's files) and stops it when the test ends.
func startRecipeStack(t *testing.T, env, paths map[string]string) *recipeStack {
	t.Helper()
	vars := map[string]string{
		"TOLLGATE_RULES_FILE":     "../../../configs/rules.yaml",
		"TOLLGATE_KEY_SECRET":     "recipe-test-secret-0123456789",
		"TOLLGATE_ADMIN_TOKEN":    "recipe-test-admin-token",
		"TOLLGATE_STACK_ENV_FILE": "off",
		"TOLLGATE_DATA_DIR":       t.TempDir(),
	}
	for k, v := range env {
		if p, ok := paths[v]; ok {
			v = p
		}
		vars[k] = v
	}
	for _, k := range stackListeners {
		vars[k] = "127.0.0.1:0"
	}
	cfg, err := stack.LoadConfig(func(k string) (string, bool) { v, ok := vars[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	logs := &testnet.Buffer{}
	st, err := stack.New(cfg, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})), &testnet.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // after the stack's stop
		if t.Failed() {
			t.Logf("stack log (warnings):\n%s", tail(logs.String(), 4096))
		}
	})
	run := testnet.Start(t, "stack", st.Run)
	select {
	case <-st.Ready():
	case <-run.Done():
		t.Fatalf("stack: %v", run.Wait())
	case <-time.After(60 * time.Second):
		t.Fatal("stack not ready within 60s")
	}
	return &recipeStack{addrs: st.Addrs(), keySecret: vars["TOLLGATE_KEY_SECRET"], adminToken: vars["TOLLGATE_ADMIN_TOKEN"]}
}

// startRecipeGateway starts a second gateway joining st with the recipe's
// variables, as bin/stack.env has a shell do, and returns the addresses
// the recipe gives it mapped to the ones it bound.
func startRecipeGateway(t *testing.T, env map[string]string, st *recipeStack, dir string) map[string]string {
	t.Helper()
	vars := map[string]string{ // bin/stack.env
		"TOLLGATE_REDIS_ADDRS": st.addrs.Redis, "TOLLGATE_KAFKA_BROKERS": st.addrs.Kafka, "TOLLGATE_NATS_URL": st.addrs.NATS,
		"TOLLGATE_KEY_SECRET": st.keySecret, "TOLLGATE_ADMIN_TOKEN": st.adminToken,
		// The recipe runs from the repository's root, where the default is.
		"TOLLGATE_RULES_FILE": "../../../configs/rules.yaml",
	}
	listeners := map[string]string{} // variable -> the address the recipe gives
	for k, v := range env {
		switch {
		case k == "TOLLGATE_DATA_DIR":
			v = filepath.Join(dir, "gateway")
		case k == "TOLLGATE_UPSTREAM":
			v = "http://" + st.addrs.Demo
		case strings.HasSuffix(k, "_LISTEN") && v != "off":
			if _, _, err := net.SplitHostPort(v); err == nil {
				listeners[k] = v
				v = "127.0.0.1:0"
			}
		}
		vars[k] = v
	}
	cfg, err := gateway.LoadConfig("", func(k string) (string, bool) { v, ok := vars[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	logs := &testnet.Buffer{}
	gw, err := gateway.New(cfg, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // after the gateway's stop
		if t.Failed() {
			t.Logf("second gateway's log (warnings):\n%s", tail(logs.String(), 4096))
		}
	})
	testnet.Start(t, "second gateway", gw.Run)
	bound := gw.Addrs()
	out := map[string]string{}
	for k, docAddr := range listeners {
		switch k {
		case "TOLLGATE_LISTEN":
			out[docAddr] = bound.Proxy
		case "TOLLGATE_API_LISTEN":
			out[docAddr] = bound.API
		case "TOLLGATE_METRICS_LISTEN":
			out[docAddr] = bound.Metrics
		case "TOLLGATE_GRPC_LISTEN":
			out[docAddr] = bound.GRPC
		}
	}
	return out
}

// Headline checks.

func all(checks ...func(checkT, *recipeRun)) func(checkT, *recipeRun) {
	return func(t checkT, r *recipeRun) {
		t.Helper()
		for _, c := range checks {
			c(t, r)
		}
	}
}

// noRejection: the limits fit the load — every answer a 2xx or OK, none
// of a rule's rejections, none of the penalty ladder's — and few requests
// failed on the loaded machine.
func noRejection(t checkT, r *recipeRun) {
	t.Helper()
	s := r.sum
	ok := s.Statuses["2xx"] + s.Statuses["OK"]
	if s.Answered == 0 || ok != s.Answered || s.PenaltyAnswers != 0 {
		t.Errorf("answers %d, of which 2xx/OK %d, penalty answers %d: want every one admitted (statuses %v)", s.Answered, ok, s.PenaltyAnswers, s.Statuses)
	}
	if s.Errors > s.Sent/100 {
		t.Errorf("%d errors of %d requests: %v", s.Errors, s.Sent, s.ErrorSamples)
	}
}

// measured: the gateway's CPU and Redis's commands are reported.
func measured(t checkT, r *recipeRun) {
	t.Helper()
	if g := r.sum.Gateway; g == nil || g.PID != os.Getpid() {
		t.Errorf("gateway CPU %+v, want this process's", g)
	}
	if rd := r.sum.Redis; rd == nil || rd.EvalSHA == 0 {
		t.Errorf("redis usage %+v, want EVALSHA counted", rd)
	}
}

func answered(n int64) func(checkT, *recipeRun) {
	return func(t checkT, r *recipeRun) {
		t.Helper()
		if r.sum.Answered != n {
			t.Errorf("%d answered, want %d", r.sum.Answered, n)
		}
	}
}

// fromLeases: one hot key is answered from leases, so Redis sees fewer
// calls than decisions.
func fromLeases(t checkT, r *recipeRun) {
	t.Helper()
	if rd := r.sum.Redis; rd == nil || rd.EvalSHAPerDecision >= 1 {
		t.Errorf("redis usage %+v, want less than one EVALSHA per decision", rd)
	}
}

func latencyReported(t checkT, r *recipeRun) {
	t.Helper()
	if l := r.sum.LatencyUS; l.P99 <= 0 || l.Count != r.sum.Answered {
		t.Errorf("latency %+v for %d answers", l, r.sum.Answered)
	}
}

// reportDrawn: the -report page was written, with charts.
func reportDrawn(t checkT, r *recipeRun) {
	t.Helper()
	page, err := os.ReadFile(r.report)
	if err != nil || strings.Count(string(page), "<svg") < 3 {
		t.Errorf("report %s: %v, %d charts", r.report, err, strings.Count(string(page), "<svg"))
	}
}

// throttledNotPenalised: hot keys run dry and get a rule's 429s, the
// others pass, and the penalty ladder (off) answers none.
func throttledNotPenalised(t checkT, r *recipeRun) {
	t.Helper()
	s := r.sum
	if s.Statuses["2xx"] == 0 || s.Statuses["429"] == 0 || s.PenaltyAnswers != 0 {
		t.Errorf("statuses %v, penalty answers %d: want 2xx and 429, no penalty", s.Statuses, s.PenaltyAnswers)
	}
}

// penalised: the key climbed the ladder, and the summary says so.
func penalised(t checkT, r *recipeRun) {
	t.Helper()
	if r.sum.PenaltyAnswers == 0 || !strings.Contains(r.stderr, "came from the penalty ladder") {
		t.Errorf("statuses %v, penalty answers %d: want the ladder's, explained", r.sum.Statuses, r.sum.PenaltyAnswers)
	}
}

// stormReachesTop: the storm key climbed to the top, the polite key was
// never touched, and the penalised storm cost no Redis call the polite
// client cannot account for.
func stormReachesTop(t checkT, r *recipeRun) {
	t.Helper()
	s := r.storm
	if s.StoppedBy != "top level held" {
		t.Errorf("stopped by %q, want the top level held (levels %+v)", s.StoppedBy, s.Levels)
	}
	if !s.Polite.Untouched() || s.Polite.Level != 0 {
		t.Errorf("polite %+v: want untouched", s.Polite)
	}
	if s.Storm.Penalty == 0 || s.Storm.Blocked == 0 {
		t.Errorf("storm %+v: want 429 PENALTY and 403 answers", s.Storm)
	}
	if met, why := s.RedisVerdict(); !met {
		t.Errorf("Redis calls once penalised: %v per rejection: %s", s.RedisPerRejectionPenalised, why)
	}
}
