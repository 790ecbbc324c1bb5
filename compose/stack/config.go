package stack

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/tollgate/tollgate/aggregator"
	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/gateway"
)

// Values of Config.Redis.
const (
	// RedisAuto runs a redis-server from $TOLLGATE_REDIS_SERVER or PATH,
	// else the embedded one.
	RedisAuto = "auto"
	// RedisServer runs a redis-server and fails when there is none.
	RedisServer = "server"
	// RedisEmbedded runs the embedded Redis (miniredis) even when a
	// redis-server is installed.
	RedisEmbedded = "embedded"
)

// Defaults of the fields the gateway does not own (its own are
// gateway.DefaultListen and friends).
const (
	DefaultDemoListen  = "127.0.0.1:9000"
	DefaultRedis       = RedisAuto
	DefaultKafkaListen = "127.0.0.1:9092"
	DefaultNATSListen  = "nats://127.0.0.1:4222"
	DefaultEnvFile     = "bin/stack.env"
	DefaultRegions     = 1
	// MaxRegions is the most regions the stack runs.
	MaxRegions = 7
)

// Config is the local stack's configuration (docs/local-stack.md). Every field is
// overridden by the environment variable TOLLGATE_ + its YAML path in upper
// snake case (package configs), the same variables bin/gateway reads for
// the fields they share; the `doc` tags are what --help prints. Zero fields
// take their defaults in SetDefaults. Any address may use port 0 (a free
// port; Stack.Addrs tells which), as tests do.
type Config struct {
	Listen        string `yaml:"listen" doc:"Address of the gateway's public reverse proxy, in front of the demo API."`
	APIListen     string `yaml:"api_listen" doc:"Address of the gateway's check API (POST /v1/check, /v1/check/batch, /v1/report)."`
	MetricsListen string `yaml:"metrics_listen" doc:"Address of the gateway's GET /metrics, /healthz and /readyz."`
	GRPCListen    string `yaml:"grpc_listen" doc:"Address of the gateway's Envoy rate-limit gRPC service (envoy.service.ratelimit.v3)."`
	DemoListen    string `yaml:"demo_listen" doc:"Address of the demo API the proxy forwards to: JSON for any path, GET /v1/slow?ms=N for latency."`
	RulesFile     string `yaml:"rules_file" doc:"Rules file that seeds the NATS rules bucket when it is empty (the stack's gateway runs in fleet mode and starts from it until NATS answers); afterwards change the rules through the operator API (PUT /admin/v1/rules). Relative paths start from the current directory (make run: the repository root)."`
	KeySecret     string `yaml:"key_secret" doc:"Secret of the keyed hash that turns API keys into key_ids, at least 16 bytes. Empty: generated at start and printed."`
	AdminToken    string `yaml:"admin_token" doc:"Bearer token of the aggregator's operator API and usage reports. Empty: generated at start and printed."`
	ViewerToken   string `yaml:"viewer_token" doc:"Read-only token of the aggregator's operator API, reports and console: reads are answered, changes are 403 FORBIDDEN. Empty: generated at start and printed."`

	KafkaListen             string `yaml:"stack_kafka_listen" doc:"Address of the embedded Kafka-protocol broker (franz-go's kfake): any Kafka client can read the topics from it."`
	NATSListen              string `yaml:"stack_nats_listen" doc:"Address of the embedded NATS server (JetStream on), nats://host:port or host:port: the nats CLI can watch the KV buckets."`
	AggregatorListen        string `yaml:"aggregator_listen" doc:"Address of the aggregator's operator API and usage reports (bearer admin_token)."`
	AggregatorMetricsListen string `yaml:"aggregator_metrics_listen" doc:"Address of the aggregator's GET /metrics, /healthz and /readyz."`
	DataDir                 string `yaml:"data_dir" doc:"Directory of the stack's state: the Kafka log, NATS's JetStream store and the aggregator's Pebble. Empty: a new temporary directory, removed on exit; set it to keep state across runs."`
	EnvFile                 string `yaml:"stack_env_file" doc:"File the stack writes while it runs (removed on exit): KEY=VALUE lines of TOLLGATE_REDIS_ADDRS, TOLLGATE_REDIS_TIMEOUT, TOLLGATE_KAFKA_BROKERS, TOLLGATE_NATS_URL, TOLLGATE_KEY_SECRET, TOLLGATE_ADMIN_TOKEN and TOLLGATE_VIEWER_TOKEN, so a second bin/gateway or bin/aggregator can join: set -a; . bin/stack.env; set +a. Beside it, the same name ending in .pid (bin/stack.pid) holds the stack's process id, for tools that watch it (bin/loadtest storm -pid \"$(cat bin/stack.pid)\"). off: neither file."`
	Regions                 int    `yaml:"stack_regions" doc:"How many regions to run, 1 to 7. 1: one region, as in every example. 2 or more: regions r1, r2, …, each its own Redis, Kafka-protocol broker, NATS (its own JetStream domain), aggregator, demo API and gateway, r1 on the addresses above and the others on free ports; their NATS servers linked by leafnode connections, each region's through a link proxy whose control API adds latency, cuts and heals; the rules' regions list is r1..rN with equal weights. The banner prints every address; bin/stack.env adds TOLLGATE_STACK_R1_PROXY and the like, and bin/stack.r2.env joins region r2."`
	Redis                   string `yaml:"stack_redis" doc:"Which Redis to run: auto (a redis-server from TOLLGATE_REDIS_SERVER or PATH, else an embedded one), server (redis-server or fail) or embedded (the embedded one, a demo stand-in: slower, never for benchmarks)."`
	// RedisClient is how the stack's gateway and aggregator call the
	// stack's Redis (the redis section of bin/gateway and bin/aggregator).
	RedisClient RedisClient `yaml:"redis"`

	// The aggregator's penalty ladder and the gateway's connection-level
	// answer to its top, as bin/aggregator and bin/gateway read them
	// (TOLLGATE_PENALTY_*, TOLLGATE_OFFENDERS_*): a short ladder makes
	// `loadtest storm` climb and step down in minutes.
	Penalty   aggregator.PenaltyConfig `yaml:"penalty"`
	Offenders gateway.OffendersConfig  `yaml:"offenders"`

	Log configs.Log `yaml:"log"`
}

