package redisstore

import (
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Config says how to reach Redis. Processes fill it from their `redis`
// section (configs.Redis, this type): the yaml and doc tags name and
// document each field there (TOLLGATE_REDIS_* variables, --help), and the
// defaults below are the only statement of them.
type Config struct {
	// Mode is standalone (default), sentinel or cluster.
	Mode string `yaml:"mode" doc:"standalone, sentinel or cluster."`
	// Addrs: the server, the sentinels, or cluster seed nodes (default
	// 127.0.0.1:6379).
	Addrs []string `yaml:"addrs" doc:"Redis server, Sentinel addresses or Cluster seed nodes, comma-separated."`
	// MasterName is the Sentinel master name (default mymaster).
	MasterName string `yaml:"master_name" doc:"Sentinel master name."`
	// Username, Password, PasswordFile: ACL credentials. PasswordFile wins
	// over Password.
	Username     string `yaml:"username" doc:"Redis ACL user name. Empty: none."`
	Password     string `yaml:"password" doc:"Redis password. Prefer password_file. Empty: none."`
	PasswordFile string `yaml:"password_file" doc:"File holding the Redis password (trailing newline ignored); wins over password."`
	// TLS enables TLS, with TLSCAFile as the trusted CA bundle (optional).
	TLS       bool   `yaml:"tls" doc:"true to connect to Redis over TLS."`
	TLSCAFile string `yaml:"tls_ca_file" doc:"PEM bundle of CAs trusted for Redis TLS. Empty: the system's."`
	// DB is the database (standalone and Sentinel).
	DB int `yaml:"db" doc:"Redis database number, standalone and Sentinel."`
	// KeyPrefix starts every counter's key (default tg).
	KeyPrefix string `yaml:"key_prefix" doc:"Prefix of every counter's Redis key."`
	// PoolSize is connections per node (default: the client's, 10 per CPU).
	PoolSize int `yaml:"pool_size" doc:"go-redis connections per Redis node (0: the client's, 10 per CPU); decisions on standalone and Sentinel use the store's own connections."`
	// Timeout is the deadline of one Redis call (default 50ms).
	Timeout time.Duration `yaml:"timeout" doc:"Deadline of one Redis call, holding even when Redis hangs; a call that timed out is answered by the failure mode of its rules, never retried."`
}

// Modes.
const (
	ModeStandalone = "standalone"
	ModeSentinel   = "sentinel"
	ModeCluster    = "cluster"
)

// SetDefaults fills unset fields with their defaults.
func (c *Config) SetDefaults() {
	c.Mode = cmp.Or(c.Mode, ModeStandalone)
	if len(c.Addrs) == 0 {
		c.Addrs = []string{"127.0.0.1:6379"}
	}
	c.MasterName = cmp.Or(c.MasterName, "mymaster")
	c.KeyPrefix = cmp.Or(c.KeyPrefix, "tg")
	c.Timeout = cmp.Or(c.Timeout, 50*time.Millisecond)
}

// Validate reports every problem with the configuration at once.
func (c *Config) Validate() error {
	var errs []error
	switch c.Mode {
	case ModeStandalone, ModeSentinel, ModeCluster:
	default:
		errs = append(errs, fmt.Errorf("redis.mode: %q is not standalone, sentinel or cluster", c.Mode))
	}
	if len(c.Addrs) == 0 {
		errs = append(errs, errors.New("redis.addrs: empty"))
	}
	if c.Mode == ModeStandalone && len(c.Addrs) > 1 {
		errs = append(errs, errors.New("redis.addrs: standalone mode takes one address"))
	}
	if c.Timeout <= 0 {
		errs = append(errs, errors.New("redis.timeout: must be positive"))
	}
	if c.PoolSize < 0 {
		errs = append(errs, errors.New("redis.pool_size: must not be negative"))
	}
	if strings.ContainsAny(c.KeyPrefix, "{}") {
		errs = append(errs, errors.New("redis.key_prefix: must not contain { or }"))
	}
	return errors.Join(errs...)
}

// NewClient builds the go-redis client for cfg with the settings the guard
// needs (go-redis's defaults would hold a call past its deadline and send a script twice): context deadlines honoured, read and write
// timeouts at the call deadline, a short dial timeout, and no automatic
// retries — a script whose reply was lost must never be sent again.
func NewClient(cfg Config) (redis.UniversalClient, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	password := cfg.Password
	if cfg.PasswordFile != "" {
		b, err := os.ReadFile(cfg.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("redis.password_file: %w", err)
		}
		password = strings.TrimRight(string(b), "\r\n")
	}
	var tlsCfg *tls.Config
	if cfg.TLS {
		tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12}
		if cfg.TLSCAFile != "" {
			pem, err := os.ReadFile(cfg.TLSCAFile)
			if err != nil {
				return nil, fmt.Errorf("redis.tls_ca_file: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, errors.New("redis.tls_ca_file: no certificates found")
			}
			tlsCfg.RootCAs = pool
		}
	}
	io := max(cfg.Timeout, 10*time.Millisecond)
	opts := &redis.UniversalOptions{
		Addrs:                 cfg.Addrs,
		DB:                    cfg.DB,
		Username:              cfg.Username,
		Password:              password,
		MasterName:            cfg.MasterName,
		TLSConfig:             tlsCfg,
		PoolSize:              cfg.PoolSize,
		ContextTimeoutEnabled: true,
		MaxRetries:            -1,
		DialTimeout:           max(4*cfg.Timeout, 200*time.Millisecond),
		DialerRetries:         1,
		ReadTimeout:           io,
		WriteTimeout:          io,
		PoolTimeout:           io,
		MaxRedirects:          3,
		DisableIdentity:       true,
	}
	if cfg.Mode != ModeSentinel {
		opts.MasterName = ""
	}
	switch cfg.Mode {
	case ModeCluster:
		opts.IsClusterMode = true
		opts.DB = 0
		return redis.NewClusterClient(opts.Cluster()), nil
	case ModeSentinel:
		return redis.NewFailoverClient(opts.Failover()), nil
	default:
		return redis.NewClient(opts.Simple()), nil
	}
}
