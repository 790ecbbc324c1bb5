package chaos

import (
	"errors"
	"fmt"
	"io"
	"time"
)

// Config is a soak's configuration; DefaultConfig fills it.
type Config struct {
	// Seed draws the fault schedule, the load's choices and the
	// operator's changes: the same seed replays the same schedule.
	Seed uint64
	// Duration is the fault phase (start-up, heal and settling come on
	// top, bounded by Startup, Heal and Settle).
	Duration time.Duration
	// Faults is the number of faults; 0: one every 6 s on average.
	Faults int
	// Kinds are the fault kinds drawn from (default: every kind).
	Kinds []string
	// Rate is the load in requests per second, polite clients aside.
	Rate float64
	// Gateways and Aggregators size the fleet (at least 3 and 2).
	Gateways, Aggregators int
	// RedisMode is "sentinel" (a primary, a replica, three sentinels) or
	// "cluster" (three shards of a primary and a replica).
	RedisMode string
	// BinDir holds the gateway and aggregator binaries.
	BinDir string
	// Self is an executable that runs the ChildCommand subcommand (the
	// broker and NATS), normally bin/loadtest itself.
	Self string
	// WorkDir holds the fleet's data and logs; empty: a new temporary
	// directory, removed after a run whose invariants all held unless
	// Keep is set.
	WorkDir string
	Keep    bool
	// Startup bounds the start-up, Heal each of the heal and settling
	// waits; Settle is how long the load runs after the heal.
	Startup, Heal, Settle time.Duration
	// ClientDeadline is each request's deadline.
	ClientDeadline time.Duration
	// Log receives progress lines (faults as they happen, rates);
	// nil: none.
	Log io.Writer
}

// Defaults.
const (
	DefaultDuration       = 2 * time.Minute
	DefaultRate           = 150
	DefaultStartup        = 3 * time.Minute
	DefaultHeal           = 90 * time.Second
	DefaultSettle         = 10 * time.Second
	DefaultClientDeadline = time.Second
	// MaxDuration bounds the fault phase.
	MaxDuration = 24 * time.Hour
)

// DefaultConfig returns the defaults: a 2-minute fault phase of every
// kind at 150 requests/s, 3 gateways, 2 aggregators, Redis Sentinel.
func DefaultConfig() Config {
	return Config{Duration: DefaultDuration, Kinds: append([]string(nil), Kinds...), Rate: DefaultRate,
		Gateways: 3, Aggregators: 2, RedisMode: "sentinel", BinDir: "bin",
		Startup: DefaultStartup, Heal: DefaultHeal, Settle: DefaultSettle, ClientDeadline: DefaultClientDeadline}
}

// Validate reports every problem with c at once.
func (c *Config) Validate() error {
	var errs []error
	if c.Duration < 5*time.Second || c.Duration > MaxDuration {
		errs = append(errs, fmt.Errorf("chaos: -duration %v: want 5s to %v", c.Duration, MaxDuration))
	}
	if c.Faults < 0 {
		errs = append(errs, fmt.Errorf("chaos: -faults %d: want 0 (one per 6 s) or more", c.Faults))
	}
	if len(c.Kinds) == 0 {
		errs = append(errs, errors.New("chaos: no fault kind"))
	}
	if !(c.Rate >= 1 && c.Rate <= 5000) {
		errs = append(errs, fmt.Errorf("chaos: -rate %g: want 1 to 5000 requests/s", c.Rate))
	}
	if c.Gateways < 3 || c.Gateways > 9 {
		errs = append(errs, fmt.Errorf("chaos: -gateways %d: want 3 to 9", c.Gateways))
	}
	if c.Aggregators < 2 || c.Aggregators > 5 {
		errs = append(errs, fmt.Errorf("chaos: -aggregators %d: want 2 to 5", c.Aggregators))
	}
	if c.RedisMode != "sentinel" && c.RedisMode != "cluster" {
		errs = append(errs, fmt.Errorf("chaos: -redis %q: sentinel or cluster", c.RedisMode))
	}
	if c.Startup <= 0 || c.Heal <= 0 || c.Settle <= 0 || c.ClientDeadline <= 0 {
		errs = append(errs, errors.New("chaos: the startup, heal, settle and deadline bounds must be positive"))
	}
	return errors.Join(errs...)
}
