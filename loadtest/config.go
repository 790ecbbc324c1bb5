// Package loadtest is Tollgate's load generator as a library: [Run] drives
// one bounded run against the gateway's proxy, check API or Envoy
// rate-limit service and returns its [Summary]. Command loadtest
// (loadtest/cmd/loadtest) parses flags into a [Config] and calls Run; the
// scenarios and the benchmarks call Run in process.
//
// A run is bounded by a request count, a duration, or both (whichever comes
// first), and never lasts longer than [MaxDuration]. Latency comes from an
// HDR histogram with microsecond resolution. Given the target's pid, Run
// reports the target's CPU time per decision (Linux /proc); given Redis
// addresses, the Redis commands and EVALSHA calls per decision (INFO
// commandstats). See README.md for usage.
package loadtest

import (
	"errors"
	"fmt"
	"math"
	"net/url"
	"strings"
	"time"

	"github.com/tollgate/tollgate/loadtest/internal/keyspace"
	"github.com/tollgate/tollgate/loadtest/internal/report"
)

// Targets Config.Target accepts.
const (
	// TargetProxy sends HTTP requests through the gateway's proxy, the key
	// in X-API-Key.
	TargetProxy = "proxy"
	// TargetCheck posts {"api_key","endpoint","method","cost"} to the check
	// API's /v1/check.
	TargetCheck = "check"
	// TargetGRPC calls the Envoy rate-limit service's ShouldRateLimit.
	TargetGRPC = "grpc"
)

// Default addresses of each target, the gateway's defaults.
const (
	DefaultProxyURL = "http://127.0.0.1:8080"
	DefaultCheckURL = "http://127.0.0.1:8082/v1/check"
	DefaultGRPCAddr = "127.0.0.1:8089"
)

// MaxDuration is the longest a run may last: a Config asking for more is
// refused, and a run bounded only by a request count stops there.
const MaxDuration = 10 * time.Minute

// Errors of Config.Validate; match them with errors.Is.
var (
	// ErrUnbounded means neither Requests nor Duration bounds the run.
	ErrUnbounded = errors.New("loadtest: a run needs a bound: set requests, duration or both")
	// ErrTooLong means Duration exceeds MaxDuration.
	ErrTooLong = errors.New("loadtest: duration exceeds the " + MaxDuration.String() + " cap")
)

// Summary is the end-of-run report; its JSON form is the -json output,
// its WriteHTML the -report page.
type Summary = report.Summary

// Chart is one more chart for the HTML page of a [Summary], added with
// Summary.AddChart: a scenario with an exact reference model sets what
// was admitted against what the model admits.
type Chart = report.Chart

// Series is one line of a [Chart].
type Series = report.Series

// Config describes one run. Start from [DefaultConfig]: its zero value is
// not valid (no bound, no workers).
type Config struct {
	// Target is TargetProxy (default), TargetCheck or TargetGRPC.
	Target string
	// URL is the HTTP targets' address: the proxy's base URL, to which each
	// request's path is appended, or the check API's URL (/v1/check is
	// appended when it has no path). Empty: DefaultProxyURL or
	// DefaultCheckURL.
	URL string
	// Addr is the gRPC target's host:port, or several separated by commas
	// (a fleet of gateways: requests go to them in turn, GRPCConns
	// connections each). Empty: DefaultGRPCAddr.
	Addr string
	// Method is the proxy's request method, and the method the check body
	// names. Default GET.
	Method string
	// Body is sent with every proxy request; empty: none.
	Body string
	// Token, when set, is sent to the check API as a bearer token.
	Token string
	// Domain is the gRPC requests' domain. Default "tollgate".
	Domain string
	// GRPCConns is the number of gRPC connections. Default 1.
	GRPCConns int

	// Rate > 0 runs open loop at Rate requests per second; 0 (default)
	// runs closed loop with Workers.
	Rate float64
	// Workers is the closed-loop concurrency. Default 50.
	Workers int
	// MaxInFlight caps outstanding open-loop requests. Default 1024.
	MaxInFlight int
	// Requests bounds the requests sent; 0 means no count bound.
	Requests int64
	// Duration bounds the run's time, at most MaxDuration; 0 means
	// MaxDuration when Requests is set. One of the two must be set.
	Duration time.Duration
	// Timeout bounds each request. Default 5s.
	Timeout time.Duration

	// Keys is the number of distinct API keys. Default 1000.
	Keys int
	// KeyPrefix starts every key. Default "sk_load_".
	KeyPrefix string
	// Dist is "uniform" (default) or "zipf".
	Dist string
	// ZipfS is the Zipf exponent, greater than 1. Default 1.1.
	ZipfS float64
	// Paths are the endpoints, drawn uniformly. Empty: the proxy uses URL
	// as given, the check API and gRPC send "/".
	Paths []string
	// Cost is each request's cost (check body, gRPC hits). Default 1.
	Cost int
	// Seed fixes the keys and paths drawn. Default 1.
	Seed uint64

	// OnAnswer, when set, is called for every answered request with its
	// key and the name of its outcome (an HTTP class such as "2xx" or
	// "429", or an RLS code such as "OK" or "OVER_LIMIT"), from the
	// goroutine that sent it: scenarios count per key with it (accuracy
	// against an exact oracle). It must be quick and safe for concurrent
	// use.
	OnAnswer func(key, outcome string)

	// PID, when positive, is the target process: its CPU time during the
	// run is reported per decision (Linux only).
	PID int
	// Redis, when set, lists Redis servers (host:port) whose INFO
	// commandstats before and after give the commands per decision.
	Redis []string
	// RedisUsername and RedisPassword authenticate to Redis.
	RedisUsername, RedisPassword string
}

