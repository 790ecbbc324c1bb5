package forwardauth_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tollgate/tollgate/internal/testnet"
	"github.com/tollgate/tollgate/internal/testwait"
)

// TestTraefik runs configs/traefik (traefik.yml and dynamic.yml) in a real
// Traefik, built from its source (traefikbuild_test.go), through the
// journey of nginx and Caddy.
func TestTraefik(t *testing.T) {
	t.Parallel()
	traefikBinary(t) // skips, outside CI, when it cannot be built
	testProxy(t, "traefik", startTraefik)
}

// startTraefik runs the shipped static and dynamic configuration in front
// of upstream, asking the check API at tollgate, with its internal
// tollgate-authz entry point on another free port.
func startTraefik(t *testing.T, tollgate, upstream string) string {
	t.Helper()
	bin := traefikBinary(t)
	var authz string
	addr := startProxy(t, "traefik", func(addr string) *proc {
		dir := t.TempDir()
		authz = testnet.FreeAddr(t)
		dynamic := shipped(t, "configs/traefik/dynamic.yml",
			"address: http://127.0.0.1:8001/v1/authz", "address: http://"+authz+"/v1/authz",
			"url: http://127.0.0.1:9000", "url: http://"+upstream,
			"url: http://127.0.0.1:8082", "url: http://"+tollgate,
			"X-Tollgate-Token: change-me", "X-Tollgate-Token: "+token)
		static := shipped(t, "configs/traefik/traefik.yml",
			`address: ":8000"`, fmt.Sprintf("address: %q", addr),
			`address: "127.0.0.1:8001"`, fmt.Sprintf("address: %q", authz),
			"filename: configs/traefik/dynamic.yml", "filename: "+filepath.Join(dir, "dynamic.yml"))
		// Never call home from a test.
		static += "\nglobal:\n  checkNewVersion: false\n  sendAnonymousUsage: false\n"
		write(t, filepath.Join(dir, "dynamic.yml"), dynamic)
		write(t, filepath.Join(dir, "traefik.yml"), static)
		p := start(t, "traefik", filepath.Join(dir, "traefik.log"), []string{"HOME=" + dir}, bin,
			"--configFile="+filepath.Join(dir, "traefik.yml"))
		p.Cmd.Dir = dir
		return p
	})
	// Listening is not routing: the file provider's routers come a moment
	// later. A request without a key matches no rule; it is routed once
	// the upstream answers it.
	c := &http.Client{Timeout: 5 * time.Second}
	testwait.Eventually(t, startTimeout, func() error {
		resp, err := c.Get("http://" + addr + "/traefik-ready")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if !strings.HasPrefix(string(body), "upstream") {
			return fmt.Errorf("not routed yet: %s %q", resp.Status, body)
		}
		return nil
	})
	return addr
}

// traefikDynamic is the part of Traefik's dynamic configuration that
// configs/traefik/dynamic.yml uses, with Traefik's own field names
// (pkg/config/dynamic), decoded strictly so that a misspelt field fails
// even where no Traefik binary can be built.
type traefikDynamic struct {
	HTTP struct {
		Routers map[string]struct {
			EntryPoints []string `yaml:"entryPoints"`
			Rule        string   `yaml:"rule"`
			Middlewares []string `yaml:"middlewares"`
			Service     string   `yaml:"service"`
		} `yaml:"routers"`
		Middlewares map[string]struct {
			ForwardAuth *struct {
				Address             string   `yaml:"address"`
				TrustForwardHeader  *bool    `yaml:"trustForwardHeader"`
				MaxResponseBodySize int64    `yaml:"maxResponseBodySize"`
				AuthResponseHeaders []string `yaml:"authResponseHeaders"`
			} `yaml:"forwardAuth"`
			Errors *struct {
				Status         []string       `yaml:"status"`
				StatusRewrites map[string]int `yaml:"statusRewrites"`
				Service        string         `yaml:"service"`
			} `yaml:"errors"`
			Headers *struct {
				CustomRequestHeaders map[string]string `yaml:"customRequestHeaders"`
			} `yaml:"headers"`
		} `yaml:"middlewares"`
		Services map[string]struct {
			LoadBalancer struct {
				Servers []struct {
					URL string `yaml:"url"`
				} `yaml:"servers"`
				ServersTransport string `yaml:"serversTransport"`
			} `yaml:"loadBalancer"`
		} `yaml:"services"`
		ServersTransports map[string]struct {
			ForwardingTimeouts struct {
				DialTimeout           string `yaml:"dialTimeout"`
				ResponseHeaderTimeout string `yaml:"responseHeaderTimeout"`
			} `yaml:"forwardingTimeouts"`
		} `yaml:"serversTransports"`
	} `yaml:"http"`
}

// TestTraefikConfiguration checks what holds without running Traefik: the
// dynamic configuration uses Traefik's field names, routes the API through
// ForwardAuth, hands every rate-limit header on, and reaches Tollgate only
// through the internal router that sets the token and fails open.
func TestTraefikConfiguration(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../configs/traefik/dynamic.yml")
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	var c traefikDynamic
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("dynamic.yml: %v", err)
	}
	h := c.HTTP
	if r := h.Routers["api"]; !slices.Equal(r.Middlewares, []string{"tollgate"}) || h.Services[r.Service].LoadBalancer.Servers == nil {
		t.Errorf("router api: %+v", r)
	}
	fa := h.Middlewares["tollgate"].ForwardAuth
	if fa == nil || !strings.HasSuffix(fa.Address, "/v1/authz") || fa.TrustForwardHeader == nil || *fa.TrustForwardHeader {
		t.Fatalf("forwardAuth: %+v", fa)
	}
	want := slices.DeleteFunc(slices.Clone(rateLimitHeaders), func(h string) bool { return h == "Retry-After" })
	if got := slices.Sorted(slices.Values(fa.AuthResponseHeaders)); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
		t.Errorf("authResponseHeaders %v, want %v", got, want)
	}
	authz := h.Routers["tollgate-authz"]
	if !slices.Equal(authz.EntryPoints, []string{"tollgate-authz"}) || !slices.Contains(authz.Middlewares, "tollgate-token") ||
		authz.Middlewares[0] != "tollgate-fail-open" || !strings.Contains(fa.Address, "127.0.0.1:8001") {
		t.Errorf("router tollgate-authz: %+v; ForwardAuth must ask it (127.0.0.1:8001), failing open first", authz)
	}
	if e := h.Middlewares["tollgate-fail-open"].Errors; e == nil || e.Service != "noop@internal" || !slices.Contains(e.Status, "502-504") || e.StatusRewrites["500-599"] != 200 {
		t.Errorf("tollgate-fail-open: %+v", e)
	}
	if set := h.Middlewares["tollgate-token"].Headers; set == nil || set.CustomRequestHeaders["X-Tollgate-Token"] == "" {
		t.Error("tollgate-token must set X-Tollgate-Token")
	}
	lb := h.Services[authz.Service].LoadBalancer
	if to := h.ServersTransports[lb.ServersTransport].ForwardingTimeouts; to.ResponseHeaderTimeout != "1s" || to.DialTimeout == "" {
		t.Errorf("service %s: serversTransport %q: %+v, want the 1 s deadline of the other proxies", authz.Service, lb.ServersTransport, to)
	}
}
