package gateway_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/gateway"
	"github.com/tollgate/tollgate/internal/testnet"
	"github.com/tollgate/tollgate/internal/testwait"
)

func reloadRules(limit int, extra string) string {
	return fmt.Sprintf(`
version: %d
routes: ["/v1/users/{id}"]
rules:
  - {id: main, match: {}, algorithm: token_bucket, capacity: %d, rate: %d/1h%s}
`, limit, limit, limit, extra)
}

// TestHotReload: a changed rules file is enforced within 2 s, counters
// carry over; an invalid file is refused, counted, and the running rules
// keep working.
func TestHotReload(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rules: reloadRules(2, "")})
	body := map[string]any{"api_key": "sk_reload", "endpoint": "/r"}
	for i := 0; i < 2; i++ {
		if resp, _ := e.check(body); resp.StatusCode != 200 {
			t.Fatalf("check %d: %d", i, resp.StatusCode)
		}
	}
	if resp, _ := e.check(body); resp.StatusCode != 429 {
		t.Fatalf("3rd check: %d", resp.StatusCode)
	}
	_, before := e.get("http://" + e.gw.addrs.Metrics + "/readyz")

	e.writeRules(reloadRules(5, ""))
	took := testwait.Eventually(t, 2*time.Second, func() error {
		resp, d := e.check(map[string]any{"api_key": "sk_reload", "endpoint": "/r", "cost": 0})
		if d.Limit != 5 {
			return fmt.Errorf("limit %d (status %d)", d.Limit, resp.StatusCode)
		}
		return nil
	})
	t.Logf("reload enforced after %v", took)
	// Raising the limit grants the difference: 2 consumed of 5.
	resp, d := e.check(body)
	if resp.StatusCode != 200 || d.Remaining != 2 {
		t.Fatalf("after the reload: %d %+v, want remaining 2 (consumed units carry over)", resp.StatusCode, d)
	}
	if v := e.metric(e.gw, "tollgate_rules_version"); v != 5 {
		t.Errorf("tollgate_rules_version %v, want 5", v)
	}
	if v := e.metric(e.gw, "tollgate_rules_reloads_total"); v != 1 {
		t.Errorf("tollgate_rules_reloads_total %v, want 1", v)
	}
	_, after := e.get("http://" + e.gw.addrs.Metrics + "/readyz")
	if hashOf(t, before) == hashOf(t, after) {
		t.Errorf("readyz hash unchanged across a reload: %s", after)
	}

	// An invalid file: refused, counted once, old rules stay.
	e.writeRules(reloadRules(7, ", refill_rate: 0"))
	testwait.Eventually(t, 2*time.Second, func() error {
		if v := e.metric(e.gw, "tollgate_rules_reload_errors_total"); v != 1 {
			return fmt.Errorf("tollgate_rules_reload_errors_total %v", v)
		}
		return nil
	})
	_, d = e.check(map[string]any{"api_key": "sk_other", "endpoint": "/r"})
	if d.Limit != 5 || d.Rule != "main" {
		t.Fatalf("after an invalid file: %+v, want the running rules (limit 5)", d)
	}
	_, still := e.get("http://" + e.gw.addrs.Metrics + "/readyz")
	if hashOf(t, still) != hashOf(t, after) {
		t.Errorf("readyz hash changed by an invalid file")
	}
	// A later valid file is applied again.
	e.writeRules(reloadRules(9, ""))
	testwait.Eventually(t, 2*time.Second, func() error {
		if _, d := e.check(map[string]any{"api_key": "sk_third", "endpoint": "/r", "cost": 0}); d.Limit != 9 {
			return fmt.Errorf("limit %d", d.Limit)
		}
		return nil
	})
	if v := e.metric(e.gw, "tollgate_rules_reload_errors_total"); v != 1 {
		t.Errorf("tollgate_rules_reload_errors_total %v after recovery, want still 1", v)
	}
}

func hashOf(t *testing.T, readyz string) string {
	t.Helper()
	var r struct {
		Rules struct {
			Hash string `json:"hash"`
		} `json:"rules"`
	}
	if err := json.Unmarshal([]byte(readyz), &r); err != nil || r.Rules.Hash == "" {
		t.Fatalf("readyz %q: %v", readyz, err)
	}
	return r.Rules.Hash
}

