package aggregator

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/guard/keyid"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// Config is the aggregator's configuration. Every field can be set in the
// YAML file given with --config and overridden by TOLLGATE_ + its YAML
// path in upper snake case (package configs); the doc tags are what --help
// prints. Names specific to the aggregator start with aggregator_ so one
// environment (bin/stack.env) serves the gateway and the aggregator alike.
type Config struct {
	Listen        string `yaml:"aggregator_listen" doc:"Address of the operator API and the usage reports (bearer admin_token). Loopback by default; a non-loopback address needs admin_token."`
	MetricsListen string `yaml:"aggregator_metrics_listen" doc:"Address of GET /metrics, /healthz and /readyz (no token); off disables it."`
	ID            string `yaml:"aggregator_id" doc:"This instance's unique name; its Kafka transactional id derives from it. Empty: hostname-pid."`
	DataDir       string `yaml:"data_dir" doc:"Directory of this instance's state (Pebble: the materialized changelog and audit log; checkpoints). One per instance."`
	AdminToken    string `yaml:"admin_token" doc:"Bearer token of the operator API and the reports (Authorization: Bearer <token>). Required on a non-loopback aggregator_listen."`
	KeySecret     string `yaml:"key_secret" doc:"Secret of the keyed hash that turns API keys into key_ids: the same as the gateways'. Required, at least 16 bytes."`

	RulesFile string `yaml:"rules_file" doc:"Rules file that seeds the tollgate_rules KV bucket when it is empty (fleet mode, nats.url set), so one file starts both modes; afterwards the operator API owns the rules. Empty or missing: no seeding."`

	Kafka KafkaConfig   `yaml:"kafka"`
	Redis configs.Redis `yaml:"redis"`
	NATS  configs.NATS  `yaml:"nats"`

	ConsumerGroup      string        `yaml:"aggregator_group" doc:"Kafka consumer group of the aggregator instances."`
	SessionTimeout     time.Duration `yaml:"aggregator_session_timeout" doc:"How long the group waits for a silent instance before its partitions move to the others."`
	TransactionTimeout time.Duration `yaml:"aggregator_transaction_timeout" doc:"Kafka transaction timeout: how long a dead instance's open transaction can stall read_committed readers."`
	CommitInterval     time.Duration `yaml:"aggregator_commit_interval" doc:"Longest time one Kafka transaction folds in a backlog before it commits: a row many events touch is written once per transaction. Longer: less CPU per event under load, later report rows. A lull commits at once."`

	Usage UsageConfig `yaml:"usage"`
	Audit AuditConfig `yaml:"audit"`

	ShutdownTimeout time.Duration `yaml:"aggregator_shutdown_timeout" doc:"How long a shutdown waits for in-flight HTTP requests."`

	Log configs.Log `yaml:"log"`
}

// KafkaConfig is the `kafka` section: the shared one and the topics only
// the aggregator uses.
type KafkaConfig struct {
	configs.Kafka `yaml:",inline"`

	UsageTopic     string `yaml:"usage_topic" doc:"Topic of closed usage windows (tollgate.v1.UsageRollup), for analytics consumers."`
	PenaltiesTopic string `yaml:"penalties_topic" doc:"Topic of penalty steps (tollgate.v1.PenaltyEvent)."`
	AuditTopic     string `yaml:"audit_topic" doc:"Retained topic of audit entries (tollgate.v1.AuditEntry)."`
	ChangelogTopic string `yaml:"changelog_topic" doc:"The aggregator's compacted changelog topic (its state), co-partitioned with the decisions topic."`
}

// SetDefaults fills zero fields with the schemas' topic names.
func (c *KafkaConfig) SetDefaults() {
	c.Kafka.SetDefaults()
	set(&c.UsageTopic, tollgatev1.TopicUsage)
	set(&c.PenaltiesTopic, tollgatev1.TopicPenalties)
	set(&c.AuditTopic, tollgatev1.TopicAudit)
	set(&c.ChangelogTopic, tollgatev1.TopicChangelog)
}

// UsageConfig is the `usage` section: windows and reports.
type UsageConfig struct {
	Lateness        time.Duration `yaml:"lateness" doc:"How long after its end a window waits for late events before it is published to the usage topic. Later events still count (the window is republished)."`
	RetentionMinute time.Duration `yaml:"retention_minute" doc:"How long minute rows are kept after their window ends."`
	RetentionHour   time.Duration `yaml:"retention_hour" doc:"How long hour rows are kept."`
	RetentionDay    time.Duration `yaml:"retention_day" doc:"How long day rows are kept."`
	MaxRows         int           `yaml:"max_rows" doc:"Most rows in one report answer; longer answers carry next_cursor."`
}

