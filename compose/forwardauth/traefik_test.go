package forwardauth_test

import (
	"bytes"
	"os"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// traefikDynamic is the part of Traefik's dynamic configuration that
// configs/traefik/dynamic.yml uses, with Traefik's own field names
// (pkg/config/dynamic), decoded strictly so that a misspelt field fails.
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
				AuthResponseHeaders []string `yaml:"authResponseHeaders"`
			} `yaml:"forwardAuth"`
			Headers *struct {
				CustomRequestHeaders map[string]string `yaml:"customRequestHeaders"`
			} `yaml:"headers"`
		} `yaml:"middlewares"`
		Services map[string]struct {
			LoadBalancer struct {
				Servers []struct {
					URL string `yaml:"url"`
				} `yaml:"servers"`
			} `yaml:"loadBalancer"`
		} `yaml:"services"`
	} `yaml:"http"`
}

// TestTraefikConfiguration checks what can be checked without a Traefik
// binary (Debian ships none): the dynamic configuration uses Traefik's
// field names, routes through the ForwardAuth middleware to /v1/authz,
// hands every rate-limit header on, and its token middlewares set and
// then remove X-Tollgate-Token.
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
	r, ok := c.HTTP.Routers["api"]
	if !ok || !slices.Equal(r.Middlewares, []string{"tollgate"}) || c.HTTP.Services[r.Service].LoadBalancer.Servers == nil {
		t.Fatalf("router api: %+v", r)
	}
	fa := c.HTTP.Middlewares["tollgate"].ForwardAuth
	if fa == nil || !strings.HasSuffix(fa.Address, "/v1/authz") || fa.TrustForwardHeader == nil || *fa.TrustForwardHeader {
		t.Fatalf("forwardAuth: %+v", fa)
	}
	want := slices.DeleteFunc(slices.Clone(rateLimitHeaders), func(h string) bool { return h == "Retry-After" })
	if got := slices.Sorted(slices.Values(fa.AuthResponseHeaders)); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
		t.Errorf("authResponseHeaders %v, want %v", got, want)
	}
	set, unset := c.HTTP.Middlewares["tollgate-token"].Headers, c.HTTP.Middlewares["tollgate-untoken"].Headers
	if set == nil || set.CustomRequestHeaders["X-Tollgate-Token"] == "" || unset == nil {
		t.Fatal("tollgate-token must set X-Tollgate-Token")
	}
	if v, ok := unset.CustomRequestHeaders["X-Tollgate-Token"]; !ok || v != "" {
		t.Fatal("tollgate-untoken must remove X-Tollgate-Token (an empty value)")
	}
}
