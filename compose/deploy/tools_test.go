package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tollgate/tollgate/internal/spawn"
	"github.com/tollgate/tollgate/internal/testnet"
	"github.com/tollgate/tollgate/internal/testwait"
)

// installHint is how to get promtool and prometheus.
const installHint = "install Debian's prometheus package (it brings promtool): " +
	"apt-get update && apt-get install -y prometheus, or run make deps"

// requireTool returns the path of a binary on PATH, or fails the test with
// the command that installs it: a skipped test would pass CI while testing
// nothing.
func requireTool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not found on PATH: %s", name, installHint)
	}
	return p
}

// runTool runs bin with args and stdin, and fails the test with its output
// when it exits non-zero. It returns the combined output.
func runTool(t testing.TB, bin string, stdin []byte, args ...string) string {
	t.Helper()
	out, err := tool(t, bin, stdin, args...)
	if err != nil {
		t.Errorf("%s %s: %v\n%s", filepath.Base(bin), strings.Join(args, " "), err, out)
	}
	return out
}

// tool runs bin with args and stdin (bounded by the test's context and
// 30 s) and returns its combined output and exit error.
func tool(t testing.TB, bin string, stdin []byte, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// prometheusConfig returns prometheus.yml as the tests run it: rule files
// at their local paths (through the prometheus service's mounts); with
// targets, each job's static targets replaced by targets[job] (a job
// without an entry scrapes nothing) and Alertmanager dropped; with
// interval, that scrape and evaluation interval.
func prometheusConfig(t testing.TB, targets map[string][]string, interval string) []byte {
	t.Helper()
	return prometheusConfigOf(t, loadCompose(t, testEnv(t)), prometheusFile, targets, interval)
}

// prometheusConfigOf is prometheusConfig for deployment c's prometheus
// service and its configuration file (local path).
func prometheusConfigOf(t testing.TB, c *compose, file string, targets map[string][]string, interval string) []byte {
	t.Helper()
	prom := c.Services["prometheus"]
	var cfg map[string]any
	readYAML(t, file, &cfg)
	if files, ok := cfg["rule_files"].([]any); ok {
		for i, f := range files {
			local := prom.mountSource(fmt.Sprint(f))
			abs, err := filepath.Abs(local)
			if local == "" || err != nil {
				t.Fatalf("%s: rule file %v is not mounted into the prometheus service", file, f)
			}
			files[i] = abs
		}
	}
	if interval != "" {
		global, _ := cfg["global"].(map[string]any)
		if global == nil {
			global = map[string]any{}
			cfg["global"] = global
		}
		global["scrape_interval"], global["evaluation_interval"] = interval, interval
	}
	if targets != nil {
		delete(cfg, "alerting")
		scs, _ := cfg["scrape_configs"].([]any)
		for _, sc := range scs {
			m := sc.(map[string]any)
			job := fmt.Sprint(m["job_name"])
			m["static_configs"] = []any{map[string]any{"targets": targets[job]}}
		}
	}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// promServer is a prometheus process started for a test.
type promServer struct {
	url  string
	out  *testnet.Buffer
	proc *spawn.Process // dies with the test binary
}

// startPrometheus runs bin with config on a free loopback port, storage in
// a temporary directory, until the test ends, and waits until it is ready.
func startPrometheus(t testing.TB, bin string, config []byte) *promServer {
	t.Helper()
	cfgPath := writeTemp(t, "prometheus.yml", config)
	for attempt := 1; ; attempt++ {
		p, err := tryPrometheus(t, bin, cfgPath)
		if err == nil {
			return p
		}
		// Another process may have taken the port between our probe and
		// prometheus's bind; try another.
		if attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			t.Fatalf("prometheus did not start: %v", err)
		}
	}
}

func tryPrometheus(t testing.TB, bin, cfgPath string) (*promServer, error) {
	t.Helper()
	addr := testnet.FreeAddr(t)
	p := &promServer{url: "http://" + addr, out: &testnet.Buffer{}}
	cmd := exec.Command(bin,
		"--config.file="+cfgPath,
		"--storage.tsdb.path="+t.TempDir(),
		"--web.listen-address="+addr,
		"--log.level=warn",
	)
	cmd.Stdout, cmd.Stderr = p.out, p.out
	var err error
	if p.proc, err = spawn.Start(cmd); err != nil {
		return nil, err
	}
	t.Cleanup(func() { p.stop(t, cmd) })
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case <-p.proc.Done():
			return nil, fmt.Errorf("prometheus exited: %v\n%s", p.proc.Err(), p.out)
		default:
		}
		if resp, err := http.Get(p.url + "/-/ready"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p, nil
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("prometheus not ready within 20s:\n%s", p.out)
		}
		select {
		case <-p.proc.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// stop sends SIGTERM, waits up to 10 s, then kills.
func (p *promServer) stop(t testing.TB, cmd *exec.Cmd) {
	select {
	case <-p.proc.Done():
		return
	default:
	}
	_ = cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.proc.Done():
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-p.proc.Done()
		t.Errorf("prometheus did not stop within 10s of SIGINT; killed")
	}
}

// apiResponse is the envelope of Prometheus's HTTP API.
type apiResponse struct {
	Status    string          `json:"status"`
	Data      json.RawMessage `json:"data"`
	ErrorType string          `json:"errorType"`
	Error     string          `json:"error"`
}

// get calls the HTTP API and decodes data into v.
func (p *promServer) get(path string, q url.Values, v any) error {
	u := p.url + path
	if q != nil {
		u += "?" + q.Encode()
	}
	resp, err := http.Get(u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var r apiResponse
	if err := json.Unmarshal(body, &r); err != nil {
		return fmt.Errorf("%s: %d %s", path, resp.StatusCode, body)
	}
	if r.Status != "success" {
		return fmt.Errorf("%s: %s: %s", path, r.ErrorType, r.Error)
	}
	return json.Unmarshal(r.Data, v)
}

// sample is one element of an instant vector.
type sample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// query evaluates expr now and returns the instant vector it yields (a
// scalar comes back as one sample without labels).
func (p *promServer) query(expr string) ([]sample, error) {
	var data struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	if err := p.get("/api/v1/query", url.Values{"query": {expr}}, &data); err != nil {
		return nil, err
	}
	switch data.ResultType {
	case "vector":
		var v []sample
		return v, json.Unmarshal(data.Result, &v)
	case "scalar":
		var s [2]any
		if err := json.Unmarshal(data.Result, &s); err != nil {
			return nil, err
		}
		return []sample{{Value: s}}, nil
	}
	return nil, fmt.Errorf("result type %s", data.ResultType)
}

// target is one of /api/v1/targets' active targets.
type target struct {
	ScrapePool string    `json:"scrapePool"`
	ScrapeURL  string    `json:"scrapeUrl"`
	Health     string    `json:"health"`
	LastError  string    `json:"lastError"`
	LastScrape time.Time `json:"lastScrape"`
}

// waitScraped waits until every target has been scraped successfully after
// since.
func (p *promServer) waitScraped(t testing.TB, since time.Time) {
	t.Helper()
	testwait.Eventually(t, 20*time.Second, func() error {
		var data struct {
			ActiveTargets []target `json:"activeTargets"`
		}
		if err := p.get("/api/v1/targets", nil, &data); err != nil {
			return err
		}
		if len(data.ActiveTargets) == 0 {
			return errors.New("no targets")
		}
		for _, tg := range data.ActiveTargets {
			if tg.Health != "up" || !tg.LastScrape.After(since) {
				return fmt.Errorf("target %s (%s): health %s, last scrape %v, error %q", tg.ScrapeURL, tg.ScrapePool, tg.Health, tg.LastScrape, tg.LastError)
			}
		}
		return nil
	})
}
