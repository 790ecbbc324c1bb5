package gateway

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/textproto"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/gateway/internal/tarpit"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/httpguard"
	"github.com/tollgate/tollgate/guard/keyid"
	"github.com/tollgate/tollgate/guard/lease"
	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/internal/httptoken"
	"github.com/tollgate/tollgate/internal/regions"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// Off, as a listen address, disables the check API, metrics or gRPC
// listener (the proxy is disabled by leaving upstream empty).
const Off = "off"

// Config is the gateway's configuration. Every field can be set in
// the YAML file given with --config and overridden by the environment
// variable TOLLGATE_ + its YAML path in upper snake case (package configs);
// the `doc` tags are what --help prints. Zero fields take their defaults in
// SetDefaults; configs/gateway.yaml is the documented example, equal to the
// defaults (a test checks it).
type Config struct {
	Listen        string `yaml:"listen" doc:"Address of the public reverse proxy. Started only when upstream is set."`
	Upstream      string `yaml:"upstream" doc:"URL the proxy forwards admitted requests to, e.g. http://127.0.0.1:9000. Empty: no proxy, only the check API and Envoy RLS."`
	APIListen     string `yaml:"api_listen" doc:"Address of the check API, POST /v1/check, /v1/check/batch and /v1/report, and /v1/authz (forward-auth for nginx, Caddy, Traefik); off disables it."`
	APIToken      string `yaml:"api_token" doc:"Bearer token the check API requires (Authorization: Bearer <token>); /v1/authz, where Authorization is the client's, takes it in X-Tollgate-Token or trusts a caller in identity.trusted_proxies. Empty: no token, so keep api_listen on loopback."`
	MetricsListen string `yaml:"metrics_listen" doc:"Address of GET /metrics, /healthz and /readyz; off disables it."`
	GRPCListen    string `yaml:"grpc_listen" doc:"Address of Envoy's rate-limit gRPC service, envoy.service.ratelimit.v3; off disables it. It does not use api_token: keep it on loopback or a private interface, or require client certificates (grpc_tls_client_ca_file)."`
	// TLS of the Envoy RLS listener (docs/gateway.md, trust model).
	GRPCTLSCertFile     string `yaml:"grpc_tls_cert_file" doc:"PEM certificate (chain) of the Envoy RLS listener; with grpc_tls_key_file it serves TLS. Empty: plaintext."`
	GRPCTLSKeyFile      string `yaml:"grpc_tls_key_file" doc:"PEM private key of grpc_tls_cert_file."`
	GRPCTLSClientCAFile string `yaml:"grpc_tls_client_ca_file" doc:"PEM CA bundle: when set, the Envoy RLS listener requires a client certificate signed by it (mutual TLS) and refuses clients without one. Needs grpc_tls_cert_file."`
	RulesFile           string `yaml:"rules_file" doc:"Rules file, loaded at start (the gateway refuses to start without a valid one) and watched: a change is applied within a second; an invalid file is refused and the running rules stay. In fleet mode (nats.url set) it is only the ruleset a gateway without a last-known-good copy starts from until NATS answers, and is not watched."`
	KeySecret           string `yaml:"key_secret" doc:"Secret of the keyed hash that turns API keys into key_ids (HMAC-SHA-256); required, at least 16 bytes, and the same on every gateway and aggregator. Generate one with: openssl rand -base64 32."`

	Redis configs.Redis `yaml:"redis"`
	Kafka configs.Kafka `yaml:"kafka"`
	NATS  configs.NATS  `yaml:"nats"`

	Region string `yaml:"region" doc:"Name of the region this gateway is in (1 to 64 characters from a-z, 0-9 and -): a rule marked regions: global is enforced against this region's share of its limit, as the rules file's regions list gives it (a region the list does not name gets a share of 0). Without a regions list in the rules, the region holds every limit whole, whatever its name."`
	// RegionsPeriod is the period of the loans between regions.
	RegionsPeriod time.Duration `yaml:"regions_period" doc:"When the rules list several regions: the period of the loans between regions that a global rule's share ledger counts in. Every gateway and aggregator of every region must use the same value (the aggregators' regions_period). At least 4 times the clock skew bound (100ms)."`

	GatewayID string `yaml:"gateway_id" doc:"Name of this gateway in metrics (label gateway), logs and decision events, and of its directory under data_dir. Empty: hostname-pid, which changes at every start: set a stable name so a restarted gateway finds its files. In fleet mode it also names the gateway's entry in the tollgate_gateways NATS KV bucket (the gateways the operator API lists), so it holds only a-z, A-Z, 0-9 and - _ = . and neither starts nor ends with a dot."`
	DataDir   string `yaml:"data_dir" doc:"Directory of local state, shared with the other Tollgate processes of a host (the aggregator's variable too). The gateway keeps its files under <data_dir>/gateway/<gateway_id>/ (fleet mode: lkg.json, the last-known-good copy of the rules, blocklist and overrides it starts from when NATS is unreachable) and its event spool under <data_dir>/spool/<gateway_id>/. Created when first needed."`

	Events EventsConfig `yaml:"events"`

	MaxCost  int64 `yaml:"max_cost" doc:"Largest cost one request may ask for (check API cost, trusted cost header, Envoy hits_addend); more is answered 400 COST_EXCEEDS_LIMIT."`
	MaxBatch int   `yaml:"max_batch" doc:"Most items in one POST /v1/check/batch; a longer array is refused whole with 400 BATCH_TOO_LARGE."`
	// MaxRulesPerRequest bounds the work of one request (guard.WithMaxRules).
	MaxRulesPerRequest int     `yaml:"max_rules_per_request" doc:"Most rules one request may match: each is a counter in its Redis call and an item in its RateLimit headers. A rules file where every request of some kind (say every key of a tier) matches more is refused at load; a request that matches more at run time is answered 500 TOO_MANY_RULES without a Redis call, counted in tollgate_too_many_rules_total and logged."`
	FailureShare       float64 `yaml:"failure_share" doc:"This gateway's share of the fleet, in (0, 1]: while Redis is unavailable, rules with on_failure: closed are limited locally at max(1, floor(limit x share))."`

	Identity IdentityConfig `yaml:"identity"`

	FastPath FastPathConfig `yaml:"fast_path"`

	CostResponseHeader string `yaml:"cost_response_header" doc:"Upstream response header whose value (a positive integer, e.g. tokens of an LLM answer) the proxy charges after the response, like POST /v1/report, in addition to the request's own cost; at most max_cost. Empty: none."`

	Limits LimitsConfig `yaml:"limits"`

	Offenders OffendersConfig `yaml:"offenders"`

	ShutdownTimeout time.Duration `yaml:"shutdown_timeout" doc:"How long a shutdown waits for in-flight requests to finish before closing their connections."`

	Pprof bool `yaml:"pprof" doc:"Serve Go's profiles under /debug/pprof/ on metrics_listen (CPU, heap, goroutines of the running gateway). Off by default: profiles show internals, so keep metrics_listen on loopback."`

	// Runtime is applied by bin/gateway to the Go runtime (New ignores it:
	// a library does not change its process's garbage collector).
	Runtime RuntimeConfig `yaml:"runtime"`

	// Log is used by bin/gateway to build its logger (New takes a
	// *slog.Logger and ignores it).
	Log configs.Log `yaml:"log"`
}

