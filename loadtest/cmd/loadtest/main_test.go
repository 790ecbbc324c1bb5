package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/loadtest"
	"github.com/tollgate/tollgate/loadtest/internal/testtarget"
)

// runCmd runs the command with args and returns its status and outputs.
func runCmd(t *testing.T, ctx context.Context, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(ctx, args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"no bound", []string{"-target", "check"}, "needs a bound"},
		{"too long", []string{"-duration", "11m"}, "exceeds the 10m0s cap"},
		{"rate and workers", []string{"-requests", "1", "-rate", "10", "-workers", "5"}, "exclude each other"},
		{"bad target", []string{"-requests", "1", "-target", "udp"}, `target "udp"`},
		{"url for grpc", []string{"-requests", "1", "-target", "grpc", "-url", "http://x"}, "takes an address"},
		{"bad dist", []string{"-requests", "1", "-dist", "pareto", "-zipf-s", "1"}, `"pareto"`},
		{"relative path", []string{"-requests", "1", "-paths", "/a,b"}, `path "b"`},
		{"unknown flag", []string{"-requests", "1", "-frobnicate"}, "flag provided but not defined"},
		{"stray argument", []string{"-requests", "1", "now"}, "unexpected arguments"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			code, stdout, stderr := runCmd(t, t.Context(), tt.args...)
			if code != exitUsage || stdout != "" || !strings.Contains(stderr, tt.want) {
				t.Errorf("exit %d, stdout %q, stderr %q; want %d and %q", code, stdout, stderr, exitUsage, tt.want)
			}
		})
	}
}

// TestJSONSummary runs closed loop against a server that refuses one key,
// and checks the JSON summary's schema and counts.
func TestJSONSummary(t *testing.T) {
	t.Parallel()
	srv := testtarget.StartHTTP(t, func(w http.ResponseWriter, r *http.Request, key string, _ int64) {
		if key == "sk_load_0" {
			w.WriteHeader(http.StatusTooManyRequests)
		}
	})
	code, stdout, stderr := runCmd(t, t.Context(), "-target", "check", "-url", srv.URL, "-requests", "500",
		"-workers", "8", "-keys", "100", "-dist", "zipf", "-paths", "/a,/b", "-json", "-quiet",
		"-pid", strconv.Itoa(os.Getpid()))
	if code != exitOK {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
	var sum map[string]any
	if err := json.Unmarshal([]byte(stdout), &sum); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, stdout)
	}
	for _, k := range []string{"target", "endpoint", "mode", "workers", "keys", "dist", "stopped_by", "elapsed_seconds",
		"sent", "answered", "decisions", "errors", "throughput_rps", "statuses", "latency_us", "gateway",
		"loadtest_cpu_us_per_request"} {
		if _, ok := sum[k]; !ok {
			t.Errorf("summary lacks %q", k)
		}
	}
	num := func(v any) int64 { f, _ := v.(float64); return int64(f) }
	statuses, _ := sum["statuses"].(map[string]any)
	byKey := srv.ByKey()
	if num(sum["answered"]) != 500 || num(statuses["429"]) != byKey["sk_load_0"] || num(statuses["2xx"]) != 500-byKey["sk_load_0"] {
		t.Errorf("answered %v, statuses %v; server saw sk_load_0 %d times", sum["answered"], statuses, byKey["sk_load_0"])
	}
	if sum["endpoint"] != srv.URL+"/v1/check" || sum["stopped_by"] != "requests" || sum["mode"] != "closed" {
		t.Errorf("endpoint %v, stopped by %v, mode %v", sum["endpoint"], sum["stopped_by"], sum["mode"])
	}
	lat, _ := sum["latency_us"].(map[string]any)
	if num(lat["count"]) != 500 || num(lat["p50"]) <= 0 || num(lat["p99_9"]) < num(lat["p99"]) || num(lat["max"]) < num(lat["p99_9"]) {
		t.Errorf("latency %v", lat)
	}
	if gw, _ := sum["gateway"].(map[string]any); num(gw["pid"]) != int64(os.Getpid()) {
		t.Errorf("gateway %v", gw)
	}
	// The text summary went to stderr.
	if !strings.Contains(stderr, "p99.9") || !strings.Contains(stderr, "429=") {
		t.Errorf("stderr lacks the text summary:\n%s", stderr)
	}
}

// TestInterrupted cancels the command's context mid-run, as Ctrl-C does:
// it still prints the summary, and exits 130.
func TestInterrupted(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	srv := testtarget.StartHTTP(t, func(w http.ResponseWriter, r *http.Request, _ string, n int64) {
		if n == 100 {
			cancel()
		}
	})
	code, stdout, stderr := runCmd(t, ctx, "-url", srv.URL, "-duration", "5m", "-workers", "4")
	if code != exitInterrupted {
		t.Fatalf("exit %d, want %d; stderr:\n%s", code, exitInterrupted, stderr)
	}
	if !strings.Contains(stdout, "stopped by interrupted") || !strings.Contains(stdout, "latency") {
		t.Errorf("no summary after the interruption:\n%s", stdout)
	}
}

