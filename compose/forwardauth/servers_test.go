package forwardauth_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/gateway"
	"github.com/tollgate/tollgate/internal/logtest"
	"github.com/tollgate/tollgate/internal/spawn"
	"github.com/tollgate/tollgate/internal/testnet"
	"github.com/tollgate/tollgate/internal/testwait"
)

// The servers of a forward-auth test: processes (nginx, Caddy) started
// from the shipped configurations, a gateway in process, an upstream.

// installCommand installs the proxies these tests run (make deps does).
const installCommand = "apt-get update && apt-get install -y nginx caddy"

// token is the api_token of the test gateways, written into the proxies'
// configurations in place of the shipped "change-me".
const token = "forward-auth-test-token"

// Timeouts of a server's start and stop.
const (
	startTimeout = 15 * time.Second
	stopGrace    = 5 * time.Second
)

// proc is a server process, started through spawn (it dies with the
// test binary); stop waits for it.
type proc struct {
	*spawn.Process
	name    string
	logPath string
}

// lookBinary returns the path of a proxy binary, failing the test with the
// install command when it is missing: a skipped test would pass CI while
// testing nothing.
func lookBinary(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		// Debian puts nginx in /usr/sbin, which a user's PATH may lack.
		p, err = exec.LookPath(filepath.Join("/usr/sbin", name))
	}
	if err != nil {
		t.Fatalf("%s is required by this test and is not installed (%v); install it with:\n"+
			"    %s            (as root)\n    sudo sh -c '%s'   (otherwise)\nor run `make deps`.",
			name, err, installCommand, installCommand)
	}
	return p
}

// start starts bin with args, its output in logPath, env added to the
// test's environment.
func start(t *testing.T, name, logPath string, env []string, bin string, args ...string) *proc {
	t.Helper()
	out, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close() // the child has its own descriptor
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = append(os.Environ(), env...)
	sp, err := spawn.Start(cmd)
	if err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{Process: sp, name: name, logPath: logPath}
	return p
}

// log returns the process's output so far.
func (p *proc) log() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

// stop sends SIGTERM, then SIGKILL after stopGrace, and waits for the
// process to exit.
func (p *proc) stop(t *testing.T) {
	if p.Exited() {
		return
	}
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.Done():
	case <-time.After(stopGrace):
		t.Errorf("%s ignored SIGTERM for %v: killed", p.name, stopGrace)
		_ = p.Cmd.Process.Kill()
		<-p.Done()
	}
}

// errPortTaken marks a start that lost its port to another process.
var errPortTaken = errors.New("port taken")

// waitListening waits until addr accepts connections while p runs.
func (p *proc) waitListening(addr string) error {
	deadline := time.Now().Add(startTimeout)
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		if p.Exited() {
			out := p.log()
			if strings.Contains(out, "in use") {
				return errPortTaken
			}
			return fmt.Errorf("%s exited (%v) before listening on %s; its output:\n%s", p.name, p.Err(), addr, out)
		}
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			_ = c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not listening on %s after %v; its output:\n%s", p.name, addr, startTimeout, p.log())
		}
		<-time.After(wait)
	}
}

// shipped reads a shipped configuration file and replaces each key of
// repl with its value. Every key must occur in the file: a test that
// replaced nothing would test another file than the one shipped.
func shipped(t *testing.T, path string, repl ...string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", path))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for i := 0; i+1 < len(repl); i += 2 {
		if !strings.Contains(s, repl[i]) {
			t.Fatalf("%s no longer holds %q, which the test replaces: update the test with the file", path, repl[i])
		}
		s = strings.ReplaceAll(s, repl[i], repl[i+1])
	}
	return s
}

