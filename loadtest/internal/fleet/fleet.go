// Package fleet starts the processes the scenarios and the side-by-side
// comparison measure: redis-servers, Tollgate gateways (bin/gateway) and
// envoyproxy/ratelimit, each on free loopback ports, each a process of its
// own so that its CPU time can be read from /proc, and stops them.
package fleet

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tollgate/tollgate/compose/redisserver"
)

// Process is one service under test.
type Process struct {
	Name string
	// GRPC is its Envoy RLS address; API its check API (gateways, when
	// enabled); Metrics its /metrics (gateways, when enabled).
	GRPC, API, Metrics string

	cmd  *exec.Cmd
	done chan error
	log  string
}

// Pid is the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Stop ends the process (SIGTERM, then SIGKILL after 10 s) and waits for
// it. It is safe on a nil or never-started Process.
func (p *Process) Stop() {
	if p == nil || p.cmd == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		p.done <- err
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		p.done <- <-p.done
	}
}

// FreeAddr returns a free loopback host:port.
func FreeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func port(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

// StartRedis starts a redis-server on a free port.
func StartRedis(ctx context.Context, log *slog.Logger) (*redisserver.Server, error) {
	return redisserver.Start(ctx, redisserver.WithLogger(log))
}

// Gateway describes one gateway to start.
type Gateway struct {
	// Bin is the gateway binary (bin/gateway); Dir a directory for its
	// rules, data and log.
	Bin, Dir, Name string
	// Rules is the rules file's content.
	Rules string
	// Redis is the Redis address.
	Redis string
	// API and Metrics start the check API and the metrics listener.
	API, Metrics bool
	// Env is extra KEY=VALUE settings (later ones win).
	Env []string
}

// StartGateway starts a gateway with its Envoy RLS listener (and the
// listeners g asks for) and waits until RLS answers.
func StartGateway(ctx context.Context, g Gateway) (*Process, error) {
	p := &Process{Name: g.Name}
	dir := filepath.Join(g.Dir, g.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	rules := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rules, []byte(g.Rules), 0o644); err != nil {
		return nil, err
	}
	var err error
	if p.GRPC, err = FreeAddr(); err != nil {
		return nil, err
	}
	env := []string{
		"TOLLGATE_KEY_SECRET=fleet-test-secret-0123456789",
		"TOLLGATE_RULES_FILE=" + rules,
		"TOLLGATE_REDIS_ADDRS=" + g.Redis,
		"TOLLGATE_GRPC_LISTEN=" + p.GRPC,
		"TOLLGATE_API_LISTEN=off", "TOLLGATE_METRICS_LISTEN=off",
		"TOLLGATE_LOG_LEVEL=warn", "TOLLGATE_GATEWAY_ID=" + g.Name,
		"TOLLGATE_DATA_DIR=" + filepath.Join(dir, "data"),
	}
	if g.API {
		if p.API, err = FreeAddr(); err != nil {
			return nil, err
		}
		env = append(env, "TOLLGATE_API_LISTEN="+p.API)
	}
	if g.Metrics {
		if p.Metrics, err = FreeAddr(); err != nil {
			return nil, err
		}
		env = append(env, "TOLLGATE_METRICS_LISTEN="+p.Metrics)
	}
	env = append(env, g.Env...)
	return p, p.start(ctx, g.Bin, env, filepath.Join(dir, "gateway.log"))
}

// Ratelimit describes an envoyproxy/ratelimit to start.
type Ratelimit struct {
	Bin, Dir string
	Redis    string
	// Configs maps a domain to its YAML configuration.
	Configs map[string]string
}

// StartRatelimit starts envoyproxy/ratelimit with its defaults (statsd
// off, no local cache) and waits until it answers.
func StartRatelimit(ctx context.Context, r Ratelimit) (*Process, error) {
	p := &Process{Name: "envoyproxy/ratelimit"}
	cfgDir := filepath.Join(r.Dir, "runtime", "ratelimit", "config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		return nil, err
	}
	for domain, conf := range r.Configs {
		if err := os.WriteFile(filepath.Join(cfgDir, domain+".yaml"), []byte(conf), 0o644); err != nil {
			return nil, err
		}
	}
	var addrs [3]string
	for i := range addrs {
		var err error
		if addrs[i], err = FreeAddr(); err != nil {
			return nil, err
		}
	}
	p.GRPC = addrs[0]
	env := []string{
		"GRPC_HOST=127.0.0.1", "GRPC_PORT=" + port(addrs[0]),
		"HOST=127.0.0.1", "PORT=" + port(addrs[1]),
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + port(addrs[2]),
		"USE_STATSD=false", "LOG_LEVEL=warn",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + r.Redis,
		"RUNTIME_ROOT=" + filepath.Join(r.Dir, "runtime"), "RUNTIME_SUBDIRECTORY=ratelimit",
		"RUNTIME_APPDIRECTORY=config", "RUNTIME_WATCH_ROOT=false",
	}
	return p, p.start(ctx, r.Bin, env, filepath.Join(r.Dir, "ratelimit.log"))
}

// start runs bin with env (added to this process's environment), its
// output in logPath, and waits until its RLS answers. The goroutine it
// starts waits for the process; Stop waits for it.
func (p *Process) start(ctx context.Context, bin string, env []string, logPath string) error {
	lf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = lf, lf
	if err := cmd.Start(); err != nil {
		lf.Close()
		return fmt.Errorf("fleet: start %s: %w", bin, err)
	}
	p.cmd, p.done, p.log = cmd, make(chan error, 1), logPath
	go func() {
		err := cmd.Wait()
		lf.Close()
		p.done <- err
	}()
	return p.waitRLS(ctx)
}

// waitRLS calls the process until it answers a ShouldRateLimit.
func (p *Process) waitRLS(ctx context.Context) error {
	cc, err := grpc.NewClient(p.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	c := rlsv3.NewRateLimitServiceClient(cc)
	deadline := time.Now().Add(30 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := c.ShouldRateLimit(cctx, &rlsv3.RateLimitRequest{Domain: "probe", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "api_key", Value: "probe"}, {Key: "path", Value: "/"}}},
		}})
		cancel()
		if err == nil {
			return nil
		}
		select {
		case werr := <-p.done:
			p.done <- werr
			return fmt.Errorf("fleet: %s exited (%v): %s", p.Name, werr, p.logTail())
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("fleet: %s does not answer at %s: %v: %s", p.Name, p.GRPC, err, p.logTail())
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (p *Process) logTail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// Counters reads the counters of a gateway's /metrics whose name starts
// with prefix, summed by the value of their label named label ("" for
// series without it, or when label is "").
func Counters(ctx context.Context, metrics, prefix, label string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+metrics+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		name, rest, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.Fields(rest)[0], 64)
		if err != nil {
			continue
		}
		value := ""
		if i := strings.Index(name, label+`="`); label != "" && i >= 0 {
			value = name[i+len(label)+2:]
			value = value[:strings.IndexByte(value, '"')]
		}
		out[value] += v
	}
	return out, sc.Err()
}
