package stack_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/compose/demoapi"
	"github.com/tollgate/tollgate/compose/redisserver"
	"github.com/tollgate/tollgate/compose/stack"
	"github.com/tollgate/tollgate/internal/testnet"
	"github.com/tollgate/tollgate/internal/testwait"
)

// rulesFile is the shipped ruleset, the one make run loads.
const rulesFile = "../../configs/rules.yaml"

// testRedisTimeout is the stack's Redis deadline in tests. The journeys
// check decisions, not latency: on a loaded CI machine (two cores, the
// race detector, other packages' tests beside) a Redis call can take
// longer than the product's 50 ms, and past the deadline a 429 turns into
// a fail-open 200 without RateLimit headers and the operator API's key
// routes into 503 REDIS_UNAVAILABLE.
const testRedisTimeout = 5 * time.Second

// testConfig puts every listener on a free port, with a generous Redis
// deadline.
func testConfig(redis string) stack.Config {
	return stack.Config{
		RedisClient:   stack.RedisClient{Timeout: testRedisTimeout},
		Listen:        "127.0.0.1:0",
		APIListen:     "127.0.0.1:0",
		MetricsListen: "127.0.0.1:0",
		GRPCListen:    "127.0.0.1:0",
		DemoListen:    "127.0.0.1:0",
		RulesFile:     rulesFile,
		Redis:         redis,

		KafkaListen:             "127.0.0.1:0",
		NATSListen:              "127.0.0.1:0",
		AggregatorListen:        "127.0.0.1:0",
		AggregatorMetricsListen: "127.0.0.1:0",
		EnvFile:                 "off",
	}
}

// running is a stack running in the background.
type running struct {
	st       *stack.Stack
	logs     *testnet.Buffer // every log line, debug level included
	startLog string          // the log up to Ready
	banner   *bytes.Buffer   // written once, before Ready is closed
	cancel   context.CancelFunc
	errc     chan error
	addrs    stack.Addrs
}

// start starts a stack and waits until it is ready. The test must stop it
// with stop; a cleanup does it too if the test fails first.
func start(t *testing.T, cfg stack.Config) *running {
	t.Helper()
	return startWithin(t, cfg, slog.LevelInfo, 30*time.Second)
}

// startWithin is start with the level of the log lines the test's output
// shows and how long the stack may take to be ready.
func startWithin(t *testing.T, cfg stack.Config, level slog.Level, ready time.Duration) *running {
	t.Helper()
	r := &running{logs: &testnet.Buffer{}, banner: &bytes.Buffer{}, errc: make(chan error, 1)}
	log := slog.New(slog.NewMultiHandler(
		slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: level}),
		slog.NewTextHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	var err error
	r.st, err = stack.New(cfg, log, r.banner)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.errc <- r.st.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-r.errc // nil or already checked by stop
	})
	select {
	case <-r.st.Ready():
	case err := <-r.errc:
		r.errc <- err
		t.Fatalf("Run returned before Ready: %v", err)
	case <-time.After(ready):
		t.Fatalf("stack not ready within %v", ready)
	}
	r.addrs = r.st.Addrs()
	r.startLog = r.logs.String()
	return r
}

// startRaces are what the start-up log says when the gateway starts before
// the aggregator has created the topics it produces to and the buckets it
// watches.
var startRaces = []string{
	"control plane unavailable",
	"does not exist yet",
	"Kafka does not know the topic",
	"partition count is unknown",
	"has not seeded",
}

// checkCleanStart fails when the start-up log shows the gateway racing the
// aggregator, and logs any other warning of the start.
func (r *running) checkCleanStart(t *testing.T) {
	t.Helper()
	for _, line := range strings.Split(r.startLog, "\n") {
		for _, race := range startRaces {
			if strings.Contains(line, race) {
				t.Errorf("start-up log: the gateway started before the aggregator had set up Kafka and NATS: %s", line)
			}
		}
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			t.Logf("start-up warning: %s", line)
		}
	}
}

