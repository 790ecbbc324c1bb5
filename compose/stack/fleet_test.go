package stack_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/compose/redisserver"
	"github.com/tollgate/tollgate/compose/stack"
	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/gateway"
	"github.com/tollgate/tollgate/internal/logtest"
	"github.com/tollgate/tollgate/internal/testnet"
	"github.com/tollgate/tollgate/internal/testwait"
)

// operator calls the stack's operator API with the banner's token.
func operator(t *testing.T, r *running, token, method, path string, body []byte) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+r.addrs.Aggregator+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, b := do(t, req)
	return resp.StatusCode, b
}

// bannerValue returns what follows label on the banner's line for it.
func bannerValue(t *testing.T, banner, label string) string {
	t.Helper()
	for _, line := range strings.Split(banner, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), label); ok {
			return strings.Fields(rest)[0]
		}
	}
	t.Fatalf("banner has no %q line:\n%s", label, banner)
	return ""
}

// readEnvFile reads bin/stack.env's KEY=VALUE lines.
func readEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	_, env := testnet.EnvFile(t, path)
	return env
}

// TestFleetJourney is the done-when of the control plane: a newcomer runs
// make run, follows the printed curl lines — spends the demo key, raises
// its limit and blocks it through the operator API — and sees each take
// effect at once on the gateway, and on a second gateway joined through
// bin/stack.env.
func TestFleetJourney(t *testing.T) {
	t.Parallel()
	if _, err := redisserver.LookPath(); err != nil {
		t.Fatalf("%v (make deps installs it)", err)
	}
	cfg := testConfig(stack.RedisServer)
	cfg.EnvFile = filepath.Join(t.TempDir(), "stack.env")
	r := start(t, cfg)
	defer r.stop(t)
	checkBannerSample(t, r, cfg)
	banner := r.banner.String()
	token := bannerValue(t, banner, "admin token")
	agg := "http://" + r.addrs.Aggregator
	proxy := "http://" + r.addrs.Proxy

	// The banner's lines, as printed.
	for _, want := range []string{
		fmt.Sprintf("sed '%s' %s | curl -s -X PUT -H 'Authorization: Bearer %s' --data-binary @- %s/admin/v1/rules", stack.RaiseSed, rulesFile, token, agg),
		fmt.Sprintf(`curl -s -X PUT -H 'Authorization: Bearer %s' -d '{"ttl":"10m","reason":"demo"}' %s/admin/v1/blocklist/sk_free_demo`, token, agg),
		fmt.Sprintf("curl -s -H 'Authorization: Bearer %s' %s/admin/v1/audit", token, agg),
		fmt.Sprintf(`curl -s -o /dev/null -w '%%{http_code}\n' -H 'X-API-Key: sk_free_demo' %s/v1/users/42`, proxy),
		"seeded from " + rulesFile + " into NATS",
	} {
		if !strings.Contains(banner, want) {
			t.Errorf("banner lacks\n  %s\nin:\n%s", want, banner)
		}
	}
	status := func(base string) int {
		resp, _ := get(t, base+"/v1/users/42", "sk_free_demo")
		return resp.StatusCode
	}

	// The stack's gateway follows NATS, seeded from the rules file.
	resp, body := get(t, "http://"+r.addrs.Metrics+"/readyz", "")
	if resp.StatusCode != 200 || !bytes.Contains(body, []byte(`"source":"nats"`)) {
		t.Fatalf("gateway readyz: %d %s, want rules from nats", resp.StatusCode, body)
	}

	// Spend the demo key: five pass, the sixth is refused.
	for i := 1; i <= 6; i++ {
		want := http.StatusOK
		if i == 6 {
			want = http.StatusTooManyRequests
		}
		if got := status(proxy); got != want {
			t.Fatalf("sk_free_demo request %d: %d, want %d", i, got, want)
		}
	}

	// The operator's view of the spent key agrees with the gateway: a
	// check now would get 429, and the rule that says so would not allow it.
	code, b := operator(t, r, token, "GET", "/admin/v1/keys/sk_free_demo?endpoint=/v1/users/42", nil)
	var view struct {
		Status int    `json:"status"`
		Reason string `json:"reason"`
		Rules  []struct {
			WouldAllow bool `json:"would_allow"`
		} `json:"rules"`
	}
	if code != 200 || json.Unmarshal(b, &view) != nil || view.Status != http.StatusTooManyRequests || view.Reason != "rate_limited" ||
		len(view.Rules) == 0 || view.Rules[0].WouldAllow {
		t.Fatalf("GET keys/sk_free_demo of the spent key: %d %s, want status 429 with a rule that would not allow it", code, b)
	}

	// A quota grant reaches the gateway's fast path too: the negative cache
	// that answered the 429 above from memory, for as long as its
	// Retry-After, is dropped, and the granted unit is admitted at once.
	if code, b := operator(t, r, token, "POST", "/admin/v1/keys/sk_free_demo/quota", []byte(`{"endpoint":"/v1/users/42","tokens":1}`)); code != 200 {
		t.Fatalf("POST keys/sk_free_demo/quota: %d %s", code, b)
	}
	admitted := func(after string) time.Duration {
		t.Helper()
		return testwait.Eventually(t, 2*time.Second, func() error {
			if got := status(proxy); got != http.StatusOK {
				return fmt.Errorf("sk_free_demo after %s: %d", after, got)
			}
			return nil
		})
	}
	t.Logf("granted unit admitted by the stack's gateway %v after the operator API answered", admitted("a quota grant of 1"))
	if got := status(proxy); got != http.StatusTooManyRequests {
		t.Fatalf("sk_free_demo after its granted unit: %d, want 429", got)
	}

	// Raise its limit: the sed line, then the PUT.
	src, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(src, []byte("capacity: 5 ")); n != 1 {
		t.Fatalf("%s holds %d lines the banner's sed changes, want 1", rulesFile, n)
	}
	raised := bytes.Replace(src, []byte("capacity: 5 "), []byte("capacity: 50 "), 1)
	if code, b := operator(t, r, token, "PUT", "/admin/v1/rules", raised); code != 200 {
		t.Fatalf("PUT rules: %d %s", code, b)
	}
	t.Logf("raised limit in force on the stack's gateway %v after the operator API answered", admitted("the raise"))

	// The operator API's key routes act on the stack's Redis, the
	// gateway's counters: the key's state shows what the requests above
	// spent, and a reset gives it its whole bucket back.
	spent := func() int64 {
		t.Helper()
		code, b := operator(t, r, token, "GET", "/admin/v1/keys/sk_free_demo?endpoint=/v1/users/42", nil)
		var out struct {
			Rules []struct {
				ID               string
				Limit, Remaining int64
			} `json:"rules"`
		}
		if code != 200 || json.Unmarshal(b, &out) != nil || len(out.Rules) == 0 {
			t.Fatalf("GET keys/sk_free_demo: %d %s", code, b)
		}
		var n int64
		for _, rr := range out.Rules {
			n += rr.Limit - rr.Remaining
		}
		return n
	}
	if n := spent(); n < 6 {
		t.Fatalf("GET keys/sk_free_demo: %d units spent, want the 6 requests above: not the gateway's Redis?", n)
	}
	if code, b := operator(t, r, token, "POST", "/admin/v1/keys/sk_free_demo/reset", []byte(`{"endpoint":"/v1/users/42"}`)); code != 200 {
		t.Fatalf("POST keys/sk_free_demo/reset: %d %s", code, b)
	}
	if n := spent(); n != 0 {
		t.Fatalf("after the reset, %d units spent, want 0", n)
	}
	// kid: works for a key of the registry (sk_free_demo is one); another
	// key_id is refused with the reason.
	code, b = operator(t, r, token, "GET", "/admin/v1/keys/sk_free_demo", nil)
	var ids struct {
		KeyID string `json:"key_id"`
	}
	if code != 200 || json.Unmarshal(b, &ids) != nil || ids.KeyID == "" {
		t.Fatalf("GET keys/sk_free_demo: %d %s", code, b)
	}
	if code, b := operator(t, r, token, "POST", "/admin/v1/keys/kid:"+ids.KeyID+"/reset", []byte(`{"endpoint":"/v1/users/42"}`)); code != 200 ||
		!bytes.Contains(b, []byte(ids.KeyID)) {
		t.Fatalf("POST keys/kid:%s/reset: %d %s", ids.KeyID, code, b)
	}
	if code, b := operator(t, r, token, "GET", "/admin/v1/keys/kid:AAAAAAAAAAAAAAAAAAAAAA", nil); code != 400 || !bytes.Contains(b, []byte("key registry")) {
		t.Fatalf("GET keys/kid: of no registered key: %d %s, want 400 naming the registry", code, b)
	}

	// Beside bin/stack.env, bin/stack.pid names this stack's process (the
	// storm's -pid), and both go when it stops (defers run before cleanups).
	pidFile := stack.PIDFile(cfg.EnvFile)
	if b, err := os.ReadFile(pidFile); err != nil || string(b) != strconv.Itoa(os.Getpid())+"\n" {
		t.Errorf("%s: %q, %v; want this process's pid", pidFile, b, err)
	}
	t.Cleanup(func() {
		for _, f := range []string{cfg.EnvFile, pidFile} {
			if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s after the stack stopped: %v, want it removed", f, err)
			}
		}
	})

	// A second gateway joins through bin/stack.env.
	env := readEnvFile(t, cfg.EnvFile)
	if got := env["TOLLGATE_REDIS_TIMEOUT"]; got != testRedisTimeout.String() {
		t.Errorf("stack.env: TOLLGATE_REDIS_TIMEOUT=%q, want the stack's deadline %v", got, testRedisTimeout)
	}
	for _, k := range []string{"TOLLGATE_REDIS_ADDRS", "TOLLGATE_KAFKA_BROKERS", "TOLLGATE_NATS_URL", "TOLLGATE_KEY_SECRET", "TOLLGATE_ADMIN_TOKEN"} {
		if env[k] == "" {
			t.Errorf("stack.env lacks %s", k)
		}
	}
	var environ []string
	for k, v := range env {
		environ = append(environ, k+"="+v)
	}
	if err := configs.CheckEnv(environ, configs.Registry()); err != nil {
		t.Fatalf("stack.env: %v", err)
	}
	for k, v := range map[string]string{
		"TOLLGATE_LISTEN": "127.0.0.1:0", "TOLLGATE_API_LISTEN": "127.0.0.1:0", "TOLLGATE_METRICS_LISTEN": "127.0.0.1:0",
		"TOLLGATE_GRPC_LISTEN": "off", "TOLLGATE_UPSTREAM": "http://" + r.addrs.Demo, "TOLLGATE_RULES_FILE": rulesFile,
		"TOLLGATE_GATEWAY_ID": "second", "TOLLGATE_DATA_DIR": t.TempDir(),
	} {
		env[k] = v
	}
	gcfg, err := gateway.LoadConfig("", func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	second, err := gateway.New(gcfg, logtest.Warnings(t).With("part", "second-gateway"))
	if err != nil {
		t.Fatal(err)
	}
	run := testnet.Start(t, "second gateway", second.Run)
	defer run.StopNow(t)
	proxy2 := "http://" + second.Addrs().Proxy
	testwait.Eventually(t, 5*time.Second, func() error {
		resp, body := get(t, "http://"+second.Addrs().Metrics+"/readyz", "")
		if resp.StatusCode != 200 || !bytes.Contains(body, []byte(`"source":"nats"`)) {
			return fmt.Errorf("second gateway readyz: %d %s", resp.StatusCode, body)
		}
		return nil
	})
	// Same rules, same counters: the raised bucket, minus what was spent.
	resp, body = get(t, proxy2+"/v1/users/42", "sk_free_demo")
	if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("RateLimit-Policy"), `"free-default";q=50`) {
		t.Fatalf("second gateway: %d, RateLimit-Policy %q: %s", resp.StatusCode, resp.Header.Get("RateLimit-Policy"), body)
	}

	// Block the demo key: both gateways answer 403 at once.
	code, b = operator(t, r, token, "PUT", "/admin/v1/blocklist/sk_free_demo", []byte(`{"ttl":"10m","reason":"demo"}`))
	if code != 200 {
		t.Fatalf("PUT blocklist: %d %s", code, b)
	}
	took := testwait.Eventually(t, 2*time.Second, func() error {
		for _, p := range []string{proxy, proxy2} {
			if got := status(p); got != http.StatusForbidden {
				return fmt.Errorf("%s: sk_free_demo %d, want 403", p, got)
			}
		}
		return nil
	})
	t.Logf("block in force on both gateways %v after the operator API answered", took)

	// The audit log names both changes.
	testwait.Eventually(t, 10*time.Second, func() error {
		code, b := operator(t, r, token, "GET", "/admin/v1/audit", nil)
		var out struct {
			Entries []struct {
				Kind   string `json:"kind"`
				Reason string `json:"reason"`
			} `json:"entries"`
		}
		if code != 200 || json.Unmarshal(b, &out) != nil {
			return fmt.Errorf("audit: %d %s", code, b)
		}
		kinds := map[string]int{}
		for _, e := range out.Entries {
			kinds[e.Kind]++
		}
		if kinds["rules"] < 2 || kinds["blocklist"] < 1 {
			return fmt.Errorf("audit kinds %v, want the seed and the raise (rules) and the block", kinds)
		}
		return nil
	})

	// The decision stream: decisions on both gateways show up, exactly, in
	// tenant acme's usage report within seconds (the README's report curl).
	acme := func() (int64, error) {
		code, b := operator(t, r, token, "GET", "/v1/usage/tenants/acme?granularity=minute", nil)
		var out struct {
			Totals struct{ Allowed, Rejected int64 } `json:"totals"`
		}
		if code != 200 || json.Unmarshal(b, &out) != nil {
			return 0, fmt.Errorf("report: %d %s", code, b)
		}
		return out.Totals.Allowed + out.Totals.Rejected, nil
	}
	before, err := acme()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{proxy, proxy2, proxy, proxy2, proxy, proxy2} {
		if resp, body := get(t, p+"/v1/users/42", "sk_prod_acme_1"); resp.StatusCode != 200 {
			t.Fatalf("sk_prod_acme_1 on %s: %d %s", p, resp.StatusCode, body)
		}
	}
	took = testwait.Eventually(t, 10*time.Second, func() error {
		n, err := acme()
		if err != nil {
			return err
		}
		if n != before+6 {
			return fmt.Errorf("tenant acme's report holds %d decisions, want %d + the 6 made on two gateways", n, before)
		}
		return nil
	})
	t.Logf("decisions of two gateways in the usage report %v after they were made", took)
}