// TestMetricsNeverHoldKeysPathsOrIPs scrapes /metrics after traffic with
// distinctive keys, paths and addresses.
func TestMetricsNeverHoldKeysPathsOrIPs(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rules: `
routes: ["/v1/users/{id}"]
blocklist: ["sk_revoked_*"]
rules:
  - {id: all, match: {}, algorithm: token_bucket, capacity: 2, rate: 2/1h}
  - {id: shadowed, match: {}, algorithm: fixed_window, limit: 1, window: 1h, shadow: true}
`})
	const key = "sk_secretkey_zq81"
	for i := 0; i < 3; i++ {
		e.proxyGet("/v1/users/uid-vv98765", key)
		e.proxyGet("/raw/private-path-77", key)
		e.check(map[string]any{"api_key": key, "endpoint": "/v1/users/uid-ww4242", "ip": "203.0.113.99"})
		e.check(map[string]any{"ip": "2001:db8:dead:beef::1", "endpoint": "/anon/path-x9"})
	}
	e.proxyGet("/v1/users/1", "sk_revoked_zq81")
	e.proxyGet("/v1/users/1", strings.Repeat("q", 300))

	_, body := e.get("http://" + e.gw.addrs.Metrics + "/metrics")
	// The one address allowed is the Redis node of the breaker metric: an
	// operator-configured, bounded set, not a client's.
	redisNode := regexp.MustCompile(`node="[0-9.:]+"`)
	body = redisNode.ReplaceAllString(body, `node="redis"`)
	for _, bad := range []string{"zq81", "vv98765", "private-path", "ww4242", "203.0.113", "2001:db8", "path-x9", "qqqq", "127.0.0.1"} {
		if strings.Contains(body, bad) {
			t.Errorf("/metrics contains %q", bad)
		}
	}
	for _, want := range []string{
		`tollgate_checks_total{decision="allowed",gateway="test-gw",reason="allowed",route="/v1/users/{id}",rule="all"}`,
		`route="other"`,
		`decision="rejected"`,
		`decision="blocked"`,
		`tollgate_shadow_would_reject_total{gateway="test-gw",rule="shadowed"}`,
		`tollgate_check_duration_seconds_bucket`,
		`tollgate_redis_call_duration_seconds_bucket`,
		`tollgate_redis_calls_total`,
		`tollgate_rules_version`,
		`tollgate_rules_reload_errors_total`,
		`tollgate_fallback_counters`,
		`tollgate_redis_breaker_state`,
		`tollgate_controls_entries{gateway="test-gw",kind="blocked"} 0`,
		`tollgate_fastpath_total{gateway="test-gw",result="lease"}`,
		`tollgate_fastpath_leased_units_total`,
		`go_goroutines`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	// Every label value is from a bounded set.
	labelRe := regexp.MustCompile(`(\w+)="([^"]*)"`)
	allowed := map[string]*regexp.Regexp{
		"decision": regexp.MustCompile(`^(allowed|rejected|blocked|invalid|error)$`),
		"reason":   regexp.MustCompile(`^[a-z_]+$`),
		"rule":     regexp.MustCompile(`^(all|shadowed|none)$`),
		"route":    regexp.MustCompile(`^(/v1/users/\{id\}|other)$`),
		"gateway":  regexp.MustCompile(`^test-gw$`),
		"node":     regexp.MustCompile(`^redis$`),
		"kind":     regexp.MustCompile(`^(blocked|allowed|penalty|key_override|tenant_override)$`),
		"result":   regexp.MustCompile(`^(lease|negative|miss|bypass)$`),
		"level":    regexp.MustCompile(`^[1-3]$`),
		"outcome":  regexp.MustCompile(`^(delayed|refused)$`),
	}
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, "tollgate_") {
			continue
		}
		for _, m := range labelRe.FindAllStringSubmatch(line, -1) {
			if m[1] == "le" {
				continue
			}
			re, ok := allowed[m[1]]
			if !ok || !re.MatchString(m[2]) {
				t.Errorf("unexpected label %s=%q in %s", m[1], m[2], line)
			}
		}
	}
}

func TestHealthAndReadiness(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rules: proxyRules})
	if status, body := e.get("http://" + e.gw.addrs.Metrics + "/healthz"); status != 200 || body != "ok\n" {
		t.Fatalf("healthz: %d %q", status, body)
	}
	// Redis counts as missing until its first PING answers.
	testwait.Eventually(t, 10*time.Second, func() error {
		status, body := e.get("http://" + e.gw.addrs.Metrics + "/readyz")
		if status != 200 || !strings.Contains(body, `"status":"ready"`) || !strings.Contains(body, `"redis":{"status":"ok"}`) ||
			!strings.Contains(body, `"source":"file"`) || strings.Contains(body, `"missing"`) {
			return fmt.Errorf("readyz: %d %s", status, body)
		}
		return nil
	})
	// The proxy exposes nothing of its own.
	if resp, body := e.proxyGet("/metrics", "sk_m"); string(body) != "upstream /metrics" {
		t.Fatalf("the proxy answered /metrics itself: %d %s", resp.StatusCode, body)
	}
}

