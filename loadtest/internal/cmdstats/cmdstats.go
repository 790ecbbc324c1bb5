// Package cmdstats samples what Redis executes, from INFO commandstats, so a
// load test can report Redis commands per decision.
//
// The counts are server-wide: every client's commands are included, so the
// Redis must serve nothing but the system under test during a run. INFO
// itself is excluded from [Stats.Total], which makes the sampling invisible.
package cmdstats

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// ErrFormat is returned, wrapped, when INFO commandstats cannot be parsed.
var ErrFormat = errors.New("cmdstats: unexpected INFO commandstats format")

// Stats maps a command name, lower case as Redis reports it (subcommands as
// "client|setinfo"), to its number of calls.
type Stats map[string]int64

// Parse reads the output of INFO commandstats: lines such as
//
//	cmdstat_evalsha:calls=12,usec=80,usec_per_call=6.67,rejected_calls=0,failed_calls=0
//
// Section headers, blank lines and other INFO lines are ignored.
func Parse(info string) (Stats, error) {
	st := Stats{}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		rest, ok := strings.CutPrefix(line, "cmdstat_")
		if !ok {
			continue
		}
		name, fields, ok := strings.Cut(rest, ":")
		if !ok || name == "" {
			return nil, fmt.Errorf("%w: %q", ErrFormat, line)
		}
		calls := int64(-1)
		for f := range strings.SplitSeq(fields, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return nil, fmt.Errorf("%w: %q: %v", ErrFormat, line, err)
				}
				calls = n
			}
		}
		if calls < 0 {
			return nil, fmt.Errorf("%w: no calls in %q", ErrFormat, line)
		}
		st[strings.ToLower(name)] += calls
	}
	return st, sc.Err()
}

// Sub returns the calls made between before and s, leaving out commands
// that did not run. A count that went down (CONFIG RESETSTAT, a restart)
// is taken as starting from zero.
func (s Stats) Sub(before Stats) Stats {
	out := Stats{}
	for name, n := range s {
		d := n - before[name]
		if d < 0 {
			d = n
		}
		if d > 0 {
			out[name] = d
		}
	}
	return out
}

// Total returns the calls of every command except INFO.
func (s Stats) Total() int64 {
	var n int64
	for name, c := range s {
		if name != "info" {
			n += c
		}
	}
	return n
}

// EvalSHA returns the calls of EVALSHA and EVALSHA_RO.
func (s Stats) EvalSHA() int64 { return s["evalsha"] + s["evalsha_ro"] }

// sampleTimeout bounds one INFO call.
const sampleTimeout = 5 * time.Second

// Sampler reads INFO commandstats from one or more Redis servers, such as
// every primary of a cluster, and sums them. Each server is asked over one
// connection kept open between samples, so that connecting adds no commands
// to a measurement. It is not safe for concurrent use.
type Sampler struct {
	addrs   []string
	clients []*redis.Client
}

// Credentials authenticate a Sampler; the zero value means none.
type Credentials struct {
	Username string
	Password string
}

// NewSampler returns a Sampler for addrs (host:port); an address listed
// twice is sampled once. It does not connect until the first Sample.
func NewSampler(addrs []string, cred Credentials) *Sampler {
	s := &Sampler{}
	for _, a := range addrs {
		if slices.Contains(s.addrs, a) {
			continue
		}
		s.addrs = append(s.addrs, a)
		s.clients = append(s.clients, redis.NewClient(&redis.Options{
			Addr:                     a,
			Username:                 cred.Username,
			Password:                 cred.Password,
			Protocol:                 2,
			PoolSize:                 1,
			DialTimeout:              sampleTimeout,
			ReadTimeout:              sampleTimeout,
			WriteTimeout:             sampleTimeout,
			ContextTimeoutEnabled:    true,
			MaxRetries:               -1,
			DisableIdentity:          true,
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		}))
	}
	return s
}

// Addrs returns the addresses sampled.
func (s *Sampler) Addrs() []string { return s.addrs }

// Sample returns the command counts summed over every server.
func (s *Sampler) Sample(ctx context.Context) (Stats, error) {
	sum := Stats{}
	for i, c := range s.clients {
		cctx, cancel := context.WithTimeout(ctx, sampleTimeout)
		info, err := c.Info(cctx, "commandstats").Result()
		cancel()
		if err != nil {
			return nil, fmt.Errorf("cmdstats: info commandstats from %s: %w", s.addrs[i], err)
		}
		st, err := Parse(info)
		if err != nil {
			return nil, fmt.Errorf("cmdstats: %s: %w", s.addrs[i], err)
		}
		for name, n := range st {
			sum[name] += n
		}
	}
	return sum, nil
}

// Close closes every connection.
func (s *Sampler) Close() error {
	var errs []error
	for _, c := range s.clients {
		if err := c.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