// EventsConfig is the `events` section: the decision event producer,
// active when kafka.brokers is set.
type EventsConfig struct {
	SpoolDir      string        `yaml:"spool_dir" doc:"Directory of the on-disk spool decision events spill to while Kafka is unreachable or slow, replayed in order when it returns. Empty: <data_dir>/spool/<gateway_id>, so two gateways on one machine never share one (the spool is locked)."`
	SpoolMaxBytes int64         `yaml:"spool_max_bytes" doc:"Disk budget of the spool in bytes. Past it decisions are dropped, counted in tollgate_events_dropped_total and logged once per interval; nothing else is ever lost on a graceful stop."`
	MemoryBytes   int           `yaml:"memory_bytes" doc:"Decision events buffered in memory before they spill to the spool."`
	FlushInterval time.Duration `yaml:"flush_interval" doc:"Longest time an event stays only in memory before it is written to the spool when Kafka has not acknowledged it: what a SIGKILL may lose is bounded by this and memory_bytes."`
}

// IdentityConfig is the `identity` section: how the proxy reads a request's
// API key, client IP, tenant, tier and cost.
type IdentityConfig struct {
	KeySources     []string `yaml:"key_sources" doc:"Where the proxy looks for the API key, in order; the first present wins: header:<name>, bearer (Authorization: Bearer; a token that is not a valid key, say a JWT, falls through) or query:<name>."`
	TrustedProxies []string `yaml:"trusted_proxies" doc:"CIDRs (or addresses) of proxies in front of the gateway. Only from them are X-Forwarded-For (walked from the right), tenant_header, tier_header and cost_header believed. Empty: the client IP is always the socket peer."`
	TenantHeader   string   `yaml:"tenant_header" doc:"Request header carrying the tenant, set by a trusted auth layer; honoured only from trusted_proxies, and the key registry wins. Empty: none."`
	TierHeader     string   `yaml:"tier_header" doc:"Request header carrying the tier, set by a trusted auth layer; honoured only from trusted_proxies, and the key registry wins. Empty: none."`
	CostHeader     string   `yaml:"cost_header" doc:"Request header carrying the request's cost (a positive integer); honoured only from trusted_proxies, and a rule's own cost wins. Empty: none."`
}