// AuditConfig is the `audit` section: snapshots of the state.
type AuditConfig struct {
	SnapshotInterval time.Duration `yaml:"snapshot_interval" doc:"How often a consistent snapshot (Pebble checkpoint) of the state — audit log and usage rows — is written under data_dir/snapshots; 0 disables them. Read one offline with: aggregator audit --snapshot DIR."`
	SnapshotKeep     int           `yaml:"snapshot_keep" doc:"How many snapshots are kept; older ones are deleted."`
}

// Defaults.
const (
	DefaultListen        = "127.0.0.1:8081"
	DefaultMetricsListen = "127.0.0.1:9093"
	DefaultDataDir       = "tollgate-data"
)

// Off, as aggregator_metrics_listen, disables the metrics listener.
const Off = "off"

// SetDefaults fills zero fields.
func (c *Config) SetDefaults() {
	set(&c.Listen, DefaultListen)
	set(&c.MetricsListen, DefaultMetricsListen)
	if c.ID == "" {
		c.ID = configs.HostID("aggregator")
	}
	set(&c.DataDir, DefaultDataDir)
	c.Kafka.SetDefaults()
	c.Redis.SetDefaults()
	set(&c.ConsumerGroup, "tollgate-aggregator")
	set(&c.SessionTimeout, 10*time.Second)
	set(&c.TransactionTimeout, 10*time.Second)
	set(&c.CommitInterval, 500*time.Millisecond)
	set(&c.Usage.Lateness, 10*time.Second)
	set(&c.Usage.RetentionMinute, 48*time.Hour)
	set(&c.Usage.RetentionHour, 90*24*time.Hour)
	set(&c.Usage.RetentionDay, 2*365*24*time.Hour)
	set(&c.Usage.MaxRows, 10_000)
	set(&c.Audit.SnapshotInterval, time.Hour)
	set(&c.Audit.SnapshotKeep, 24)
	set(&c.ShutdownTimeout, 10*time.Second)
	c.Log.SetDefaults()
}

func set[T comparable](p *T, v T) {
	var zero T
	if *p == zero {
		*p = v
	}
}

// Validate reports every problem at once, each naming the field and its
// variable.
func (c *Config) Validate() error {
	var errs []error
	bad := func(path, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s (%s): %s", path, configs.EnvName(path), fmt.Sprintf(format, args...)))
	}
	if len(c.KeySecret) < keyid.MinSecretLen {
		bad("key_secret", "required, at least %d bytes (generate one with: openssl rand -base64 32)", keyid.MinSecretLen)
	}
	if len(c.Kafka.Brokers) == 0 {
		bad("kafka.brokers", "required: the aggregator consumes decision events")
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		bad("aggregator_listen", "%q is not host:port", c.Listen)
	} else if c.AdminToken == "" && !loopback(c.Listen) {
		bad("admin_token", "required when aggregator_listen (%s) is not a loopback address", c.Listen)
	}
	if c.MetricsListen != Off {
		if _, _, err := net.SplitHostPort(c.MetricsListen); err != nil {
			bad("aggregator_metrics_listen", "%q is not host:port or off", c.MetricsListen)
		}
	}
	if c.DataDir == "" {
		bad("data_dir", "required")
	}
	if c.Audit.SnapshotKeep < 1 {
		bad("audit.snapshot_keep", "at least 1")
	}
	if c.Usage.MaxRows < 1 {
		bad("usage.max_rows", "at least 1")
	}
	errs = append(errs, c.Kafka.Validate("kafka")...)
	errs = append(errs, c.Redis.Validate("redis")...)
	errs = append(errs, c.Log.Validate("log")...)
	return errors.Join(errs...)
}

func loopback(addr string) bool {
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

// Vars lists every configuration variable with its default and docs.
func Vars() ([]configs.Var, error) {
	var c Config
	c.SetDefaults()
	c.ID = ""
	return configs.Vars(&c, nil)
}

// LoadConfig loads a configuration the way bin/aggregator does: the YAML
// file at path (none when empty), the TOLLGATE_* environment (lookup; nil
// means os.LookupEnv), SetDefaults and Validate.
func LoadConfig(path string, lookup configs.LookupFunc) (Config, error) {
	var c Config
	if err := configs.Load(&c, path, lookup); err != nil {
		return c, err
	}
	c.SetDefaults()
	return c, c.Validate()
}
