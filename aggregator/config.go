package aggregator

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/tollgate/tollgate/aggregator/internal/abuse"
	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/keyid"
	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/internal/regions"
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
	ID            string `yaml:"aggregator_id" doc:"This instance's unique name; its Kafka transactional id derives from it. An instance whose id a live member of the consumer group already has refuses to start. Empty: hostname-pid."`
	DataDir       string `yaml:"data_dir" doc:"Directory of this instance's state (Pebble: the materialized changelog and audit log; checkpoints). One per instance."`
	AdminToken    string `yaml:"admin_token" doc:"Bearer token of the operator API and the reports (Authorization: Bearer <token>), at least 16 characters (generate one with: openssl rand -base64 32). Required unless admin_insecure."`
	AdminInsecure bool   `yaml:"admin_insecure" doc:"Run the operator API without admin_token, on a loopback aggregator_listen only (a local experiment): any bearer token is accepted, and a request without an Authorization header is still refused, so that no web page can forge a change. Logged as a warning at start and shown on /readyz."`
	ViewerToken   string `yaml:"viewer_token" doc:"Read-only bearer token of the operator API, the reports and the console (Authorization: Bearer <token>): reads are answered, every change is 403 FORBIDDEN. At least 16 characters, different from admin_token. Empty: no viewer token."`
	KeySecret     string `yaml:"key_secret" doc:"Secret of the keyed hash that turns API keys into key_ids: the same as the gateways'. Required, at least 16 bytes."`
	Region        string `yaml:"region" doc:"Name of the region this aggregator is in, as its gateways' region: the operator API's key state, reset and quota grant read a rule marked regions: global at this region's share of its limit. Without a regions list in the rules, every limit is whole, whatever the name."`

	RegionsPeriod time.Duration `yaml:"regions_period" doc:"When the rules list several regions (and nats.url links them): how often the region reports its demand to the coordinator and the coordinator moves unused units between regions; loans of sliding windows and buckets last until the end of the period after the one they were made in, and a region that hears no coordinator for 3 periods (plus 2 per region before it in the list) starts one. Every region must use the same value. At least 4 times the clock skew bound (100ms)."`

	RulesFile string `yaml:"rules_file" doc:"Rules file that seeds the tollgate_rules KV bucket when it is empty (fleet mode, nats.url set), so one file starts both modes; afterwards the operator API owns the rules. Empty or missing: no seeding."`

	Kafka KafkaConfig   `yaml:"kafka"`
	Redis configs.Redis `yaml:"redis"`
	NATS  configs.NATS  `yaml:"nats"`

	ConsumerGroup      string        `yaml:"aggregator_group" doc:"Kafka consumer group of the aggregator instances."`
	SessionTimeout     time.Duration `yaml:"aggregator_session_timeout" doc:"How long the group waits for a silent instance before its partitions move to the others."`
	TransactionTimeout time.Duration `yaml:"aggregator_transaction_timeout" doc:"Kafka transaction timeout: how long a dead instance's open transaction can stall read_committed readers. /readyz fails when polled events wait twice this long for their commit."`
	CommitInterval     time.Duration `yaml:"aggregator_commit_interval" doc:"Longest time one Kafka transaction folds in a backlog before it commits: a row many events touch is written once per transaction. Longer: less CPU per event under load, later report rows. A lull commits at once."`

	Usage   UsageConfig   `yaml:"usage"`
	Audit   AuditConfig   `yaml:"audit"`
	Penalty PenaltyConfig `yaml:"penalty"`

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
	configs.Default(&c.UsageTopic, tollgatev1.TopicUsage)
	configs.Default(&c.PenaltiesTopic, tollgatev1.TopicPenalties)
	configs.Default(&c.AuditTopic, tollgatev1.TopicAudit)
	configs.Default(&c.ChangelogTopic, tollgatev1.TopicChangelog)
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