// FastPathConfig is the `fast_path` section: the guard's local fast path
// (guard/lease) and resolution cache.
type FastPathConfig struct {
	Disabled       bool          `yaml:"disabled" doc:"true: no leases and no negative cache, every check of a rule goes to Redis (strict rules always do)."`
	MaxLeaseTTL    time.Duration `yaml:"max_lease_ttl" doc:"Longest a lease of units taken from Redis lives on this gateway before what it did not use is given back: the longest other gateways may miss those units. Token buckets and GCRA are further held to 1% of their refill time; fixed windows and sliding window counters use window_lease_ttl."`
	WindowLeaseTTL time.Duration `yaml:"window_lease_ttl" doc:"Longest a lease of a fixed_window or sliding_window_counter counter lives on this gateway, never past the end of the window (sub-window) its units were counted in. Such a lease admits nothing the exact counter would not, so it may live longer than a bucket's: keys at a few requests per second then need a Redis call a minute, not one every few seconds. The cost: units this gateway leased and did not use are unavailable to the others for up to that long."`
	Counters       int           `yaml:"counters" doc:"Counters this gateway keeps leases and negative-cache entries for; beyond it, idle counters make room and the others go to Redis."`
	Resolutions    int           `yaml:"resolutions" doc:"Requests (key, endpoint, method, domain) whose resolution (key_id, lists, matched rules, counter names) is cached until the rules or controls change."`
}

// RuntimeConfig is the `runtime` section: the Go garbage collector of
// bin/gateway. A decision allocates little, but what it does allocate on a
// small heap made the collector run some twenty times a second; a high
// GOGC with a memory limit as the backstop cut the CPU per decision
// (docs/benchmarks.md).
type RuntimeConfig struct {
	GCPercent     int `yaml:"gc_percent" doc:"Go's GOGC for bin/gateway: the heap may grow by this many percent of the live heap between collections. The GOGC variable, when set, wins."`
	MemoryLimitMB int `yaml:"memory_limit_mb" doc:"Go's soft memory limit for bin/gateway in MiB: past it the collector runs as often as needed whatever gc_percent says. The GOMEMLIMIT variable, when set, wins."`
}

// LimitsConfig is the `limits` section: protection against slow or hostile
// clients.
type LimitsConfig struct {
	MaxBodyBytes      int64         `yaml:"max_body_bytes" doc:"Largest check API request body in bytes; larger is answered 413 BODY_TOO_LARGE. Proxied bodies are streamed and not limited."`
	MaxHeaderBytes    int           `yaml:"max_header_bytes" doc:"Largest request header block in bytes on every listener."`
	ReadHeaderTimeout time.Duration `yaml:"read_header_timeout" doc:"Time a client has to send its request headers."`
	ReadTimeout       time.Duration `yaml:"read_timeout" doc:"Time a client has to send a whole request, body included."`
	WriteTimeout      time.Duration `yaml:"write_timeout" doc:"Longest time to write a proxied response; 0 means no limit, so streamed responses may last. The check API and metrics listeners always use at most 30s."`
	IdleTimeout       time.Duration `yaml:"idle_timeout" doc:"How long an idle keep-alive connection stays open."`
}

