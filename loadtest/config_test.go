package loadtest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/loadtest/internal/testtarget"
)

func TestValidate(t *testing.T) {
	t.Parallel()
	bounded := DefaultConfig()
	bounded.Requests = 10
	tests := []struct {
		name   string
		change func(*Config)
		is     error
		want   []string
	}{
		{"defaults with a bound", func(*Config) {}, nil, nil},
		{"duration only", func(c *Config) { c.Requests, c.Duration = 0, time.Second }, nil, nil},
		{"grpc", func(c *Config) { c.Target, c.Cost = TargetGRPC, 0 }, nil, nil},
		{"unbounded", func(c *Config) { c.Requests = 0 }, ErrUnbounded, nil},
		{"too long", func(c *Config) { c.Duration = MaxDuration + time.Second }, ErrTooLong, nil},
		{"every problem at once", func(c *Config) {
			c.Target, c.URL, c.Rate, c.MaxInFlight, c.Keys, c.Cost, c.Timeout = TargetGRPC, "http://x", 5, 0, 0, -1, 0
		}, nil, []string{"takes an address", "max in flight", "keys", "cost", "timeout"}},
		{"bad url", func(c *Config) { c.URL = "ftp://x" }, nil, []string{"scheme"}},
		{"body for check", func(c *Config) { c.Target, c.Body = TargetCheck, "x" }, nil, []string{"body"}},
		{"redis address", func(c *Config) { c.Redis = []string{"localhost"} }, nil, []string{"host:port"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := bounded
			tt.change(&c)
			err := c.Validate()
			switch {
			case tt.is == nil && tt.want == nil:
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			case err == nil:
				t.Fatal("Validate accepted an invalid config")
			case tt.is != nil && !errors.Is(err, tt.is):
				t.Errorf("error %v is not %v", err, tt.is)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestEndpoint(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		target, url, addr, want string
	}{
		{TargetProxy, "", "", DefaultProxyURL},
		{TargetCheck, "", "", DefaultCheckURL},
		{TargetGRPC, "", "", DefaultGRPCAddr},
		{TargetCheck, "http://h:1", "", "http://h:1/v1/check"},
		{TargetCheck, "http://h:1/", "", "http://h:1/v1/check"},
		{TargetCheck, "http://h:1/custom", "", "http://h:1/custom"},
		{TargetGRPC, "", "h:2", "h:2"},
	} {
		c := Config{Target: tt.target, URL: tt.url, Addr: tt.addr}
		if got := c.Endpoint(); got != tt.want {
			t.Errorf("%s %q %q: Endpoint = %q, want %q", tt.target, tt.url, tt.addr, got, tt.want)
		}
	}
}

// TestRunMeasuresFirst refuses to send load when a measurement cannot be
// taken before the run.
func TestRunMeasuresFirst(t *testing.T) {
	t.Parallel()
	srv := testtarget.StartHTTP(t, nil)
	cfg := DefaultConfig()
	cfg.URL, cfg.Requests = srv.URL, 10
	for name, change := range map[string]func(*Config){
		"redis unreachable": func(c *Config) { c.Redis = []string{"127.0.0.1:1"} },
		"no such pid":       func(c *Config) { c.PID = 1 << 30 },
	} {
		c := cfg
		change(&c)
		if s, err := Run(t.Context(), c, nil); err == nil || s != nil {
			t.Errorf("%s: Run = %v, %v; want an error", name, s, err)
		}
	}
	if n := srv.Requests(); n != 0 {
		t.Errorf("%d requests sent although the run could not measure", n)
	}
}
