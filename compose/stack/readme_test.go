package stack_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/aggregator"
	"github.com/tollgate/tollgate/compose/redisserver"
	"github.com/tollgate/tollgate/compose/stack"
	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/gateway"
	"github.com/tollgate/tollgate/internal/logtest"
	"github.com/tollgate/tollgate/internal/testnet"
	"github.com/tollgate/tollgate/internal/testwait"
)

// readmeSections are the README's sections whose commands run against
// make run's stack, in the README's order (a section ends at the next
// heading of its level or above).
var readmeSections = []string{"## Two commands", "## Fleet mode: the control plane"}

// statement is one shell statement of the README: a line, or lines joined
// by a trailing | or \, or a for ... done loop.
type statement struct {
	text    string   // as written, comments included
	outputs []string // the comment lines right after it (what it prints)
}

// key is the statement without comments, its whitespace collapsed.
func (s statement) key() string {
	var b []string
	for _, line := range strings.Split(s.text, "\n") {
		b = append(b, stripComment(line))
	}
	return strings.Join(strings.Fields(strings.Join(b, " ")), " ")
}

var commentRE = regexp.MustCompile(`(^|\s)#\s.*$`)

// stripComment drops a line's trailing comment: a # starting a word and
// followed by a space (the README's commands hold no such # in quotes).
func stripComment(line string) string {
	return strings.TrimRight(commentRE.ReplaceAllString(line, ""), " \t")
}

// inlineCurlRE finds the curl commands the README's prose gives in code
// spans.
var inlineCurlRE = regexp.MustCompile("`(curl [^`]+)`")

// readmeStatements returns the shell statements of the README's sections,
// in order: those of its ```sh blocks and the curl commands of its prose.
func readmeStatements(t *testing.T, readme string, sections ...string) []statement {
	t.Helper()
	var out []statement
	for _, heading := range sections {
		level := strings.Index(heading, " ") // its #s
		in, found := false, false
		inBlock, shell := false, false
		var prose strings.Builder
		flushProse := func() {
			for _, m := range inlineCurlRE.FindAllStringSubmatch(prose.String(), -1) {
				// One line, as a code span may wrap in the source.
				out = append(out, statement{text: strings.Join(strings.Fields(m[1]), " ")})
			}
			prose.Reset()
		}
		for _, line := range strings.Split(readme, "\n") {
			if !inBlock {
				if line == heading {
					in, found = true, true
					continue
				}
				if h := len(line) - len(strings.TrimLeft(line, "#")); in && h >= 1 && h <= level && strings.HasPrefix(line[h:], " ") {
					in = false // the next heading of its level or above
				}
			}
			if !in {
				continue
			}
			switch {
			case strings.HasPrefix(line, "```") && !inBlock:
				inBlock, shell = true, strings.TrimPrefix(line, "```") == "sh"
				flushProse()
				out = append(out, statement{}) // a block starts: nothing continues into it
			case strings.HasPrefix(line, "```"):
				inBlock = false
			case inBlock && shell:
				out = appendLine(out, line)
			case !inBlock:
				prose.WriteString(line + "\n")
			}
		}
		flushProse()
		if !found {
			t.Fatalf("README.md has no %q section", heading)
		}
	}
	return slices.DeleteFunc(out, func(s statement) bool { return s.text == "" })
}

