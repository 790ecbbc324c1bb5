package gateway_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/gateway"
	"github.com/tollgate/tollgate/internal/logtest"
	"github.com/tollgate/tollgate/internal/promtext"
	"github.com/tollgate/tollgate/internal/testnet"
)

// testSecret is the key secret of test gateways.
const testSecret = "test-secret-0123456789abcdef"

// env is one test's world: a Redis, an upstream, a rules file and gateways.
type env struct {
	t         testing.TB
	redisAddr string
	rulesPath string
	upstream  *httptest.Server
	gw        *runningGateway // the first gateway
	client    *http.Client
}

// runningGateway is a Server running in the background.
type runningGateway struct {
	srv   *gateway.Server
	addrs gateway.Addrs
	run   *testnet.Running
}

type envOptions struct {
	rules    string
	upstream http.Handler          // nil: echo
	config   func(*gateway.Config) // applied before New
	// redisAddr, when set, is used instead of starting a redis-server
	// (say an address nothing listens on).
	redisAddr string
}

// newEnv starts Redis, an upstream and one gateway with opts.
func newEnv(t testing.TB, opts envOptions) *env {
	t.Helper()
	e := &env{t: t, client: &http.Client{Timeout: 10 * time.Second}}
	e.redisAddr = opts.redisAddr
	if e.redisAddr == "" {
		e.redisAddr = redistest.StartTB(t).Addr()
	}
	h := opts.upstream
	if h == nil {
		h = http.HandlerFunc(echo)
	}
	e.upstream = httptest.NewServer(h)
	t.Cleanup(e.upstream.Close)
	e.rulesPath = filepath.Join(t.TempDir(), "rules.yaml")
	e.writeRules(opts.rules)
	e.gw = e.startGateway(opts.config)
	t.Cleanup(e.client.CloseIdleConnections)
	return e
}

// config returns the configuration of a test gateway: every listener on a
// free loopback port, no gRPC.
func (e *env) config() gateway.Config {
	return gateway.Config{
		Listen:        "127.0.0.1:0",
		Upstream:      e.upstream.URL,
		APIListen:     "127.0.0.1:0",
		MetricsListen: "127.0.0.1:0",
		GRPCListen:    gateway.Off,
		RulesFile:     e.rulesPath,
		KeySecret:     testSecret,
		GatewayID:     "test-gw",
		Redis:         redisConfig(e.redisAddr),
	}
}

// startGateway starts a gateway sharing the env's Redis and rules file; it
// is stopped (and Run's error checked) at cleanup.
func (e *env) startGateway(mutate func(*gateway.Config)) *runningGateway {
	e.t.Helper()
	cfg := e.config()
	if mutate != nil {
		mutate(&cfg)
	}
	srv, err := gateway.New(cfg, logtest.Warnings(e.t))
	if err != nil {
		e.t.Fatal(err)
	}
	return run(e.t, srv)
}

// run runs srv until the test ends.
func run(t testing.TB, srv *gateway.Server) *runningGateway {
	t.Helper()
	return &runningGateway{srv: srv, addrs: srv.Addrs(), run: testnet.Start(t, "gateway", srv.Run)}
}

// writeRules replaces the rules file atomically (write and rename), as a
// deployment would: the watcher never sees a half-written file.
func (e *env) writeRules(rules string) {
	e.t.Helper()
	tmp := e.rulesPath + ".tmp"
	if err := os.WriteFile(tmp, []byte(rules), 0o600); err != nil {
		e.t.Fatal(err)
	}
	if err := os.Rename(tmp, e.rulesPath); err != nil {
		e.t.Fatal(err)
	}
}

// echo is the default upstream: 200 and a short body naming the path.
func echo(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain")
	_, _ = io.WriteString(w, "upstream "+r.URL.Path)
}

// decisionBody is the check API's decision JSON.
type decisionBody struct {
	Allowed    bool   `json:"allowed"`
	Status     int    `json:"status"`
	Limit      int64  `json:"limit"`
	Remaining  int64  `json:"remaining"`
	Reset      int64  `json:"reset"`
	RetryAfter int64  `json:"retry_after"`
	Rule       string `json:"rule"`
	Algorithm  string `json:"algorithm"`
	Degraded   bool   `json:"degraded"`
	Reason     string `json:"reason"`
	Error      *struct {
		Code    string          `json:"code"`
		Message string          `json:"message"`
		Details json.RawMessage `json:"details"`
	} `json:"error"`
}

// errorBody is an error-only body.
type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// post sends body (a string is sent as is, anything else as JSON) to the
// check API path of g and returns the response with its body read.
func (e *env) post(g *runningGateway, path string, body any, header http.Header) (*http.Response, []byte) {
	e.t.Helper()
	var raw []byte
	switch b := body.(type) {
	case string:
		raw = []byte(b)
	case []byte:
		raw = b
	default:
		var err error
		if raw, err = json.Marshal(b); err != nil {
			e.t.Fatal(err)
		}
	}
	req, err := http.NewRequest(http.MethodPost, "http://"+g.addrs.API+path, bytes.NewReader(raw))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header[k] = v
	}
	return e.do(req)
}

// check posts one check to the first gateway and decodes the decision.
func (e *env) check(body any) (*http.Response, decisionBody) {
	e.t.Helper()
	resp, raw := e.post(e.gw, "/v1/check", body, nil)
	var d decisionBody
	if err := json.Unmarshal(raw, &d); err != nil {
		e.t.Fatalf("decision body %q: %v", raw, err)
	}
	return resp, d
}

// proxyGet sends GET path through the first gateway's proxy with key in
// X-API-Key (none when empty).
func (e *env) proxyGet(path, key string) (*http.Response, []byte) {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+e.gw.addrs.Proxy+path, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	return e.do(req)
}