// RedisClient is the part of the redis section the stack lets you set:
// the rest (addresses, mode) is the Redis the stack runs.
type RedisClient struct {
	Timeout time.Duration `yaml:"timeout" doc:"Deadline of one Redis call of the stack's gateway and aggregator: past it the gateway decides by the rules' failure mode (an open rule answers 200 without RateLimit headers) and the operator API answers 503 REDIS_UNAVAILABLE. Empty: 50ms on a redis-server, 500ms on the embedded Redis; raise it on a machine so loaded that Redis answers late."`
}

// SetDefaults fills zero fields with their defaults (the addresses docs/local-stack.md lists).
// It leaves KeySecret, AdminToken and ViewerToken empty: New generates them.
func (c *Config) SetDefaults() {
	configs.Default(&c.Listen, gateway.DefaultListen)
	configs.Default(&c.APIListen, gateway.DefaultAPIListen)
	configs.Default(&c.MetricsListen, gateway.DefaultMetricsListen)
	configs.Default(&c.GRPCListen, gateway.DefaultGRPCListen)
	configs.Default(&c.DemoListen, DefaultDemoListen)
	configs.Default(&c.RulesFile, gateway.DefaultRulesFile)
	configs.Default(&c.Redis, DefaultRedis)
	configs.Default(&c.KafkaListen, DefaultKafkaListen)
	configs.Default(&c.NATSListen, DefaultNATSListen)
	configs.Default(&c.AggregatorListen, aggregator.DefaultListen)
	configs.Default(&c.AggregatorMetricsListen, aggregator.DefaultMetricsListen)
	configs.Default(&c.EnvFile, DefaultEnvFile)
	configs.Default(&c.Regions, DefaultRegions)
	c.Penalty.SetDefaults()
	c.Offenders.SetDefaults()
	c.Log.SetDefaults()
}