// OffendersConfig is the `offenders` section: the proxy's connection-level
// answer to keys at the top of the penalty ladder, for clients
// connected directly, never for identity.trusted_proxies, whose connections
// other clients share.
type OffendersConfig struct {
	CloseAfter    int           `yaml:"close_after" doc:"Answers to a key at the top of the penalty ladder (or on the blocklist) one client connection gets before the proxy adds Connection: close and closes it: a client that stops when told keeps its connection, one that keeps sending pays a new handshake. 1 closes at the first."`
	Throttle      string        `yaml:"throttle" doc:"on: a client address whose connection was closed for a key at the top of the ladder is throttled at accept for throttle_for (each new connection held for throttle_delay, then served, and closed at its first such answer); off: never."`
	ThrottleFor   time.Duration `yaml:"throttle_for" doc:"How long a client address stays throttled after its last connection closed for the top of the ladder."`
	ThrottleDelay time.Duration `yaml:"throttle_delay" doc:"How long a new connection from a throttled address is held before the proxy reads it."`
	MaxHeld       int           `yaml:"max_held" doc:"Most connections held at once; past it a throttled address's new connection is closed at once."`
	MaxAddresses  int           `yaml:"max_addresses" doc:"Client addresses (IPv6 by /64) remembered for throttling: fixed memory, about 32 bytes each; when full, the address whose cooldown ends soonest gives way."`
}

// SetDefaults fills the section's zero fields with their defaults.
func (c *OffendersConfig) SetDefaults() {
	configs.Default(&c.CloseAfter, DefaultCloseAfter)
	configs.Default(&c.Throttle, ThrottleOn)
	configs.Default(&c.ThrottleFor, DefaultThrottleFor)
	configs.Default(&c.ThrottleDelay, DefaultThrottleDelay)
	configs.Default(&c.MaxHeld, DefaultMaxHeld)
	configs.Default(&c.MaxAddresses, DefaultMaxAddresses)
}

// Throttle modes of the offenders section.
const (
	ThrottleOn  = "on"
	ThrottleOff = "off"
)

// Defaults of Config's fields.
const (
	DefaultListen          = "127.0.0.1:8080"
	DefaultAPIListen       = "127.0.0.1:8082"
	DefaultMetricsListen   = "127.0.0.1:9091"
	DefaultGRPCListen      = "127.0.0.1:8089"
	DefaultRulesFile       = "configs/rules.yaml"
	DefaultRegion          = guard.DefaultRegion
	DefaultRegionsPeriod   = time.Duration(regions.DefaultPeriod) * time.Microsecond
	DefaultDataDir         = "tollgate-data"
	DefaultMaxCost         = 1000
	DefaultMaxBatch        = 100
	DefaultMaxRules        = guard.DefaultMaxRules
	DefaultFailureShare    = 0.25
	DefaultShutdownTimeout = 10 * time.Second
	DefaultGCPercent       = 1000
	DefaultMemoryLimitMB   = 1024
	DefaultMaxLeaseTTL     = lease.DefaultMaxTTL
	DefaultWindowLeaseTTL  = lease.DefaultWindowTTL
	DefaultLeaseCounters   = lease.DefaultCounters
	DefaultResolutions     = guard.DefaultResolutionCache

	DefaultSpoolMaxBytes      = 1 << 30
	DefaultEventMemoryBytes   = 8 << 20
	DefaultEventFlushInterval = 100 * time.Millisecond

	DefaultCloseAfter    = httpguard.DefaultCloseAfter
	DefaultThrottleFor   = time.Minute
	DefaultThrottleDelay = tarpit.DefaultDelay
	DefaultMaxHeld       = tarpit.DefaultMaxHeld
	DefaultMaxAddresses  = tarpit.DefaultAddresses

	DefaultMaxBodyBytes      = 64 << 10
	DefaultMaxHeaderBytes    = 16 << 10
	DefaultReadHeaderTimeout = 5 * time.Second
	DefaultReadTimeout       = 60 * time.Second
	DefaultIdleTimeout       = 2 * time.Minute

	// apiWriteTimeout bounds writes on the check API and metrics listeners.
	apiWriteTimeout = 30 * time.Second
)

