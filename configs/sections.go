package configs

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/tollgate/tollgate/guard/redisstore"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// The sections below are shared by the gateway and the aggregator: one
// definition, one set of docs and defaults, one variable each
// (TOLLGATE_LOG_LEVEL serves both binaries, as bin/stack.env does).

// Log is the `log` section.
type Log struct {
	Level  string `yaml:"level" doc:"Least level logged: debug, info, warn or error. API keys are never logged."`
	Format string `yaml:"format" doc:"Log format on stderr: text or json."`
}

// SetDefaults fills zero fields: info, text.
func (c *Log) SetDefaults() {
	c.Level = cmp.Or(c.Level, "info")
	c.Format = cmp.Or(c.Format, "text")
}

// Validate checks the section (prefix is its YAML path, "log").
func (c *Log) Validate(prefix string) []error {
	var errs []error
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.Level)); err != nil {
		errs = append(errs, fmt.Errorf("%s.level (%s): %q is not debug, info, warn or error", prefix, EnvName(prefix+".level"), c.Level))
	}
	if c.Format != "text" && c.Format != "json" {
		errs = append(errs, fmt.Errorf("%s.format (%s): %q is not text or json", prefix, EnvName(prefix+".format"), c.Format))
	}
	return errs
}

// NewLogger returns the logger the section describes, writing to w.
func (c *Log) NewLogger(w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(c.Level)) // validated; info otherwise
	opts := &slog.HandlerOptions{Level: level}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// Kafka is the `kafka` section the gateway and the aggregator share (the
// aggregator adds its own topics to it).
type Kafka struct {
	Brokers []string `yaml:"brokers" doc:"Kafka seed brokers, comma-separated. Gateway: where decision events go (empty: no events). Aggregator: required."`

	DecisionsTopic string `yaml:"decisions_topic" doc:"Topic of decision events (tollgate.v1.DecisionEvent, key tenant)."`
	Partitions     int32  `yaml:"partitions" doc:"Partitions of the topics Tollgate creates when they are missing; existing topics keep theirs. Gateways partition decision events by tenant over the decisions topic's actual count."`
}

// SetDefaults fills zero fields: the schemas' topic name, 6 partitions.
func (c *Kafka) SetDefaults() {
	Default(&c.DecisionsTopic, tollgatev1.TopicDecisions)
	Default(&c.Partitions, 6)
}

// Validate checks the section (prefix is its YAML path, "kafka").
func (c *Kafka) Validate(prefix string) []error {
	var errs []error
	if c.Partitions < 1 || c.Partitions > 10_000 {
		errs = append(errs, fmt.Errorf("%s.partitions (%s): %d is not in [1, 10000]", prefix, EnvName(prefix+".partitions"), c.Partitions))
	}
	return errs
}

// NATS is the `nats` section.
type NATS struct {
	URL string `yaml:"url" doc:"NATS server URL (JetStream) for fleet mode: rules, blocklist and overrides in the KV buckets the aggregator's operator API writes; gateways watch them and keep a last-known-good copy under data_dir. Empty: static rules only (rules_file)."`
}

// HostID is the default name of a process: host name and pid.
func HostID(fallback string) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = fallback
	}
	return host + "-" + strconv.Itoa(os.Getpid())
}

// Loopback reports whether a listen address (host:port) binds a loopback
// interface only: 127.0.0.1, ::1 or localhost. A binary refuses to serve
// an unauthenticated endpoint on any other.
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Default sets *p to v when *p is the zero value: the one helper every
// Config's SetDefaults uses.
func Default[T comparable](p *T, v T) {
	var zero T
	if *p == zero {
		*p = v
	}
}

// DefaultPositive sets *p to v when *p is zero or negative: Default for
// the counts, sizes, ratios and durations where only a positive value means
// something.
func DefaultPositive[T ~int | ~int32 | ~int64 | ~float64](p *T, v T) {
	if *p <= 0 {
		*p = v
	}
}

// Redis is the `redis` section: where the counters live. Its fields,
// their docs and defaults are the library's own (redisstore.Config),
// written once there; Client converts.
type Redis redisstore.Config

// Client returns the library's configuration of the section.
func (c Redis) Client() redisstore.Config { return redisstore.Config(c) }

// SetDefaults fills zero fields with redisstore's defaults.
func (c *Redis) SetDefaults() { (*redisstore.Config)(c).SetDefaults() }

// Validate checks the section (prefix is its YAML path, "redis"), each
// problem naming its variable.
func (c *Redis) Validate(prefix string) []error {
	rc := c.Client()
	err := rc.Validate()
	if err == nil {
		return nil
	}
	var out []error
	for _, e := range unjoin(err) {
		msg := e.Error()
		if field, rest, ok := strings.Cut(msg, ": "); ok && strings.HasPrefix(field, "redis.") {
			path := prefix + strings.TrimPrefix(field, "redis")
			msg = fmt.Sprintf("%s (%s): %s", path, EnvName(path), rest)
		}
		out = append(out, errors.New(msg))
	}
	return out
}

func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}