// TestWithoutRedis: the gateway starts without Redis, stays ready, fails
// open with the degraded headers, and limits on_failure: closed rules
// locally with failure_share of their limit.
func TestWithoutRedis(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{
		redisAddr: testnet.FreeAddr(t),
		rules: `
rules:
  - {id: open, match: {endpoint: "^/open"}, algorithm: token_bucket, capacity: 10, rate: 10/1h}
  - {id: closed, match: {endpoint: "^/login"}, algorithm: token_bucket, capacity: 8, rate: 8/1h, on_failure: closed}
`,
		config: func(c *gateway.Config) { c.Redis.Timeout = 50 * time.Millisecond; c.FailureShare = 0.25 },
	})
	status, body := e.get("http://" + e.gw.addrs.Metrics + "/readyz")
	if status != 200 || !strings.Contains(body, `"status":"degraded"`) {
		t.Fatalf("readyz without Redis: %d %s", status, body)
	}
	for i := 0; i < 3; i++ {
		resp, d := e.check(map[string]any{"api_key": "sk_nr", "endpoint": "/open"})
		if resp.StatusCode != 200 || !d.Degraded || d.Remaining != -1 || d.Reason != "redis_unavailable" {
			t.Fatalf("fail open %d: %d %+v", i, resp.StatusCode, d)
		}
		if resp.Header.Get("X-RateLimit-Policy") != "degraded" || resp.Header.Get("X-RateLimit-Remaining") != "-1" || resp.Header.Get("RateLimit") != "" {
			t.Fatalf("degraded headers: %v", resp.Header)
		}
	}
	// capacity 8 × 0.25 = 2 locally.
	for i, want := range []int{200, 200, 429} {
		resp, d := e.check(map[string]any{"api_key": "sk_nr", "endpoint": "/login"})
		if resp.StatusCode != want || !d.Degraded {
			t.Fatalf("closed rule %d: %d %+v, want %d", i, resp.StatusCode, d, want)
		}
	}
	if v := e.metric(e.gw, "tollgate_redis_errors_total"); v < 1 {
		t.Errorf("tollgate_redis_errors_total %v", v)
	}
	if resp, _ := e.proxyGet("/open", "sk_nr"); resp.StatusCode != 200 {
		t.Fatalf("proxy without Redis: %d", resp.StatusCode)
	}
}

func TestServerLifecycle(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rules: proxyRules})

	// Close is idempotent and safe from many goroutines; Run once only.
	srv, err := gateway.New(e.config(), nil)
	if err != nil {
		t.Fatal(err)
	}
	g := run(t, srv)
	testwait.Eventually(t, 5*time.Second, func() error {
		resp, err := http.Get("http://" + g.addrs.Metrics + "/healthz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	})
	if err := srv.Run(t.Context()); !errors.Is(err, gateway.ErrRunning) {
		t.Fatalf("second Run: %v", err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if err := srv.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
	}
	wg.Wait()
	select {
	case <-g.run.Done():
		if err := g.run.Wait(); err != nil {
			t.Fatalf("Run after Close: %v", err)
		}
	default:
		t.Fatal("Close returned before Run")
	}
	if err := srv.Run(t.Context()); !errors.Is(err, gateway.ErrClosed) {
		t.Fatalf("Run after Close: %v", err)
	}

	// A server never run releases its listeners on Close.
	srv2, err := gateway.New(e.config(), nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := srv2.Addrs().API
	if err := srv2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := srv2.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := http.Get("http://" + addr + "/v1/check"); err == nil {
		t.Fatal("a closed server still accepts connections")
	}

	// A listener conflict fails New, naming the variable that moves it.
	cfg := e.config()
	cfg.APIListen = e.gw.addrs.API
	if _, err := gateway.New(cfg, nil); !errors.Is(err, syscall.EADDRINUSE) || !strings.Contains(err.Error(), "TOLLGATE_API_LISTEN") {
		t.Fatalf("New on a busy port: %v", err)
	}
}

func TestNewRefusesBadRules(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rules: proxyRules})
	e.writeRules("rules:\n  - {id: x, match: {}, algorithm: token_bucket, capacity: 0, rate: 1/1s}\n")
	_, err := gateway.New(e.config(), nil)
	if err == nil || !strings.Contains(err.Error(), `rule "x"`) || !strings.Contains(err.Error(), "capacity") {
		t.Fatalf("New with an invalid rules file: %v", err)
	}
	cfg := e.config()
	cfg.RulesFile = e.rulesPath + ".missing"
	if _, err := gateway.New(cfg, nil); err == nil || !strings.Contains(err.Error(), "rules_file") {
		t.Fatalf("New without a rules file: %v", err)
	}
}