// DefaultKeySources are the identity.key_sources default.
var defaultKeySources = []string{"header:X-API-Key", "bearer"}

// minKeySecret is the shortest key_secret accepted, in bytes: the guard's
// own minimum, so the library and the gateway agree.
const minKeySecret = keyid.MinSecretLen

// SetDefaults fills zero fields with their defaults. GatewayID defaults to
// the host name and process id.
func (c *Config) SetDefaults() {
	configs.Default(&c.Listen, DefaultListen)
	configs.Default(&c.APIListen, DefaultAPIListen)
	configs.Default(&c.MetricsListen, DefaultMetricsListen)
	configs.Default(&c.GRPCListen, DefaultGRPCListen)
	configs.Default(&c.RulesFile, DefaultRulesFile)
	configs.Default(&c.DataDir, DefaultDataDir)
	c.Redis.SetDefaults()
	configs.Default(&c.Events.SpoolMaxBytes, DefaultSpoolMaxBytes)
	configs.Default(&c.Events.MemoryBytes, DefaultEventMemoryBytes)
	configs.Default(&c.Events.FlushInterval, DefaultEventFlushInterval)
	configs.Default(&c.Region, DefaultRegion)
	configs.Default(&c.RegionsPeriod, DefaultRegionsPeriod)
	if c.GatewayID == "" {
		c.GatewayID = configs.HostID("gateway")
	}
	configs.Default(&c.MaxCost, DefaultMaxCost)
	configs.Default(&c.MaxBatch, DefaultMaxBatch)
	configs.Default(&c.MaxRulesPerRequest, DefaultMaxRules)
	configs.Default(&c.FailureShare, DefaultFailureShare)
	if len(c.Identity.KeySources) == 0 {
		c.Identity.KeySources = append([]string(nil), defaultKeySources...)
	}
	configs.Default(&c.Runtime.GCPercent, DefaultGCPercent)
	configs.Default(&c.Runtime.MemoryLimitMB, DefaultMemoryLimitMB)
	configs.Default(&c.FastPath.MaxLeaseTTL, DefaultMaxLeaseTTL)
	configs.Default(&c.FastPath.WindowLeaseTTL, DefaultWindowLeaseTTL)
	configs.Default(&c.FastPath.Counters, DefaultLeaseCounters)
	configs.Default(&c.FastPath.Resolutions, DefaultResolutions)
	configs.Default(&c.Limits.MaxBodyBytes, DefaultMaxBodyBytes)
	configs.Default(&c.Limits.MaxHeaderBytes, DefaultMaxHeaderBytes)
	configs.Default(&c.Limits.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	configs.Default(&c.Limits.ReadTimeout, DefaultReadTimeout)
	configs.Default(&c.Limits.IdleTimeout, DefaultIdleTimeout)
	c.Offenders.SetDefaults()
	configs.Default(&c.ShutdownTimeout, DefaultShutdownTimeout)
	c.Log.SetDefaults()
	c.Kafka.SetDefaults()
}

// Validate reports every problem of a configuration with its defaults
// applied, at once (errors.Join), each naming the field and its variable.
func (c *Config) Validate() error {
	var errs []error
	bad := func(path, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s (%s): %s", path, configs.EnvName(path), fmt.Sprintf(format, args...)))
	}
	if c.KeySecret == "" {
		bad("key_secret", "required: the secret of the keyed hash that turns API keys into key_ids; set the same value on every gateway (e.g. `openssl rand -base64 32`)")
	} else if len(c.KeySecret) < minKeySecret {
		bad("key_secret", "too short: at least %d bytes", minKeySecret)
	}
	for _, l := range []struct{ path, addr string }{
		{"listen", c.Listen}, {"api_listen", c.APIListen},
		{"metrics_listen", c.MetricsListen}, {"grpc_listen", c.GRPCListen},
	} {
		if (l.addr == Off && l.path != "listen") || (l.path == "listen" && c.Upstream == "") {
			continue
		}
		if _, _, err := net.SplitHostPort(l.addr); err != nil {
			bad(l.path, "%q is not host:port: %v", l.addr, err)
		}
	}
	if c.Upstream != "" {
		u, err := url.Parse(c.Upstream)
		switch {
		case err != nil:
			bad("upstream", "%v", err)
		case u.Scheme != "http" && u.Scheme != "https":
			bad("upstream", "%q: scheme must be http or https", c.Upstream)
		case u.Host == "":
			bad("upstream", "%q has no host", c.Upstream)
		case u.RawQuery != "" || u.Fragment != "":
			bad("upstream", "%q must not have a query or fragment", c.Upstream)
		}
	}
	if c.RulesFile == "" {
		bad("rules_file", "required")
	}
	if err := rules.CheckRegionName(c.Region); err != nil {
		bad("region", "%v", err)
	}
	if err := (regions.Config{Period: c.RegionsPeriod.Microseconds()}).WithDefaults().Validate(); err != nil || c.RegionsPeriod <= 0 {
		bad("regions_period", "%v is not a valid period: at least %v", c.RegionsPeriod, 4*time.Duration(regions.DefaultSkew)*time.Microsecond+time.Microsecond)
	}
	if c.GatewayID == "." || c.GatewayID == ".." || strings.ContainsAny(c.GatewayID, `/\`) {
		bad("gateway_id", "%q names a directory under data_dir: no slashes, not . or ..", c.GatewayID)
	} else if c.NATS.URL != "" {
		if err := tollgatev1.CheckGatewayID(c.GatewayID); err != nil {
			bad("gateway_id", "%v: in fleet mode it names the gateway's entry in the NATS KV bucket %s", err, tollgatev1.BucketGateways)
		}
	}
	errs = append(errs, c.Redis.Validate("redis")...)
	if c.MaxCost < 1 || c.MaxCost > tollgatev1.MaxCost {
		// Above it, decision events could not carry the cost.
		bad("max_cost", "must be between 1 and %d", int64(tollgatev1.MaxCost))
	}
	if c.MaxBatch < 1 {
		bad("max_batch", "must be at least 1")
	}
	if c.MaxRulesPerRequest < 1 {
		bad("max_rules_per_request", "must be at least 1")
	}
	switch {
	case (c.GRPCTLSCertFile == "") != (c.GRPCTLSKeyFile == ""):
		bad("grpc_tls_cert_file", "grpc_tls_cert_file and grpc_tls_key_file (%s) go together", configs.EnvName("grpc_tls_key_file"))
	case c.GRPCTLSClientCAFile != "" && c.GRPCTLSCertFile == "":
		bad("grpc_tls_client_ca_file", "mutual TLS needs the listener's own certificate: set grpc_tls_cert_file (%s) and grpc_tls_key_file", configs.EnvName("grpc_tls_cert_file"))
	}
	if !(c.FailureShare > 0 && c.FailureShare <= 1) {
		bad("failure_share", "%v is not in (0, 1]", c.FailureShare)
	}
	if c.Runtime.GCPercent < 1 {
		bad("runtime.gc_percent", "must be at least 1")
	}
	if c.Runtime.MemoryLimitMB < 1 {
		bad("runtime.memory_limit_mb", "must be at least 1")
	}
	if c.FastPath.MaxLeaseTTL < 0 {
		bad("fast_path.max_lease_ttl", "must not be negative")
	}
	if c.FastPath.WindowLeaseTTL < 0 {
		bad("fast_path.window_lease_ttl", "must not be negative")
	}
	if c.FastPath.Counters < 1 {
		bad("fast_path.counters", "must be at least 1")
	}
	if c.FastPath.Resolutions < 1 {
		bad("fast_path.resolutions", "must be at least 1")
	}
	for i, s := range c.Identity.KeySources {
		if _, err := httpguard.ParseKeySource(s); err != nil {
			bad("identity.key_sources", "item %d: %v", i+1, err)
		}
	}
	for i, s := range c.Identity.TrustedProxies {
		if _, err := parsePrefix(s); err != nil {
			bad("identity.trusted_proxies", "item %d: %v", i+1, err)
		}
	}
	for _, h := range []struct{ path, name string }{
		{"identity.tenant_header", c.Identity.TenantHeader},
		{"identity.tier_header", c.Identity.TierHeader},
		{"identity.cost_header", c.Identity.CostHeader},
		{"cost_response_header", c.CostResponseHeader},
	} {
		if h.name != "" && !validHeaderName(h.name) {
			bad(h.path, "%q is not a header name", h.name)
		}
	}
	if c.Limits.MaxBodyBytes < 1 {
		bad("limits.max_body_bytes", "must be positive")
	}
	if c.Limits.MaxHeaderBytes < 1 {
		bad("limits.max_header_bytes", "must be positive")
	}
	if c.Offenders.CloseAfter < 1 {
		bad("offenders.close_after", "must be at least 1")
	}
	if c.Offenders.Throttle != ThrottleOn && c.Offenders.Throttle != ThrottleOff {
		bad("offenders.throttle", "%q is not on or off", c.Offenders.Throttle)
	}
	if c.Offenders.ThrottleFor <= 0 || c.Offenders.ThrottleDelay <= 0 {
		bad("offenders.throttle_for", "throttle_for and throttle_delay (%s) must be positive", configs.EnvName("offenders.throttle_delay"))
	}
	if c.Offenders.MaxHeld < 1 || c.Offenders.MaxAddresses < 1 {
		bad("offenders.max_held", "max_held and max_addresses (%s) must be at least 1", configs.EnvName("offenders.max_addresses"))
	}
	for _, d := range []struct {
		path string
		v    time.Duration
	}{
		{"limits.read_header_timeout", c.Limits.ReadHeaderTimeout},
		{"limits.read_timeout", c.Limits.ReadTimeout},
		{"limits.write_timeout", c.Limits.WriteTimeout},
		{"limits.idle_timeout", c.Limits.IdleTimeout},
		{"shutdown_timeout", c.ShutdownTimeout},
	} {
		if d.v < 0 {
			bad(d.path, "must not be negative")
		}
	}
	errs = append(errs, c.Log.Validate("log")...)
	errs = append(errs, c.Kafka.Validate("kafka")...)
	return errors.Join(errs...)
}

// StateDir is the directory of this gateway's own files:
// <data_dir>/gateway/<gateway_id>.
func (c *Config) StateDir() string { return filepath.Join(c.DataDir, "gateway", c.GatewayID) }

// identity builds the httpguard.Identity of a validated configuration.
func (c *Config) identity() (*httpguard.Identity, error) {
	id := &httpguard.Identity{
		TenantHeader: c.Identity.TenantHeader,
		TierHeader:   c.Identity.TierHeader,
		CostHeader:   c.Identity.CostHeader,
	}
	for _, s := range c.Identity.KeySources {
		ks, err := httpguard.ParseKeySource(s)
		if err != nil {
			return nil, err
		}
		id.Sources = append(id.Sources, ks)
	}
	for _, s := range c.Identity.TrustedProxies {
		p, err := parsePrefix(s)
		if err != nil {
			return nil, err
		}
		id.TrustedProxies = append(id.TrustedProxies, p)
	}
	return id, nil
}

// parsePrefix parses a CIDR, or a bare address as a one-address prefix.
func parsePrefix(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, err
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is neither a CIDR nor an IP address", s)
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

func validHeaderName(s string) bool {
	return httptoken.Is(s) && textproto.CanonicalMIMEHeaderKey(s) != ""
}

// Vars lists every configuration variable with its default and
// documentation, for --help.
func Vars() ([]configs.Var, error) {
	return configs.DefaultVars(func(c *Config) { c.GatewayID = "" }) // host-specific: documented in the doc tag
}

// LoadConfig loads a configuration the way bin/gateway does: the YAML file
// at path (none when empty), then the TOLLGATE_* environment (lookup; nil
// means os.LookupEnv), then SetDefaults and Validate.
func LoadConfig(path string, lookup configs.LookupFunc) (Config, error) {
	return configs.LoadChecked[Config](path, lookup)
}