// TestGatewayCostsWithRedis stands a server in for the gateway that runs
// one EVALSHA on a real redis-server per request; loadtest reports the
// server's CPU (this process) and exactly one command and one EVALSHA per
// decision.
func TestGatewayCostsWithRedis(t *testing.T) {
	t.Parallel()
	rs := redistest.StartTB(t)
	rdb := redis.NewClient(rs.ClientOptions())
	defer rdb.Close()
	ctx := t.Context()
	sha, err := rdb.ScriptLoad(ctx, "return 1").Result() // runs no command inside
	if err != nil {
		t.Fatal(err)
	}
	srv := testtarget.StartHTTP(t, func(w http.ResponseWriter, r *http.Request, _ string, _ int64) {
		if err := rdb.EvalSha(r.Context(), sha, nil).Err(); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
	// One worker: the handler's client keeps one connection, opened above.
	code, stdout, stderr := runCmd(t, ctx, "-target", "proxy", "-url", srv.URL, "-requests", "300", "-workers", "1",
		"-pid", strconv.Itoa(os.Getpid()), "-redis", rs.Addr(), "-json", "-quiet")
	if code != exitOK {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
	var sum loadtest.Summary
	if err := json.Unmarshal([]byte(stdout), &sum); err != nil {
		t.Fatal(err)
	}
	if sum.Decisions != 300 || sum.Redis == nil || sum.Gateway == nil {
		t.Fatalf("decisions %d, redis %+v, gateway %+v", sum.Decisions, sum.Redis, sum.Gateway)
	}
	if r := sum.Redis; r.Commands != 300 || r.EvalSHA != 300 || r.CommandsPerDecision != 1 || r.EvalSHAPerDecision != 1 ||
		!slices.Equal(r.Addrs, []string{rs.Addr()}) {
		t.Errorf("redis usage %+v, want 300 EVALSHA and nothing else", r)
	}
	if g := sum.Gateway; g.PID != os.Getpid() || g.CPUSeconds < 0 || math.Abs(g.MicrosPerDecision-g.CPUSeconds*1e6/300) > 1e-6 {
		t.Errorf("gateway %+v", g)
	}
}

// TestGRPC runs the grpc target against an in-process rate-limit service.
func TestGRPC(t *testing.T) {
	t.Parallel()
	srv := testtarget.StartRLS(t, func(context.Context, *rlsv3.RateLimitRequest, int64) (*rlsv3.RateLimitResponse, error) {
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
	})
	code, stdout, stderr := runCmd(t, t.Context(), "-target", "grpc", "-addr", srv.Addr, "-domain", "edge",
		"-rate", "500", "-requests", "200", "-json", "-quiet", "-grpc-conns", "2")
	if code != exitOK {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
	var sum loadtest.Summary
	if err := json.Unmarshal([]byte(stdout), &sum); err != nil {
		t.Fatal(err)
	}
	if sum.Statuses["OK"] != 200 || sum.Decisions != 200 || srv.Calls() != 200 || sum.Mode != "open" || sum.LatencyFrom != "scheduled" {
		t.Errorf("statuses %v, decisions %d, calls %d, mode %s, latency from %s", sum.Statuses, sum.Decisions, srv.Calls(), sum.Mode, sum.LatencyFrom)
	}
}

// TestTokenFromEnvironment takes the check API token from
// $TOLLGATE_API_TOKEN unless -token is given. (t.Setenv: not parallel.)
func TestTokenFromEnvironment(t *testing.T) {
	t.Setenv("TOLLGATE_API_TOKEN", "from-env")
	auth := make(chan string, 2)
	srv := testtarget.StartHTTP(t, func(w http.ResponseWriter, r *http.Request, _ string, _ int64) {
		auth <- r.Header.Get("Authorization")
	})
	for _, tt := range []struct {
		args []string
		want string
	}{
		{nil, "Bearer from-env"},
		{[]string{"-token", "from-flag"}, "Bearer from-flag"},
	} {
		args := append([]string{"-target", "check", "-url", srv.URL, "-requests", "1", "-workers", "1", "-quiet"}, tt.args...)
		if code, _, stderr := runCmd(t, t.Context(), args...); code != exitOK {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		if got := <-auth; got != tt.want {
			t.Errorf("args %q: Authorization %q, want %q", tt.args, got, tt.want)
		}
	}
}

// TestReportFile writes the HTML report with -report, and refuses a path
// it cannot create before sending anything.
func TestReportFile(t *testing.T) {
	t.Parallel()
	srv := testtarget.StartHTTP(t, nil)
	file := filepath.Join(t.TempDir(), "run.html")
	code, stdout, stderr := runCmd(t, t.Context(), "-url", srv.URL, "-requests", "200", "-workers", "2", "-quiet", "-report", file)
	if code != exitOK {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
	page, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(page), "<table") || !strings.Contains(stdout, "2xx=200") || !strings.Contains(stderr, "report written to "+file) {
		t.Errorf("page of %d bytes, stdout %q, stderr %q", len(page), stdout, stderr)
	}

	code, _, stderr = runCmd(t, t.Context(), "-url", srv.URL, "-requests", "10", "-quiet", "-report", filepath.Join(t.TempDir(), "no", "such", "dir.html"))
	if code != exitFailed || !strings.Contains(stderr, "report") || srv.Requests() != 200 {
		t.Errorf("bad report path: exit %d, stderr %q, %d requests sent (want 200, none more)", code, stderr, srv.Requests())
	}
}