// continues tells whether a statement goes on on the next line: its last
// line ends in | or \, or it is a for loop without its done yet (loops
// nest: each do needs its done).
func continues(text string) bool {
	lines := strings.Split(text, "\n")
	last := stripComment(lines[len(lines)-1])
	if strings.HasSuffix(last, "|") || strings.HasSuffix(last, `\`) {
		return true
	}
	k := statement{text: text}.key()
	if !strings.HasPrefix(k, "for ") {
		return false
	}
	open := 0
	for _, w := range strings.Fields(k) {
		switch strings.TrimSuffix(w, ";") {
		case "do":
			open++
		case "done":
			open--
		}
	}
	return open > 0
}

// appendLine adds one line of a ```sh block to the statements.
func appendLine(out []statement, line string) []statement {
	trimmed := strings.TrimSpace(line)
	if n := len(out); n > 0 && out[n-1].text != "" && continues(out[n-1].text) {
		out[n-1].text += "\n" + line
		return out
	}
	switch {
	case trimmed == "":
		return append(out, statement{}) // comments after it are not its output
	case strings.HasPrefix(trimmed, "#"):
		if n := len(out); n > 0 && out[n-1].text != "" {
			out[n-1].outputs = append(out[n-1].outputs, strings.TrimSpace(strings.TrimPrefix(trimmed, "#")))
		}
		return out
	}
	return append(out, statement{text: line})
}

// shellOut is what a statement printed, with curl's status codes apart.
type shellOut struct {
	text     string // stdout without the status lines, \r dropped
	statuses []int  // HTTP status of every curl run, in order
}

func (o shellOut) status() int {
	if len(o.statuses) == 0 {
		return 0
	}
	return o.statuses[len(o.statuses)-1]
}

// statusMark is the line curl prints after every transfer here: the test's
// .curlrc sets write-out, so the README's commands run as written and the
// test still sees each answer's status (a command's own -w wins).
const statusMark = "@@status="

// shell runs README statements with bash and curl, the addresses of the
// README replaced by the stack's.
type shell struct {
	t       *testing.T
	env     []string
	prelude []string // the README's variable assignments so far
	addrs   map[string]string
}

func newShell(t *testing.T, token string, addrs map[string]string) *shell {
	t.Helper()
	for _, bin := range []string{"bash", "curl", "sed", "grep"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s: %v (the README's commands need it; apt-get install -y %s)", bin, err, bin)
		}
	}
	home := t.TempDir()
	rc := "write-out = \"\\n" + statusMark + "%{http_code}\\n\"\nmax-time = 10\n"
	if err := os.WriteFile(filepath.Join(home, ".curlrc"), []byte(rc), 0o600); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "CURL_HOME="+home, "TOKEN="+token)
	return &shell{t: t, env: env, addrs: addrs}
}

var loopbackRE = regexp.MustCompile(`127\.0\.0\.1:(\d+)`)

// subst replaces the README's addresses with the stack's; an address the
// test does not know fails it.
func (sh *shell) subst(text string) string {
	sh.t.Helper()
	return loopbackRE.ReplaceAllStringFunc(text, func(a string) string {
		to, ok := sh.addrs[a]
		if !ok {
			sh.t.Fatalf("README address %s in %q: the test does not know what it stands for", a, text)
		}
		return to
	})
}

// run runs one statement after the assignments so far and returns what it
// printed; a statement that exits non-zero fails the test.
func (sh *shell) run(text string) shellOut {
	sh.t.Helper()
	script := strings.Join(append(slices.Clone(sh.prelude), sh.subst(text)), "\n")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Env = sh.env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		sh.t.Fatalf("README command\n%s\nfailed: %v\nstdout: %s\nstderr: %s", text, err, stdout.String(), stderr.String())
	}
	var o shellOut
	var lines []string
	for _, line := range strings.Split(strings.ReplaceAll(stdout.String(), "\r", ""), "\n") {
		if code, ok := strings.CutPrefix(line, statusMark); ok {
			n, _ := strconv.Atoi(code)
			o.statuses = append(o.statuses, n)
			continue
		}
		lines = append(lines, line)
	}
	o.text = strings.TrimSpace(strings.Join(lines, "\n"))
	return o
}

// step is what the test expects of one README statement.
type step struct {
	match string // a part of the statement's key
	// do runs the statement (or what stands for it: a joiner starts in
	// this process) and checks what the README says it does.
	do func(t *testing.T, st statement)
}

// expectJSON decodes o's text into v, with the status it must have.
func expectJSON(o shellOut, status int, v any) error {
	if o.status() != status {
		return fmt.Errorf("status %d, want %d: %s", o.status(), status, o.text)
	}
	if err := json.Unmarshal([]byte(o.text), v); err != nil {
		return fmt.Errorf("not JSON (%v): %s", err, o.text)
	}
	return nil
}