// DefaultConfig returns the defaults, without a bound.
func DefaultConfig() Config {
	return Config{
		Target:      TargetProxy,
		Method:      "GET",
		Domain:      "tollgate",
		GRPCConns:   1,
		Workers:     50,
		MaxInFlight: 1024,
		Timeout:     5 * time.Second,
		Keys:        1000,
		KeyPrefix:   "sk_load_",
		Dist:        keyspace.Uniform,
		ZipfS:       keyspace.DefaultZipfS,
		Cost:        1,
		Seed:        1,
	}
}

// OpenLoop reports whether c runs at a fixed rate.
func (c Config) OpenLoop() bool { return c.Rate > 0 }

// Endpoint returns the address requests go to: the URL of an HTTP target,
// the host:port of the gRPC target, defaults filled in.
func (c Config) Endpoint() string {
	switch c.Target {
	case TargetGRPC:
		if c.Addr == "" {
			return DefaultGRPCAddr
		}
		return c.Addr
	case TargetCheck:
		if c.URL == "" {
			return DefaultCheckURL
		}
		if u, err := url.Parse(c.URL); err == nil && (u.Path == "" || u.Path == "/") {
			u.Path = "/v1/check"
			return u.String()
		}
		return c.URL
	default:
		if c.URL == "" {
			return DefaultProxyURL
		}
		return c.URL
	}
}

// keyspace returns the key and path configuration, default paths filled in.
func (c Config) keyspace() keyspace.Config {
	paths := c.Paths
	if len(paths) == 0 {
		paths = []string{"/"}
		if c.Target == TargetProxy {
			paths = []string{""}
		}
	}
	return keyspace.Config{Keys: c.Keys, Prefix: c.KeyPrefix, Dist: c.Dist, ZipfS: c.ZipfS, Paths: paths}
}

// duration returns the duration bound, MaxDuration when unset.
func (c Config) duration() time.Duration {
	if c.Duration == 0 {
		return MaxDuration
	}
	return c.Duration
}

// Validate reports every problem with c at once, joined; ErrUnbounded and
// ErrTooLong can be matched with errors.Is.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("loadtest: "+format, args...)) }
	switch c.Target {
	case TargetProxy, TargetCheck:
		if c.Addr != "" {
			bad("target %s takes a URL, not an address", c.Target)
		}
		u, err := url.Parse(c.Endpoint())
		switch {
		case err != nil:
			bad("url: %v", err)
		case u.Scheme != "http" && u.Scheme != "https":
			bad("url %q: scheme must be http or https", c.Endpoint())
		case u.Host == "":
			bad("url %q has no host", c.Endpoint())
		}
		if c.Method == "" || strings.ContainsAny(c.Method, " \t\r\n") {
			bad("method %q is not a valid HTTP method", c.Method)
		}
	case TargetGRPC:
		if c.URL != "" {
			bad("target grpc takes an address, not a URL")
		}
		if c.Domain == "" {
			bad("grpc target needs a domain")
		}
		if c.GRPCConns < 1 {
			bad("grpc connections must be at least 1, got %d", c.GRPCConns)
		}
		if c.Cost > math.MaxUint32 {
			bad("cost %d exceeds the gRPC maximum %d", c.Cost, uint32(math.MaxUint32))
		}
	default:
		bad("target %q: want %s, %s or %s", c.Target, TargetProxy, TargetCheck, TargetGRPC)
	}
	if c.Body != "" && c.Target != TargetProxy {
		bad("a body is only sent to the proxy target")
	}
	switch {
	case math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0) || c.Rate < 0:
		bad("rate must be a finite number ≥ 0, got %v", c.Rate)
	case c.OpenLoop() && c.MaxInFlight < 1:
		bad("max in flight must be at least 1, got %d", c.MaxInFlight)
	case !c.OpenLoop() && c.Workers < 1:
		bad("workers must be at least 1, got %d", c.Workers)
	}
	if c.Requests < 0 {
		bad("requests must be ≥ 0, got %d", c.Requests)
	}
	switch {
	case c.Duration < 0:
		bad("duration must be ≥ 0, got %v", c.Duration)
	case c.Duration > MaxDuration:
		errs = append(errs, fmt.Errorf("%w: %v", ErrTooLong, c.Duration))
	}
	if c.Requests == 0 && c.Duration == 0 {
		errs = append(errs, ErrUnbounded)
	}
	if c.Timeout <= 0 {
		bad("timeout must be positive, got %v", c.Timeout)
	}
	if err := c.keyspace().Validate(); err != nil {
		errs = append(errs, err)
	}
	for _, p := range c.Paths {
		if !strings.HasPrefix(p, "/") {
			bad("path %q must start with /", p)
		}
	}
	if c.Cost < 0 {
		bad("cost must be ≥ 0, got %d", c.Cost)
	}
	if c.PID < 0 {
		bad("pid must be ≥ 0, got %d", c.PID)
	}
	for _, a := range c.Redis {
		if a == "" || !strings.Contains(a, ":") {
			bad("redis address %q: want host:port", a)
		}
	}
	return errors.Join(errs...)
}