// PenaltyConfig is the `penalty` section: the abuse detectors and the
// penalty ladder (docs/aggregator.md).
type PenaltyConfig struct {
	Mode                 string        `yaml:"mode" doc:"on: detect abuse and move keys up the penalty ladder; off: detect nothing (penalties in force still step down, and can be lifted)."`
	Detectors            []string      `yaml:"detectors" doc:"Detectors enabled, comma-separated: backoff_ignored (requests while a Retry-After sent to the key runs), sustained_rejection (rejection ratio), volume_ceiling (requests per second)."`
	Window               time.Duration `yaml:"window" doc:"Window of event time every detector measures over (sliding, in 6 steps)."`
	BackoffMinIgnored    int64         `yaml:"backoff_min_ignored" doc:"backoff_ignored fires with at least this many requests in the window that arrived while a Retry-After sent to the key was running..."`
	BackoffMinShare      float64       `yaml:"backoff_min_share" doc:"...making at least this share of the key's requests in the window."`
	RejectionMinRequests int64         `yaml:"rejection_min_requests" doc:"sustained_rejection fires with at least this many requests in the window..."`
	RejectionRatio       float64       `yaml:"rejection_ratio" doc:"...of which at least this share was rejected (429 or 403)."`
	VolumeCeiling        float64       `yaml:"volume_ceiling" doc:"volume_ceiling fires when one key sends more than this many requests per second over the window."`
	Factor               float64       `yaml:"factor" doc:"Level 1 (reduced limit): the factor applied to the key's key-scope limits."`
	ReducedFor           time.Duration `yaml:"reduced_for" doc:"How long level 1 (reduced limit) is enforced."`
	CooldownFor          time.Duration `yaml:"cooldown_for" doc:"How long level 2 (cooldown: every request 429 PENALTY, Retry-After the remaining cooldown) is enforced."`
	BlockFor             time.Duration `yaml:"block_for" doc:"How long level 3 (blocklist: every request 403, connection closed) is enforced."`
	QuietPeriod          time.Duration `yaml:"quiet_period" doc:"A penalised key no detector fired on for this long steps down one level (enforcing the lower level for at most what remained of the higher one)."`
	Grace                time.Duration `yaml:"grace" doc:"After a step, the key's decisions up to this long after its newest one do not count towards the next (the time gateways take to learn of the step)."`
}

// Penalty modes.
const (
	PenaltyOn  = "on"
	PenaltyOff = "off"
)

// abuse returns the detectors' and ladder's configuration.
func (c *PenaltyConfig) abuse() abuse.Config {
	return abuse.Config{Off: c.Mode == PenaltyOff, Detectors: c.Detectors, Window: c.Window,
		BackoffMinIgnored: c.BackoffMinIgnored, BackoffMinShare: c.BackoffMinShare,
		RejectionMinRequests: c.RejectionMinRequests, RejectionRatio: c.RejectionRatio, VolumeCeiling: c.VolumeCeiling,
		Factor: c.Factor, ReducedFor: c.ReducedFor, CooldownFor: c.CooldownFor, BlockFor: c.BlockFor,
		QuietPeriod: c.QuietPeriod, Grace: c.Grace}
}

// SetDefaults fills zero fields with package abuse's defaults.
func (c *PenaltyConfig) SetDefaults() {
	configs.Default(&c.Mode, PenaltyOn)
	a := c.abuse()
	a.SetDefaults()
	if c.Detectors == nil {
		c.Detectors = a.Detectors
	}
	configs.Default(&c.Window, a.Window)
	configs.Default(&c.BackoffMinIgnored, a.BackoffMinIgnored)
	configs.Default(&c.BackoffMinShare, a.BackoffMinShare)
	configs.Default(&c.RejectionMinRequests, a.RejectionMinRequests)
	configs.Default(&c.RejectionRatio, a.RejectionRatio)
	configs.Default(&c.VolumeCeiling, a.VolumeCeiling)
	configs.Default(&c.Factor, a.Factor)
	configs.Default(&c.ReducedFor, a.ReducedFor)
	configs.Default(&c.CooldownFor, a.CooldownFor)
	configs.Default(&c.BlockFor, a.BlockFor)
	configs.Default(&c.QuietPeriod, a.QuietPeriod)
	configs.Default(&c.Grace, a.Grace)
}

// Validate reports the section's problems, each naming its field.
func (c *PenaltyConfig) Validate(prefix string) []error {
	var errs []error
	if c.Mode != PenaltyOn && c.Mode != PenaltyOff {
		errs = append(errs, fmt.Errorf("%s.mode (%s): %q is not on or off", prefix, configs.EnvName(prefix+".mode"), c.Mode))
	}
	a := c.abuse()
	for _, err := range a.Validate() {
		var fe *abuse.FieldError
		if errors.As(err, &fe) {
			path := prefix + "." + fe.Field
			err = fmt.Errorf("%s (%s): %s", path, configs.EnvName(path), fe.Msg)
		}
		errs = append(errs, err)
	}
	for name, v := range map[string]float64{"backoff_min_ignored": float64(c.BackoffMinIgnored), "backoff_min_share": c.BackoffMinShare,
		"rejection_min_requests": float64(c.RejectionMinRequests), "rejection_ratio": c.RejectionRatio, "volume_ceiling": c.VolumeCeiling,
		"factor": c.Factor} {
		if v < 0 {
			errs = append(errs, fmt.Errorf("%s.%s (%s): negative", prefix, name, configs.EnvName(prefix+"."+name)))
		}
	}
	return errs
}

// Defaults.
const (
	DefaultListen        = "127.0.0.1:8081"
	DefaultMetricsListen = "127.0.0.1:9093"
	DefaultDataDir       = "tollgate-data"
)

// MinAdminTokenLen is the shortest admin_token accepted, in characters.
const MinAdminTokenLen = 16

// Off, as aggregator_metrics_listen, disables the metrics listener.
const Off = "off"