// TestREADMEWalkthrough runs the README's local-stack commands top to
// bottom — "Two commands", the operator API walkthrough of "Fleet mode"
// and "Joining the local stack" — against the stack make run starts, with
// bash and curl as a newcomer would (the addresses replaced by the
// stack's free ports), and checks that each answers what the README says.
// The commands are read from README.md: one added, removed or reordered
// there fails here until its expectation is written down below.
func TestREADMEWalkthrough(t *testing.T) {
	if _, err := redisserver.LookPath(); err != nil {
		t.Fatalf("%v (make deps installs it)", err)
	}
	t.Chdir("../..") // the repository root, where make run runs
	src, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	stmts := readmeStatements(t, string(src), readmeSections...)

	cfg := testConfig(stack.RedisServer)
	cfg.RulesFile = "configs/rules.yaml"
	cfg.EnvFile = filepath.Join(t.TempDir(), "stack.env")
	r := start(t, cfg)
	defer r.stop(t)
	token := bannerValue(t, r.banner.String(), "admin token")
	addrs := map[string]string{
		"127.0.0.1:8080": r.addrs.Proxy, "127.0.0.1:8081": r.addrs.Aggregator, "127.0.0.1:8082": r.addrs.API,
		"127.0.0.1:9091": r.addrs.Metrics, "127.0.0.1:9000": r.addrs.Demo, "127.0.0.1:9093": r.addrs.AggregatorMetrics,
		"127.0.0.1:8089": r.addrs.GRPC,
	}
	sh := newShell(t, token, addrs)
	proxy := "http://" + r.addrs.Proxy
	byKey := map[string]statement{}
	for _, s := range stmts {
		byKey[s.key()] = s
	}

	// status sends one request with key to a gateway's proxy and returns
	// the status, and the RateLimit-Policy header and the body.
	status := func(base, key string) (int, string) {
		resp, body := get(t, base+"/v1/users/42", key)
		return resp.StatusCode, resp.Header.Get("RateLimit-Policy") + " " + string(body)
	}
	// applied waits until a gateway (its metrics address) has applied a
	// change, as its /readyz and /metrics tell, without sending it
	// requests: polling a rate-limited key would ignore its Retry-After
	// and climb the penalty ladder.
	applied := func(what, metrics string, cond func(version int, controls map[string]float64) bool) {
		t.Helper()
		took := testwait.Eventually(t, 5*time.Second, func() error {
			v, c := gatewayState(t, metrics)
			if !cond(v, c) {
				return fmt.Errorf("%s: rules version %d, controls %v", what, v, c)
			}
			return nil
		})
		t.Logf("%s: %v", what, took)
	}
	// expect sends one request and checks its status and what its body
	// and RateLimit-Policy hold.
	expect := func(base, key string, code int, holds string) {
		t.Helper()
		if got, body := status(base, key); got != code || !strings.Contains(body, holds) {
			t.Fatalf("%s on %s: %d %s, want %d with %s", key, base, got, body, code, holds)
		}
	}
	// poll reruns a read-only statement until its check passes.
	poll := func(st statement, check func(shellOut) error) {
		t.Helper()
		testwait.Eventually(t, 15*time.Second, func() error { return check(sh.run(st.text)) })
	}
	// checked runs a statement and fails on its check's error.
	checked := func(check func(shellOut) error) func(*testing.T, statement) {
		return func(t *testing.T, st statement) {
			t.Helper()
			if err := check(sh.run(st.text)); err != nil {
				t.Fatalf("README command\n%s\n%v", st.text, err)
			}
		}
	}
	version := func(want int) func(*testing.T, statement) {
		return checked(func(o shellOut) error {
			var v struct{ Version int }
			if err := expectJSON(o, 200, &v); err != nil {
				return err
			}
			if v.Version != want {
				return fmt.Errorf("version %d, want %d", v.Version, want)
			}
			return nil
		})
	}
	type keyState struct {
		Status int   `json:"status"`
		Tokens int64 `json:"tokens"`
		Reset  int   `json:"reset"`
		Rules  []struct {
			ID        string `json:"id"`
			Limit     int64  `json:"limit"`
			Remaining int64  `json:"remaining"`
			Granted   *int64 `json:"granted"`
		} `json:"rules"`
	}
	env := map[string]string{} // what set -a; . bin/stack.env; set +a exports
	sourceEnv := func(t *testing.T, _ statement) {
		for k, v := range readEnvFile(t, cfg.EnvFile) {
			env[k] = v
		}
	}
	var second *gateway.Server

	steps := []step{
		// Two commands.
		{"make test", func(*testing.T, statement) {}}, // the lead's whole test run
		{"make run", func(*testing.T, statement) {}},  // start above
		{"curl -i -H 'X-API-Key: sk_prod_acme_1'", checked(func(o shellOut) error {
			if o.status() != 200 || !strings.HasPrefix(o.text, "HTTP/1.1 200") ||
				!regexp.MustCompile(`(?im)^RateLimit-Policy: .*"pro-default";q=1000`).MatchString(o.text) {
				return fmt.Errorf("want 200 with the rate-limit headers: %s", o.text)
			}
			return nil
		})},
		{"for i in 1 2 3 4 5 6", checked(func(o shellOut) error {
			lines := strings.Split(o.text, "\n")
			want := `^(HTTP/1.1 200 OK\n){5}HTTP/1.1 429 Too Many Requests\nRetry-After: \d+$`
			if !regexp.MustCompile(want).MatchString(strings.Join(lines, "\n")) {
				return fmt.Errorf("want five 200s, then 429 and Retry-After: %q", o.text)
			}
			return nil
		})},
		{"/v1/check", checked(func(o shellOut) error {
			var d struct {
				Allowed bool
				Status  int
				Rule    string
			}
			if err := expectJSON(o, 429, &d); err != nil {
				return err
			}
			if d.Allowed || d.Status != 429 || d.Rule != "free-default" {
				return fmt.Errorf("want the spent free-default bucket: %s", o.text)
			}
			return nil
		})},
		{"/v1/usage/tenants/acme?granularity=minute", func(t *testing.T, st statement) {
			poll(st, func(o shellOut) error { // "within seconds"
				var u struct {
					Totals struct{ Allowed int64 } `json:"totals"`
				}
				if err := expectJSON(o, 200, &u); err != nil {
					return err
				}
				if u.Totals.Allowed < 1 {
					return fmt.Errorf("tenant acme's report holds no allowed request yet: %s", o.text)
				}
				return nil
			})
		}},

		// Fleet mode: the operator API walkthrough.
		{"TOKEN=…", func(*testing.T, statement) { sh.prelude = append(sh.prelude, "TOKEN="+token) }},
		{"API=http://127.0.0.1:8081/admin/v1", func(_ *testing.T, st statement) { sh.prelude = append(sh.prelude, sh.subst(st.key())) }},
		{`auth="Authorization: Bearer $TOKEN"`, func(_ *testing.T, st statement) { sh.prelude = append(sh.prelude, st.key()) }},
		{`curl -s -H "$auth" $API/rules`, checked(func(o shellOut) error {
			if o.status() != 200 || !strings.Contains(o.text, "id: free-default") || !strings.Contains(o.text, "capacity: 5 ") {
				return fmt.Errorf("want the seeded YAML: %d %s", o.status(), o.text)
			}
			return nil
		})},
		{`--data-binary @- $API/rules`, version(2)},
		{"$API/rules/validate", checked(func(o shellOut) error {
			var v struct{ Valid bool }
			if err := expectJSON(o, 200, &v); err != nil || !v.Valid {
				return fmt.Errorf("want valid: %v %s", err, o.text)
			}
			return nil
		})},
		{"$API/rules/versions", checked(func(o shellOut) error {
			var v struct{ Versions []struct{ Version int } }
			if err := expectJSON(o, 200, &v); err != nil {
				return err
			}
			if len(v.Versions) != 2 || v.Versions[0].Version != 1 || v.Versions[1].Version != 2 {
				return fmt.Errorf("want versions 1 and 2: %s", o.text)
			}
			return nil
		})},
		{"$API/rules/rollback", version(3)},
		{"If-Match: 3", func(t *testing.T, st statement) {
			version(4)(t, st)
			// Run again, the rules are at version 4: 412.
			o := sh.run(st.text)
			if o.status() != http.StatusPreconditionFailed || !strings.Contains(o.text, "VERSION_MISMATCH") {
				t.Fatalf("the conditional PUT again: %d %s, want 412 VERSION_MISMATCH", o.status(), o.text)
			}
			applied("the raise", r.addrs.Metrics, func(v int, _ map[string]float64) bool { return v == 4 })
			expect(proxy, "sk_free_demo", 200, `"free-default";q=50;`)
		}},
		{"-X PUT -H \"$auth\" -d '{\"ttl\":\"10m\",\"reason\":\"demo\"}' $API/blocklist/sk_free_demo", func(t *testing.T, st statement) {
			checked(func(o shellOut) error {
				var e struct{ Action string }
				if err := expectJSON(o, 200, &e); err != nil || e.Action != "block" {
					return fmt.Errorf("want a block entry: %v %s", err, o.text)
				}
				return nil
			})(t, st)
			applied("the block", r.addrs.Metrics, func(_ int, c map[string]float64) bool { return c["blocked"] == 1 })
			expect(proxy, "sk_free_demo", 403, "KEY_BLOCKED")
		}},
		{"-H \"$auth\" $API/blocklist/sk_free_demo", checked(func(o shellOut) error {
			var e struct{ Action string }
			if err := expectJSON(o, 200, &e); err != nil || e.Action != "block" {
				return fmt.Errorf("GET blocklist: want the block entry: %v %s", err, o.text)
			}
			return nil
		})},
		{"-X DELETE -H \"$auth\" $API/blocklist/sk_free_demo", func(t *testing.T, st statement) {
			if o := sh.run(st.text); o.status() != http.StatusNoContent {
				t.Fatalf("DELETE blocklist: %d %s, want 204", o.status(), o.text)
			}
			applied("the unblock", r.addrs.Metrics, func(_ int, c map[string]float64) bool { return c["blocked"] == 0 })
			expect(proxy, "sk_free_demo", 200, `"free-default"`)
		}},
		{"$API/allowlist/sk_prod_acme_2", func(t *testing.T, st statement) {
			checked(func(o shellOut) error {
				var e struct{ Action string }
				if err := expectJSON(o, 200, &e); err != nil || e.Action != "allow" {
					return fmt.Errorf("want an allow entry: %v %s", err, o.text)
				}
				return nil
			})(t, st)
			applied("the allowlist", r.addrs.Metrics, func(_ int, c map[string]float64) bool { return c["allowed"] == 1 })
			resp, body := get(t, proxy+"/v1/users/42", "sk_prod_acme_2")
			if resp.StatusCode != 200 || resp.Header.Get("RateLimit-Policy") != "" || resp.Header.Get("X-RateLimit-Limit") != "" {
				t.Fatalf("sk_prod_acme_2: %d %v %s, want 200 without rate-limit headers", resp.StatusCode, resp.Header, body)
			}
		}},
		{"$API/overrides/sk_prod_acme_1", checked(func(o shellOut) error {
			var v struct{ Override struct{ Limit int64 } }
			if err := expectJSON(o, 200, &v); err != nil || v.Override.Limit != 5000 {
				return fmt.Errorf("want limit 5000: %v %s", err, o.text)
			}
			return nil
		})},
		{"$API/overrides/tenant:acme", func(t *testing.T, st statement) {
			checked(func(o shellOut) error {
				var v struct{ Override struct{ Factor float64 } }
				if err := expectJSON(o, 200, &v); err != nil || v.Override.Factor != 2 {
					return fmt.Errorf("want factor 2: %v %s", err, o.text)
				}
				return nil
			})(t, st)
			applied("the overrides", r.addrs.Metrics, func(_ int, c map[string]float64) bool {
				return c["key_override"] == 1 && c["tenant_override"] == 1
			})
		}},
		{"grep -i '^RateLimit-Policy:'", func(t *testing.T, st statement) {
			if len(st.outputs) != 1 {
				t.Fatalf("README: the RateLimit-Policy line should be followed by the one line it prints, as a comment: %q", st.outputs)
			}
			if o := sh.run(st.text); !strings.EqualFold(o.text, st.outputs[0]) {
				t.Fatalf("README command\n%s\nprinted %q, the README says %q", st.text, o.text, st.outputs[0])
			}
		}},
		{"$API/keys/sk_free_demo?endpoint=/v1/users/42", checked(func(o shellOut) error {
			var k keyState
			if err := expectJSON(o, 200, &k); err != nil {
				return err
			}
			if k.Status != 200 || len(k.Rules) != 1 || k.Rules[0].ID != "free-default" || k.Rules[0].Limit != 50 {
				return fmt.Errorf("want free-default with limit 50, not spent: %s", o.text)
			}
			return nil
		})},
		{"$API/keys/sk_free_demo/quota", checked(func(o shellOut) error {
			var k keyState
			if err := expectJSON(o, 200, &k); err != nil {
				return err
			}
			if k.Tokens != 10 || len(k.Rules) != 1 || k.Rules[0].Granted == nil {
				return fmt.Errorf("want tokens 10 and free-default's granted: %s", o.text)
			}
			rr := k.Rules[0]
			if g := *rr.Granted; g < 0 || g > 10 || rr.Remaining > rr.Limit || (g < 10 && rr.Remaining != rr.Limit) {
				return fmt.Errorf("granted %d, remaining %d of %d: a grant gives the tokens asked, or fills the bucket: %s", g, rr.Remaining, rr.Limit, o.text)
			}
			return nil
		})},
		{"$API/keys/sk_free_demo/reset", checked(func(o shellOut) error {
			var k keyState
			if err := expectJSON(o, 200, &k); err != nil || k.Reset != 1 {
				return fmt.Errorf("want reset 1: %v %s", err, o.text)
			}
			return nil
		})},
		{"$API/audit?kind=blocklist", func(t *testing.T, st statement) {
			poll(st, func(o shellOut) error {
				var a struct{ Entries []struct{ Kind string } }
				if err := expectJSON(o, 200, &a); err != nil {
					return err
				}
				if len(a.Entries) != 2 {
					return fmt.Errorf("%d entries, want the block and its removal: %s", len(a.Entries), o.text)
				}
				return nil
			})
		}},

		// Joining the local stack.
		{"make build", func(*testing.T, statement) {}}, // the joiners run in-process below
		{"set -a; . bin/stack.env; set +a", sourceEnv},
		{"bin/gateway", func(t *testing.T, st statement) {
			gcfg, err := gateway.LoadConfig("", joinEnv(t, st, env, sh))
			if err != nil {
				t.Fatalf("README's gateway line: %v", err)
			}
			second, err = gateway.New(gcfg, logtest.Warnings(t).With("part", "second-gateway"))
			if err != nil {
				t.Fatal(err)
			}
			testnet.Start(t, "second gateway", second.Run)
			testwait.Eventually(t, 10*time.Second, func() error {
				resp, body := get(t, "http://"+second.Addrs().Metrics+"/readyz", "")
				if resp.StatusCode != 200 || !bytes.Contains(body, []byte(`"source":"nats"`)) {
					return fmt.Errorf("second gateway readyz: %d %s", resp.StatusCode, body)
				}
				return nil
			})
			sh.addrs["127.0.0.1:18080"] = second.Addrs().Proxy
		}},
		{"curl -i -H 'X-API-Key: sk_free_demo' http://127.0.0.1:18080/v1/users/42", func(t *testing.T, st statement) {
			o := sh.run(st.text)
			left := regexp.MustCompile(`(?im)^RateLimit: .*"free-default";r=(\d+)`).FindStringSubmatch(o.text)
			if o.status() != 200 || !regexp.MustCompile(`(?im)^RateLimit-Policy: .*"free-default";q=50;`).MatchString(o.text) || left == nil {
				t.Fatalf("second gateway: want 200 with \"free-default\";q=50: %s", o.text)
			}
			// The same bucket: the first gateway's next request takes the
			// token after it (the bucket refills one every 12 s).
			resp, _ := get(t, proxy+"/v1/users/42", "sk_free_demo")
			n, _ := strconv.Atoi(left[1])
			if want := fmt.Sprintf(`"free-default";r=%d;`, n-1); !strings.Contains(resp.Header.Get("RateLimit"), want) {
				t.Errorf("first gateway after the second: RateLimit %q, want %s: not the same bucket?", resp.Header.Get("RateLimit"), want)
			}
			// The blocklist PUT line, run again: 403 on both at once.
			sh.run(byKeyWith(t, byKey, "$API/blocklist/sk_free_demo", "-X PUT").text)
			for _, gw := range []struct{ metrics, proxy string }{{r.addrs.Metrics, proxy}, {second.Addrs().Metrics, "http://" + second.Addrs().Proxy}} {
				applied("the block again", gw.metrics, func(_ int, c map[string]float64) bool { return c["blocked"] == 1 })
				expect(gw.proxy, "sk_free_demo", 403, "KEY_BLOCKED")
			}
		}},
		{"set -a; . bin/stack.env; set +a", sourceEnv},
		{"bin/aggregator", func(t *testing.T, st statement) {
			acfg, err := aggregator.LoadConfig("", joinEnv(t, st, env, sh))
			if err != nil {
				t.Fatalf("README's aggregator line: %v", err)
			}
			agg, err := aggregator.New(acfg, logtest.Warnings(t).With("part", "second-aggregator"))
			if err != nil {
				t.Fatal(err)
			}
			run := testnet.Start(t, "second aggregator", agg.Run)
			defer run.StopNow(t)
			// It joins the consumer group: the partitions rebalance.
			took := testwait.Eventually(t, 30*time.Second, func() error {
				if !agg.Ready() || len(agg.Owned()) == 0 {
					return fmt.Errorf("second aggregator: ready %v, partitions %v", agg.Ready(), agg.Owned())
				}
				return nil
			})
			t.Logf("second aggregator owns partitions %v %v after it started", agg.Owned(), took)
		}},
	}

	runSteps(t, "README.md's local-stack sections", stmts, steps)
}