// Validate reports every problem of a configuration with its defaults
// applied, at once (errors.Join), each naming its variable. The gateway
// checks its own fields again, with its own messages.
func (c *Config) Validate() error {
	var errs []error
	bad := func(path, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", configs.EnvName(path), fmt.Sprintf(format, args...)))
	}
	seen := map[string]string{}
	for _, l := range c.listeners() {
		_, port, err := net.SplitHostPort(l.addr)
		if err != nil {
			bad(l.path, "%q is not host:port", l.addr)
			continue
		}
		if other, dup := seen[l.addr]; dup && port != "0" {
			bad(l.path, "%s is also %s: give each listener its own port", l.addr, configs.EnvName(other))
		}
		seen[l.addr] = l.path
	}
	if c.KeySecret != "" && len(c.KeySecret) < minSecret {
		bad("key_secret", "too short: at least %d bytes (or leave it unset to have one generated)", minSecret)
	}
	if c.RedisClient.Timeout < 0 {
		bad("redis.timeout", "%v is negative: leave it unset for the default, or give a deadline such as 2s", c.RedisClient.Timeout)
	}
	switch c.Redis {
	case RedisAuto, RedisServer, RedisEmbedded:
	default:
		bad("stack_redis", "%q is not auto, server or embedded", c.Redis)
	}
	if c.RulesFile == "" {
		bad("rules_file", "required")
	}
	if c.Regions < 1 || c.Regions > MaxRegions {
		bad("stack_regions", "%d is not within [1, %d]", c.Regions, MaxRegions)
	}
	errs = append(errs, c.Log.Validate("log")...)
	return errors.Join(errs...)
}

// listener is one address the stack listens on, with its YAML path.
type listener struct {
	path, addr string
}

// listeners lists the stack's listeners in start order. The stack starts
// every one: it has no "off".
func (c *Config) listeners() []listener {
	return []listener{
		{"demo_listen", c.DemoListen},
		{"listen", c.Listen},
		{"api_listen", c.APIListen},
		{"metrics_listen", c.MetricsListen},
		{"grpc_listen", c.GRPCListen},
		{"stack_nats_listen", natsHostPort(c.NATSListen)},
		{"stack_kafka_listen", c.KafkaListen},
		{"aggregator_listen", c.AggregatorListen},
		{"aggregator_metrics_listen", c.AggregatorMetricsListen},
	}
}

// PIDFile returns the file beside envFile (stack_env_file) that holds the
// stack's process id while it runs: envFile with its extension replaced
// by .pid (bin/stack.env: bin/stack.pid).
func PIDFile(envFile string) string {
	return strings.TrimSuffix(envFile, filepath.Ext(envFile)) + ".pid"
}

// natsHostPort is stack_nats_listen without its nats:// scheme.
func natsHostPort(s string) string { return strings.TrimPrefix(s, "nats://") }

// Vars lists every variable of the stack with its default and
// documentation, for --help.
func Vars() ([]configs.Var, error) {
	var c Config
	c.SetDefaults()
	vars, err := configs.Vars(&c, nil)
	if err != nil {
		return nil, err
	}
	// The Redis deadline stays zero until the backend is known (the
	// embedded one gets more): show the redis-server's, the library's.
	var rc configs.Redis
	rc.SetDefaults()
	for i := range vars {
		if vars[i].Path == "redis.timeout" {
			vars[i].Default = rc.Timeout.String()
		}
	}
	return vars, nil
}

// LoadConfig reads the configuration from the environment (lookup; nil
// means os.LookupEnv), then applies SetDefaults and Validate.
func LoadConfig(lookup configs.LookupFunc) (Config, error) {
	var c Config
	if err := configs.ApplyEnv(&c, lookup); err != nil {
		return c, err
	}
	c.SetDefaults()
	return c, c.Validate()
}
