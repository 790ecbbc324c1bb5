package configs

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"time"

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
	if c.Level == "" {
		c.Level = "info"
	}
	if c.Format == "" {
		c.Format = "text"
	}
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
	setIfZero(&c.DecisionsTopic, tollgatev1.TopicDecisions)
	setIfZero(&c.Partitions, 6)
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

func setIfZero[T comparable](p *T, v T) {
	var zero T
	if *p == zero {
		*p = v
	}
}

// DurationOr returns d, or def when d is not positive.
func DurationOr(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}