// runSteps checks that the README's statements (of where) and the steps
// match one to one, in order, then runs each step on its statement.
func runSteps(t *testing.T, where string, stmts []statement, steps []step) {
	t.Helper()
	if len(stmts) != len(steps) {
		var ks []string
		for _, s := range stmts {
			ks = append(ks, "  "+s.key())
		}
		t.Fatalf("%s: %d commands, the test expects %d: write down what each new one answers:\n%s",
			where, len(stmts), len(steps), strings.Join(ks, "\n"))
	}
	for i, st := range stmts {
		if !strings.Contains(st.key(), steps[i].match) {
			t.Fatalf("README command %d is\n  %s\nthe test expects one with %q there", i+1, st.key(), steps[i].match)
		}
	}
	for i, st := range stmts {
		t.Logf("README command %d: %s", i+1, st.key())
		steps[i].do(t, st)
	}
}

var controlsRE = regexp.MustCompile(`(?m)^tollgate_controls_entries\{[^}]*kind="(\w+)"[^}]*\} (\S+)$`)

// gatewayState returns the rules version a gateway enforces (its
// /readyz) and its controls in force by kind (its /metrics).
func gatewayState(t *testing.T, metrics string) (int, map[string]float64) {
	t.Helper()
	_, body := get(t, "http://"+metrics+"/readyz", "")
	var rz struct {
		Rules struct {
			Version int `json:"version"`
		} `json:"rules"`
	}
	_ = json.Unmarshal(body, &rz)
	_, body = get(t, "http://"+metrics+"/metrics", "")
	c := map[string]float64{}
	for _, m := range controlsRE.FindAllStringSubmatch(string(body), -1) {
		c[m[1]], _ = strconv.ParseFloat(m[2], 64)
	}
	return rz.Rules.Version, c
}