func (e *env) do(req *http.Request) (*http.Response, []byte) {
	e.t.Helper()
	resp, err := e.client.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp, b
}

// get fetches a URL and returns the status and body.
func (e *env) get(url string) (int, string) {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	resp, b := e.do(req)
	return resp.StatusCode, string(b)
}

// metric returns the sum of the samples of a metric whose labels include
// every one of labels (`k="v"` strings), from g's /metrics.
func (e *env) metric(g *runningGateway, name string, labels ...string) float64 {
	e.t.Helper()
	ss, err := promtext.Get(e.t.Context(), e.client, "http://"+g.addrs.Metrics+"/metrics")
	if err != nil {
		e.t.Fatal(err)
	}
	return ss.Sum(name, labels...)
}

// counter hands out distinct keys within a test binary.
var counter atomic.Int64

func uniqueKey(prefix string) string {
	return fmt.Sprintf("%s%d_%d", prefix, time.Now().UnixNano()%1e9, counter.Add(1))
}

// headerInt parses an integer header, failing the test when it is absent
// or malformed.
func headerInt(t *testing.T, h http.Header, name string) int64 {
	t.Helper()
	v := h.Get(name)
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("header %s = %q: %v", name, v, err)
	}
	return n
}

// sfItem is one member of an RFC 9651 List of Items whose values are
// Strings and whose parameters are Integers, the shape of the RateLimit and
// RateLimit-Policy fields.
type sfItem struct {
	Name   string
	Params map[string]int64
}

// parseSFList parses the RateLimit / RateLimit-Policy fields strictly
// (RFC 9651 §4.2: sf-string items, lowercase keys, integers of at most 15
// digits, ", " separators). It is the minimal subset of the parser in
// guard/httpguard's tests.
func parseSFList(s string) ([]sfItem, error) {
	var out []sfItem
	i := 0
	fail := func(msg string) ([]sfItem, error) { return nil, fmt.Errorf("sf %q at %d: %s", s, i, msg) }
	for i < len(s) {
		if s[i] != '"' {
			return fail("want sf-string")
		}
		i++
		var name strings.Builder
		for ; i < len(s) && s[i] != '"'; i++ {
			c := s[i]
			if c == '\\' {
				i++
				if i == len(s) || (s[i] != '"' && s[i] != '\\') {
					return fail("bad escape")
				}
				c = s[i]
			} else if c < 0x20 || c > 0x7e {
				return fail("bad string byte")
			}
			name.WriteByte(c)
		}
		if i == len(s) {
			return fail("unterminated string")
		}
		i++
		it := sfItem{Name: name.String(), Params: map[string]int64{}}
		for i < len(s) && s[i] == ';' {
			i++
			start := i
			for i < len(s) && (s[i] >= 'a' && s[i] <= 'z' || s[i] >= '0' && s[i] <= '9' || s[i] == '_' || s[i] == '-' || s[i] == '.' || s[i] == '*') {
				i++
			}
			if start == i || !(s[start] >= 'a' && s[start] <= 'z' || s[start] == '*') {
				return fail("bad key")
			}
			key := s[start:i]
			if i == len(s) || s[i] != '=' {
				return fail("want integer parameter")
			}
			i++
			start = i
			if i < len(s) && s[i] == '-' {
				i++
			}
			for i < len(s) && s[i] >= '0' && s[i] <= '9' {
				i++
			}
			digits := s[start:i]
			if digits == "" || digits == "-" || len(strings.TrimPrefix(digits, "-")) > 15 {
				return fail("bad integer")
			}
			n, _ := strconv.ParseInt(digits, 10, 64)
			it.Params[key] = n
		}
		out = append(out, it)
		if i == len(s) {
			break
		}
		if !strings.HasPrefix(s[i:], ", ") && s[i] != ',' {
			return fail("want ,")
		}
		i++
		for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
			i++
		}
		if i == len(s) {
			return fail("trailing comma")
		}
	}
	return out, nil
}

// sfList parses header name of h, failing the test on a malformed field.
func sfList(t *testing.T, h http.Header, name string) map[string]map[string]int64 {
	t.Helper()
	items, err := parseSFList(h.Get(name))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	m := map[string]map[string]int64{}
	for _, it := range items {
		m[it.Name] = it.Params
	}
	return m
}

func TestParseSFList(t *testing.T) {
	t.Parallel()
	got, err := parseSFList(`"a";q=3;w=60, "b\"c";r=0`)
	if err != nil || len(got) != 2 || got[0].Name != "a" || got[0].Params["w"] != 60 || got[1].Name != `b"c` || got[1].Params["r"] != 0 {
		t.Fatalf("got %+v, %v", got, err)
	}
	for _, bad := range []string{`a;q=1`, `"a";Q=1`, `"a";q=`, `"a",`, `"a`, `"a";q=1234567890123456`, `"a" "b"`} {
		if _, err := parseSFList(bad); err == nil {
			t.Errorf("parseSFList(%q) accepted", bad)
		}
	}
}

// redisConfig is the Redis configuration of test gateways: a deadline far
// above the production 50 ms, because the race detector on two cores
// slows everything, and a decision that failed open would make exact
// assertions flaky. Tests of failure behaviour set their own.
func redisConfig(addr string) configs.Redis {
	return configs.Redis{Addrs: []string{addr}, Timeout: 2 * time.Second}
}

// rejectionBody is the JSON error body of a 429: its code and the deciding
// rule's details.
type rejectionBody struct {
	Error struct {
		Code    string `json:"code"`
		Details struct {
			Rule              string `json:"rule"`
			RetryAfterSeconds int64  `json:"retry_after_seconds"`
		} `json:"details"`
	} `json:"error"`
}