// SetDefaults fills zero fields.
func (c *Config) SetDefaults() {
	configs.Default(&c.Listen, DefaultListen)
	configs.Default(&c.MetricsListen, DefaultMetricsListen)
	if c.ID == "" {
		c.ID = configs.HostID("aggregator")
	}
	configs.Default(&c.DataDir, DefaultDataDir)
	configs.Default(&c.Region, guard.DefaultRegion)
	configs.Default(&c.RegionsPeriod, time.Duration(regions.DefaultPeriod)*time.Microsecond)
	c.Kafka.SetDefaults()
	c.Redis.SetDefaults()
	configs.Default(&c.ConsumerGroup, "tollgate-aggregator")
	configs.Default(&c.SessionTimeout, 10*time.Second)
	configs.Default(&c.TransactionTimeout, 10*time.Second)
	configs.Default(&c.CommitInterval, 500*time.Millisecond)
	configs.Default(&c.Usage.Lateness, 10*time.Second)
	configs.Default(&c.Usage.RetentionMinute, 48*time.Hour)
	configs.Default(&c.Usage.RetentionHour, 90*24*time.Hour)
	configs.Default(&c.Usage.RetentionDay, 2*365*24*time.Hour)
	configs.Default(&c.Usage.MaxRows, 10_000)
	configs.Default(&c.Audit.SnapshotInterval, time.Hour)
	configs.Default(&c.Audit.SnapshotKeep, 24)
	c.Penalty.SetDefaults()
	configs.Default(&c.ShutdownTimeout, 10*time.Second)
	c.Log.SetDefaults()
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
	if err := rules.CheckRegionName(c.Region); err != nil {
		bad("region", "%v", err)
	}
	if err := (regions.Config{Period: c.RegionsPeriod.Microseconds()}).WithDefaults().Validate(); err != nil || c.RegionsPeriod <= 0 {
		bad("regions_period", "%v is not a valid period: at least %v", c.RegionsPeriod, 4*time.Duration(regions.DefaultSkew)*time.Microsecond+time.Microsecond)
	}
	if len(c.Kafka.Brokers) == 0 {
		bad("kafka.brokers", "required: the aggregator consumes decision events")
	}
	_, _, listenErr := net.SplitHostPort(c.Listen)
	if listenErr != nil {
		bad("aggregator_listen", "%q is not host:port", c.Listen)
	}
	switch {
	case c.AdminToken != "" && c.AdminInsecure:
		bad("admin_insecure", "contradicts admin_token (%s): unset one of them", configs.EnvName("admin_token"))
	case strings.ContainsFunc(c.AdminToken, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }):
		bad("admin_token", "must not hold spaces or control characters (it travels in an HTTP header)")
	case c.AdminToken != "" && utf8.RuneCountInString(c.AdminToken) < MinAdminTokenLen:
		bad("admin_token", "at least %d characters: it guards changes of the fleet's rules, lists and quotas (generate one with: openssl rand -base64 32)", MinAdminTokenLen)
	case c.AdminToken == "" && !c.AdminInsecure:
		bad("admin_token", "required: the operator API changes the fleet's rules, lists and quotas (generate one with: openssl rand -base64 32); "+
			"to run a local experiment without one, set %s=true", configs.EnvName("admin_insecure"))
	case c.AdminToken == "" && listenErr == nil && !configs.Loopback(c.Listen):
		bad("admin_token", "required when aggregator_listen (%s) is not a loopback address, even with %s", c.Listen, configs.EnvName("admin_insecure"))
	}
	switch {
	case c.ViewerToken == "":
	case strings.ContainsFunc(c.ViewerToken, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }):
		bad("viewer_token", "must not hold spaces or control characters (it travels in an HTTP header)")
	case utf8.RuneCountInString(c.ViewerToken) < MinAdminTokenLen:
		bad("viewer_token", "at least %d characters (generate one with: openssl rand -base64 32)", MinAdminTokenLen)
	case c.ViewerToken == c.AdminToken:
		bad("viewer_token", "must differ from admin_token (%s): the viewer token may not change anything", configs.EnvName("admin_token"))
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
	errs = append(errs, c.Penalty.Validate("penalty")...)
	errs = append(errs, c.Kafka.Validate("kafka")...)
	errs = append(errs, c.Redis.Validate("redis")...)
	errs = append(errs, c.Log.Validate("log")...)
	return errors.Join(errs...)
}

// Vars lists every configuration variable with its default and docs.
func Vars() ([]configs.Var, error) {
	return configs.DefaultVars(func(c *Config) { c.ID = "" })
}

// LoadConfig loads a configuration the way bin/aggregator does: the YAML
// file at path (none when empty), the TOLLGATE_* environment (lookup; nil
// means os.LookupEnv), SetDefaults and Validate.
func LoadConfig(path string, lookup configs.LookupFunc) (Config, error) {
	return configs.LoadChecked[Config](path, lookup)
}