// byKeyWith returns the README statement holding every part.
func byKeyWith(t *testing.T, byKey map[string]statement, parts ...string) statement {
	t.Helper()
	for k, s := range byKey {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(k, p)
		}
		if ok {
			return s
		}
	}
	t.Fatalf("README has no command with %q", parts)
	return statement{}
}

// joinEnv is the environment of a README line that starts a second
// gateway or aggregator (NAME=value ... bin/x): bin/stack.env's variables,
// then the line's, each listener moved to a free port, data directories
// to the test's and the README's addresses to the stack's. Every variable
// must be one a Tollgate binary reads.
func joinEnv(t *testing.T, st statement, stackEnv map[string]string, sh *shell) configs.LookupFunc {
	t.Helper()
	env := map[string]string{}
	for k, v := range stackEnv {
		env[k] = v
	}
	words := strings.Fields(strings.ReplaceAll(st.key(), `\`, " "))
	for _, w := range words[:len(words)-1] {
		k, v, ok := strings.Cut(w, "=")
		if !ok {
			t.Fatalf("README line %q: %q is not NAME=value", st.key(), w)
		}
		switch {
		case k == "TOLLGATE_DATA_DIR":
			v = t.TempDir()
		case strings.HasSuffix(k, "_LISTEN") && v != "off":
			v = "127.0.0.1:0"
		default:
			v = sh.subst(v)
		}
		env[k] = v
	}
	var environ []string
	for k, v := range env {
		environ = append(environ, k+"="+v)
	}
	if err := configs.CheckEnv(environ, configs.Registry()); err != nil {
		t.Fatalf("README line %q: %v", st.key(), err)
	}
	return func(k string) (string, bool) { v, ok := env[k]; return v, ok }
}