// checkLogKeys fails when a log line repeats an attribute key that names
// where it comes from (the stack's part, the gateway's component).
func (r *running) checkLogKeys(t *testing.T) {
	t.Helper()
	for _, line := range strings.Split(r.logs.String(), "\n") {
		for _, key := range []string{"part=", "component="} {
			if strings.Count(line, " "+key) > 1 {
				t.Errorf("log line repeats %s: %s", key, line)
			}
		}
	}
}

// stop cancels Run's context and checks that Run returns nil within
// stopTimeout.
func (r *running) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.errc:
		r.errc <- nil // for the cleanup
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(stopTimeout):
		t.Fatalf("Run did not return within %v of the cancel", stopTimeout)
	}
}

// stopTimeout bounds the stack's shutdown in tests: a liveness bound, not
// a speed one. The gateway drains and flushes its events for up to 5 s,
// and on a loaded CI machine the Kafka broker alone was seen taking 11 s
// to close.
const stopTimeout = 45 * time.Second

var client = &http.Client{Timeout: 10 * time.Second}

func get(t *testing.T, url, key string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	return do(t, req)
}

func do(t *testing.T, req *http.Request) (*http.Response, []byte) {
	t.Helper()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

// journey replays what the banner tells a newcomer to try, and returns
// when the 429's Retry-After ends.
func journey(t *testing.T, r *running) time.Time {
	t.Helper()
	proxy := "http://" + r.addrs.Proxy

	// One that passes, with the headers, answered by the demo API.
	resp, body := get(t, proxy+"/v1/users/42", "sk_prod_acme_1")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("sk_prod_acme_1: status %d: %s", resp.StatusCode, body)
	}
	for _, h := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit-Policy", "RateLimit"} {
		if resp.Header.Get(h) == "" {
			t.Errorf("sk_prod_acme_1: no %s header", h)
		}
	}
	var demo struct {
		OK      bool   `json:"ok"`
		Service string `json:"service"`
		Path    string `json:"path"`
	}
	if err := json.Unmarshal(body, &demo); err != nil || !demo.OK || demo.Service != demoapi.Service || demo.Path != "/v1/users/42" {
		t.Errorf("sk_prod_acme_1: body %s (%v), want the demo API's answer", body, err)
	}

	// The demo key: five pass, the sixth is 429 with Retry-After.
	var retryEnds time.Time
	for i := 1; i <= 6; i++ {
		resp, body := get(t, proxy+"/v1/users/42", "sk_free_demo")
		want := http.StatusOK
		if i == 6 {
			want = http.StatusTooManyRequests
		}
		if resp.StatusCode != want {
			t.Fatalf("sk_free_demo request %d: status %d, want %d: %s", i, resp.StatusCode, want, body)
		}
		if i < 6 {
			continue
		}
		ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
		if err != nil || ra < 1 {
			t.Fatalf("429 Retry-After %q, want whole seconds >= 1", resp.Header.Get("Retry-After"))
		}
		retryEnds = time.Now().Add(time.Duration(ra) * time.Second)
		var rejection struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal(body, &rejection); err != nil || rejection.Error.Code != "RATE_LIMIT_EXCEEDED" {
			t.Errorf("429 body %s (%v)", body, err)
		}
	}

	// The check API shares the proxy's counters: the demo key is spent.
	req, err := http.NewRequest(http.MethodPost, "http://"+r.addrs.API+"/v1/check",
		strings.NewReader(`{"api_key":"sk_free_demo","endpoint":"/v1/users/42","method":"GET","ip":"127.0.0.1"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp, body = do(t, req)
	var decision struct {
		Allowed    bool   `json:"allowed"`
		Status     int    `json:"status"`
		Rule       string `json:"rule"`
		RetryAfter int    `json:"retry_after"`
	}
	if err := json.Unmarshal(body, &decision); err != nil {
		t.Fatalf("check API: %s: %v", body, err)
	}
	if resp.StatusCode != http.StatusTooManyRequests || decision.Allowed || decision.Status != 429 || decision.Rule != "free-default" || decision.RetryAfter < 1 {
		t.Errorf("check API: status %d, decision %s; want the spent free-default bucket", resp.StatusCode, body)
	}

	// The latency endpoint, through the proxy.
	resp, body = get(t, proxy+"/v1/slow?ms=5", "sk_prod_acme_1")
	if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte(`"slept_ms":5`)) {
		t.Errorf("/v1/slow: status %d: %s", resp.StatusCode, body)
	}

	// Metrics count what happened.
	resp, body = get(t, "http://"+r.addrs.Metrics+"/metrics", "")
	if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte(`tollgate_checks_total{decision="rejected"`)) {
		t.Errorf("/metrics: status %d, no rejected checks in %d bytes", resp.StatusCode, len(body))
	}

	// The banner names what was tried.
	banner := r.banner.String()
	for _, s := range []string{proxy + "/v1/users/42", "http://" + r.addrs.API + "/v1/check", "http://" + r.addrs.Metrics + "/metrics", "sk_free_demo", "sk_prod_acme_1", r.addrs.Redis, "Ctrl-C"} {
		if !strings.Contains(banner, s) {
			t.Errorf("banner lacks %q:\n%s", s, banner)
		}
	}
	return retryEnds
}

// redisPid returns the pid of the redis-server process serving addr, or 0
// (Linux: redis-server shows its address in its process title).
func redisPid(t *testing.T, addr string) int {
	t.Helper()
	dirs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range dirs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // gone meanwhile
		}
		cmd := string(bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
		if strings.Contains(cmd, "redis-server") && strings.Contains(cmd, addr) {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			return pid
		}
	}
	return 0
}

func refused(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil
	}
	_ = c.Close()
	return fmt.Errorf("%s still accepts connections", addr)
}

// TestJourneyRedisServer runs the README's journey against the stack with a
// real redis-server, waits out the 429's Retry-After as a client would,
// then stops the stack and checks nothing is left running.
func TestJourneyRedisServer(t *testing.T) {
	t.Parallel()
	if _, err := redisserver.LookPath(); err != nil {
		t.Fatalf("%v (make deps installs it)", err)
	}
	r := start(t, testConfig(stack.RedisServer))
	if got := r.st.RedisBackend(); got != stack.BackendRedisServer {
		t.Fatalf("RedisBackend %q", got)
	}
	var pid int
	if runtime.GOOS == "linux" {
		if pid = redisPid(t, r.addrs.Redis); pid == 0 {
			t.Fatalf("no redis-server process serving %s", r.addrs.Redis)
		}
	}
	r.checkCleanStart(t)
	lateRedis(t, r)
	retryEnds := journey(t, r)
	// A malformed key is refused by the gateway's proxy, which logs it at
	// debug level under its component, within the stack's gateway part.
	if resp, _ := get(t, "http://"+r.addrs.Proxy+"/v1/users/42", "bad key"); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("malformed key: status %d", resp.StatusCode)
	}
	if !strings.Contains(r.logs.String(), "part=gateway component=proxy") {
		t.Errorf("no proxy line from the gateway part in the log:\n%s", r.logs.String())
	}
	r.checkLogKeys(t)

	// A client that waits exactly Retry-After is admitted (Retry-After is never early). This
	// wait is the behaviour under test, not synchronisation.
	<-time.After(time.Until(retryEnds))
	if resp, body := get(t, "http://"+r.addrs.Proxy+"/v1/users/42", "sk_free_demo"); resp.StatusCode != http.StatusOK {
		t.Fatalf("after Retry-After: status %d: %s", resp.StatusCode, body)
	}

	r.stop(t)
	for _, addr := range []string{r.addrs.Proxy, r.addrs.API, r.addrs.Metrics, r.addrs.GRPC, r.addrs.Demo, r.addrs.Redis} {
		if err := refused(addr); err != nil {
			t.Error(err)
		}
	}
	if pid != 0 {
		testwait.Eventually(t, 5*time.Second, func() error {
			if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
				return fmt.Errorf("redis-server pid %d still exists", pid)
			}
			return nil
		})
	}
	if err := r.st.Run(context.Background()); !errors.Is(err, stack.ErrRunning) {
		t.Errorf("second Run: %v, want ErrRunning", err)
	}
}

// lateRedis checks that the stack's gateway and aggregator wait for a
// Redis that answers late (paused with CLIENT PAUSE for longer than the
// product's 50 ms deadline, as a loaded machine makes it) for up to the
// stack's deadline: the gateway decides with its RateLimit headers rather
// than failing open, and the operator API reads the key's state rather
// than answering 503 REDIS_UNAVAILABLE.
func lateRedis(t *testing.T, r *running) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: r.addrs.Redis, DisableIdentity: true})
	defer rdb.Close()
	pause := func() {
		t.Helper()
		if err := rdb.Do(t.Context(), "CLIENT", "PAUSE", strconv.Itoa(int(lateFor.Milliseconds())), "ALL").Err(); err != nil {
			t.Fatalf("CLIENT PAUSE: %v", err)
		}
	}
	pause()
	began := time.Now()
	resp, body := get(t, "http://"+r.addrs.Proxy+"/v1/users/42", "sk_prod_acme_1")
	if resp.StatusCode != http.StatusOK || resp.Header.Get("RateLimit") == "" {
		t.Errorf("sk_prod_acme_1 while Redis answers late: %d, RateLimit %q, after %v: %s; want 200 decided by Redis, with its headers",
			resp.StatusCode, resp.Header.Get("RateLimit"), time.Since(began).Round(time.Millisecond), body)
	}
	pause()
	began = time.Now()
	req, err := http.NewRequest(http.MethodGet, "http://"+r.addrs.Aggregator+"/admin/v1/keys/sk_prod_acme_1?endpoint=/v1/users/42", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+bannerValue(t, r.banner.String(), "admin token"))
	if resp, body := do(t, req); resp.StatusCode != http.StatusOK {
		t.Errorf("GET keys/sk_prod_acme_1 while Redis answers late: %d after %v: %s; want 200",
			resp.StatusCode, time.Since(began).Round(time.Millisecond), body)
	}
}

// lateFor is how long lateRedis pauses Redis: past the product's 50 ms
// deadline, well within the tests' (testRedisTimeout).
const lateFor = 300 * time.Millisecond

// TestJourneyEmbeddedRedis runs the same journey when no redis-server can
// be found, so make run falls back to the embedded Redis. That fallback is
// the only place miniredis is allowed in Tollgate (never a
// test backend); this test exists to keep it working.
func TestJourneyEmbeddedRedis(t *testing.T) {
	t.Setenv(redisserver.EnvServer, filepath.Join(t.TempDir(), "no-redis-server"))
	r := start(t, testConfig(stack.RedisAuto))
	if got := r.st.RedisBackend(); got != stack.BackendEmbedded {
		t.Fatalf("RedisBackend %q, want the embedded fallback", got)
	}
	if !strings.Contains(r.banner.String(), "embedded") {
		t.Errorf("banner does not say Redis is embedded:\n%s", r.banner)
	}
	journey(t, r)
	r.stop(t)
	if err := refused(r.addrs.Redis); err != nil {
		t.Error(err)
	}
}

// TestEmbeddedCountersExpire checks what the embedded Redis needs for the
// guard's scripts beyond EVALSHA: TIME from the wall clock and TTLs that
// count down (miniredis's ClockTTL), so an idle counter disappears.
func TestEmbeddedCountersExpire(t *testing.T) {
	t.Parallel()
	r := start(t, testConfig(stack.RedisEmbedded))
	defer r.stop(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.addrs.Redis, DisableIdentity: true})
	defer rdb.Close()
	ctx := t.Context()
	secs, err := rdb.Eval(ctx, "return redis.call('TIME')[1]", nil).Text()
	if err != nil {
		t.Fatalf("TIME from a script: %v", err)
	}
	unix, err := strconv.ParseInt(secs, 10, 64)
	if err != nil {
		t.Fatalf("TIME from a script: %q: %v", secs, err)
	}
	if d := time.Since(time.Unix(unix, 0)); d < -2*time.Second || d > 2*time.Second {
		t.Errorf("TIME is %v off the wall clock", d)
	}
	if err := rdb.Set(ctx, "k", "v", 50*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 5*time.Second, func() error {
		n, err := rdb.Exists(ctx, "k").Result()
		if err != nil || n != 0 {
			return fmt.Errorf("EXISTS k = %d, %v after its 50ms TTL", n, err)
		}
		return nil
	})
}

func TestNewRefusesBusyPorts(t *testing.T) {
	t.Parallel()
	ln := testnet.Listen(t)
	cfg := testConfig(stack.RedisServer)
	cfg.APIListen = ln.Addr().String()
	_, err := stack.New(cfg, nil, nil)
	if !errors.Is(err, stack.ErrAddrInUse) || !strings.Contains(err.Error(), "TOLLGATE_API_LISTEN") {
		t.Fatalf("New: %v, want ErrAddrInUse naming TOLLGATE_API_LISTEN", err)
	}
}

func TestConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		mutate func(*stack.Config)
		want   string // "" means valid
	}{
		{"defaults", func(*stack.Config) {}, ""},
		{"bad redis", func(c *stack.Config) { c.Redis = "docker" }, "TOLLGATE_STACK_REDIS"},
		{"short secret", func(c *stack.Config) { c.KeySecret = "short" }, "TOLLGATE_KEY_SECRET"},
		{"bad address", func(c *stack.Config) { c.DemoListen = "9000" }, "TOLLGATE_DEMO_LISTEN"},
		{"same port twice", func(c *stack.Config) { c.GRPCListen = c.Listen }, "TOLLGATE_GRPC_LISTEN"},
		{"bad log level", func(c *stack.Config) { c.Log.Level = "loud" }, "TOLLGATE_LOG_LEVEL"},
		{"redis deadline", func(c *stack.Config) { c.RedisClient.Timeout = 2 * time.Second }, ""},
		{"negative redis deadline", func(c *stack.Config) { c.RedisClient.Timeout = -time.Second }, "TOLLGATE_REDIS_TIMEOUT"},
		{"three regions", func(c *stack.Config) { c.Regions = 3 }, ""},
		{"no region", func(c *stack.Config) { c.Regions = -1 }, "TOLLGATE_STACK_REGIONS"},
		{"too many regions", func(c *stack.Config) { c.Regions = stack.MaxRegions + 1 }, "TOLLGATE_STACK_REGIONS"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var c stack.Config
			c.SetDefaults()
			tt.mutate(&c)
			err := c.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("Validate: %v, want an error naming %s", err, tt.want)
			}
		})
	}
}

func TestDefaultsAreSpecAddresses(t *testing.T) {
	t.Parallel()
	c, err := stack.LoadConfig(func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	want := stack.Config{
		Listen: "127.0.0.1:8080", APIListen: "127.0.0.1:8082", MetricsListen: "127.0.0.1:9091",
		GRPCListen: "127.0.0.1:8089", DemoListen: "127.0.0.1:9000", RulesFile: "configs/rules.yaml", Redis: "auto",
		KafkaListen: "127.0.0.1:9092", NATSListen: "nats://127.0.0.1:4222", AggregatorListen: "127.0.0.1:8081",
		AggregatorMetricsListen: "127.0.0.1:9093", EnvFile: "bin/stack.env", Regions: 1,
	}
	want.Log.Level, want.Log.Format = "info", "text"
	// The ladder's and the offenders' defaults are the aggregator's and
	// the gateway's own.
	want.Penalty.SetDefaults()
	want.Offenders.SetDefaults()
	if !reflect.DeepEqual(c, want) {
		t.Errorf("defaults %+v, want %+v", c, want)
	}
	env := map[string]string{"TOLLGATE_LISTEN": "127.0.0.1:18080", "TOLLGATE_KEY_SECRET": "0123456789abcdef", "TOLLGATE_STACK_REDIS": "embedded",
		"TOLLGATE_PENALTY_BLOCK_FOR": "2m", "TOLLGATE_OFFENDERS_CLOSE_AFTER": "5"}
	c, err = stack.LoadConfig(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:18080" || c.KeySecret != "0123456789abcdef" || c.Redis != "embedded" ||
		c.Penalty.BlockFor != 2*time.Minute || c.Offenders.CloseAfter != 5 {
		t.Errorf("variables not applied: %+v", c)
	}
}