// startProxy starts a proxy on a free loopback port, retrying on another
// port when one is taken meanwhile, and stops it at cleanup. run starts
// the process for a listen address.
func startProxy(t *testing.T, name string, run func(addr string) *proc) string {
	t.Helper()
	for attempt := 0; ; attempt++ {
		addr := testnet.FreeAddr(t)
		p := run(addr)
		err := p.waitListening(addr)
		if errors.Is(err, errPortTaken) && attempt < 3 {
			p.stop(t)
			continue
		}
		t.Cleanup(func() {
			p.stop(t)
			if t.Failed() {
				t.Logf("%s output:\n%s", name, p.log())
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		return addr
	}
}

// startNginx runs configs/nginx/tollgate.conf in front of upstream, asking
// the check API at tollgate, in one nginx process (master_process off)
// under a temporary prefix: its pid, logs and temporary files stay there.
func startNginx(t *testing.T, tollgate, upstream string) string {
	t.Helper()
	bin := lookBinary(t, "nginx")
	return startProxy(t, "nginx", func(addr string) *proc {
		dir := t.TempDir()
		site := shipped(t, "configs/nginx/tollgate.conf",
			"server 127.0.0.1:8082;", "server "+tollgate+";",
			"server 127.0.0.1:9000;", "server "+upstream+";",
			"listen 8000;", "listen "+addr+";",
			`"change-me"`, `"`+token+`"`)
		main := fmt.Sprintf(`daemon off;
master_process off;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log info;
events { worker_connections 128; }
http {
    access_log off;
    client_body_temp_path %[1]s/client_body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
    include %[1]s/tollgate.conf;
}
`, dir)
		write(t, filepath.Join(dir, "tollgate.conf"), site)
		write(t, filepath.Join(dir, "nginx.conf"), main)
		// -e: the error log before the configuration is read, so nginx
		// never touches /var/log/nginx.
		p := start(t, "nginx", filepath.Join(dir, "error.log"), nil, bin,
			"-p", dir+"/", "-c", filepath.Join(dir, "nginx.conf"), "-e", filepath.Join(dir, "error.log"))
		return p
	})
}

// startCaddy runs configs/caddy/Caddyfile in front of upstream, asking the
// check API at tollgate, with its admin endpoint off and its state in a
// temporary directory.
func startCaddy(t *testing.T, tollgate, upstream string) string {
	t.Helper()
	bin := lookBinary(t, "caddy")
	return startProxy(t, "caddy", func(addr string) *proc {
		dir := t.TempDir()
		site := shipped(t, "configs/caddy/Caddyfile",
			"reverse_proxy 127.0.0.1:8082", "reverse_proxy "+tollgate,
			"127.0.0.1:9000", upstream,
			"\n:8000 {", "\nhttp://"+addr+" {\n\tbind 127.0.0.1",
			`"change-me"`, `"`+token+`"`)
		// The global options must come first; admin off lets tests run
		// side by side (its default is one port, 2019).
		write(t, filepath.Join(dir, "Caddyfile"), "{\n\tadmin off\n}\n\n"+site)
		env := []string{"HOME=" + dir, "XDG_DATA_HOME=" + dir, "XDG_CONFIG_HOME=" + dir}
		return start(t, "caddy", filepath.Join(dir, "caddy.log"), env, bin,
			"run", "--config", filepath.Join(dir, "Caddyfile"), "--adapter", "caddyfile")
	})
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// runningGateway is a gateway serving its check API until the test ends,
// or until kill.
type runningGateway struct {
	srv  *gateway.Server
	api  string
	errc chan error
}

// startGateway starts a gateway with only its check API, the given rules
// and Redis, api_token set, and 127.0.0.1 trusted when trusted is true.
func startGateway(t *testing.T, redisAddr, rulesPath string, trusted bool) *runningGateway {
	t.Helper()
	cfg := gateway.Config{
		APIListen:     "127.0.0.1:0",
		APIToken:      token,
		MetricsListen: gateway.Off,
		GRPCListen:    gateway.Off,
		RulesFile:     rulesPath,
		KeySecret:     "forward-auth-test-secret-0123",
		GatewayID:     "forwardauth",
	}
	cfg.Redis.Addrs = []string{redisAddr}
	// Far above the production 50 ms: the race detector on two cores
	// slows everything, and a decision that failed open would make exact
	// assertions flaky.
	cfg.Redis.Timeout = 2 * time.Second
	cfg.Identity.KeySources = []string{"header:X-API-Key", "bearer", "query:api_key"}
	if trusted {
		cfg.Identity.TrustedProxies = []string{"127.0.0.1/32"}
	}
	srv, err := gateway.New(cfg, logtest.Warnings(t))
	if err != nil {
		t.Fatal(err)
	}
	g := &runningGateway{srv: srv, api: srv.Addrs().API, errc: make(chan error, 1)}
	go func() { g.errc <- srv.Run(context.Background()) }()
	t.Cleanup(func() {
		g.kill()
		if err := <-g.errc; err != nil {
			t.Errorf("gateway Run: %v", err)
		}
	})
	return g
}

// kill stops the gateway: its check API refuses connections from then on.
func (g *runningGateway) kill() { _ = g.srv.Close() }

// hangingServer accepts connections and never answers: a Tollgate that
// hangs. Its accept loop and connections end at cleanup.
func hangingServer(t *testing.T) string {
	t.Helper()
	ln := testnet.Listen(t)
	testnet.Serve(t, ln, nil)
	return ln.Addr().String()
}

// world is one proxy kind in front of a trusted and an untrusted gateway,
// sharing a Redis and an upstream.
type world struct {
	upstream                 *httptest.Server
	trusted                  *runningGateway // 127.0.0.1 (the proxy) in trusted_proxies
	untrusted                *runningGateway
	viaTrusted, viaUntrusted string // proxy base URLs
}

// startProxyFunc starts one proxy kind (startNginx, startCaddy).
type startProxyFunc func(t *testing.T, tollgate, upstream string) string

func newWorld(t *testing.T, rules string, startProxy startProxyFunc) *world {
	t.Helper()
	redis := redistest.StartTB(t)
	rulesPath := filepath.Join(t.TempDir(), "rules.yaml")
	write(t, rulesPath, rules)
	w := &world{upstream: httptest.NewServer(http.HandlerFunc(upstream))}
	t.Cleanup(w.upstream.Close)
	up := strings.TrimPrefix(w.upstream.URL, "http://")
	w.trusted = startGateway(t, redis.Addr(), rulesPath, true)
	w.untrusted = startGateway(t, redis.Addr(), rulesPath, false)
	w.viaTrusted = "http://" + startProxy(t, w.trusted.api, up)
	w.viaUntrusted = "http://" + startProxy(t, w.untrusted.api, up)
	return w
}

// upstream is the API behind the proxies: it names the request it got
// and sets rate-limit headers of its own, which Tollgate's must replace.
// It echoes the rate-limit headers of its request as Upstream-Got-<name>:
// Traefik hands Tollgate's headers to the API, not to the client.
func upstream(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	for _, h := range rateLimitHeaders {
		for _, v := range r.Header.Values(h) {
			w.Header().Add(upstreamGot+h, v)
		}
	}
	w.Header().Set("X-RateLimit-Limit", "999")
	w.Header().Set("RateLimit", `"upstream";r=999`)
	w.Header().Set("Content-Type", "text/plain")
	fmt.Fprintf(w, "upstream %s %s body=%q", r.Method, r.URL.RequestURI(), body)
}

// upstreamGot prefixes the rate-limit headers the upstream echoes.
const upstreamGot = "Upstream-Got-"

// client sends requests from a given loopback address (127.0.0.2, ...),
// so that a proxy sees distinct clients.
func client(t *testing.T, from string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	tr := &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// response is an answer with its body read.
type response struct {
	*http.Response
	body string
}

// send sends method url with the header pairs hdr (name, value, ...) and
// body through c.
func send(t *testing.T, c *http.Client, method, url, body string, hdr ...string) response {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{resp, string(b)}
}

// waitUntil waits, polling, until the clock has passed at.
func waitUntil(t *testing.T, at time.Time) {
	t.Helper()
	testwait.Eventually(t, time.Until(at)+5*time.Second, func() error {
		if d := time.Until(at); d > 0 {
			return fmt.Errorf("%v to go", d)
		}
		return nil
	})
}
