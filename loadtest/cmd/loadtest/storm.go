package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/tollgate/tollgate/loadtest"
)

// runStorm is `loadtest storm`: the retry storm against a
// running stack.
func runStorm(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg := loadtest.DefaultStormConfig()
	fs := flag.NewFlagSet("loadtest storm", flag.ContinueOnError)
	setUsage(fs, "Usage: loadtest storm [flags]\n\n"+
		"The retry storm: -clients clients of one tenant, each from its own loopback address,\n"+
		"poll at -factor times the key's -limit and retry every rejection at once, beside a polite client of\n"+
		"the same tenant that waits out Retry-After. It samples the gateway's CPU (-pid), its Redis calls\n"+
		"(-metrics, -redis) and the key's penalty level (-admin) while the aggregator climbs the ladder, and\n"+
		"stops once the key has held the top level for -hold (or after -duration). See loadtest/README.md.\n\nFlags:\n", stderr)
	var redisAddrs string
	out := outputs{name: "loadtest storm", stdout: stdout, stderr: stderr}
	fs.StringVar(&cfg.URL, "url", cfg.URL, "the gateway proxy's base `URL`")
	fs.StringVar(&cfg.Path, "path", cfg.Path, "request path")
	fs.StringVar(&cfg.Key, "key", cfg.Key, "the storm's API key (registered to the same tenant as -polite-key)")
	fs.StringVar(&cfg.PoliteKey, "polite-key", cfg.PoliteKey, "the polite client's API key")
	fs.IntVar(&cfg.Clients, "clients", cfg.Clients, "storm clients, each on its own source address from -source up")
	fs.StringVar(&cfg.Source, "source", cfg.Source, "first storm source `address` (127.0.0.x: Linux routes 127/8 to loopback)")
	fs.Float64Var(&cfg.Limit, "limit", cfg.Limit, "the storm key's limit in requests per second (pro-default: 1000/min)")
	fs.Float64Var(&cfg.Factor, "factor", cfg.Factor, "the clients poll at factor x limit together")
	fs.StringVar(&cfg.PoliteSource, "polite-source", cfg.PoliteSource, "the polite client's source `address`")
	fs.Float64Var(&cfg.PoliteRate, "polite-rate", cfg.PoliteRate, "the polite client's requests per second")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "longest run (at most "+loadtest.MaxDuration.String()+")")
	fs.DurationVar(&cfg.Hold, "hold", cfg.Hold, "stop once the key has been at the top level this long")
	fs.DurationVar(&cfg.Settle, "settle", cfg.Settle, "the first part of the top level not measured as its steady state")
	fs.DurationVar(&cfg.Interval, "interval", cfg.Interval, "sampling interval")
	fs.DurationVar(&cfg.Timeout, "timeout", cfg.Timeout, "timeout of each request")
	fs.IntVar(&cfg.PID, "pid", 0, "`pid` of the gateway process: its CPU per second (Linux /proc)")
	fs.StringVar(&cfg.Metrics, "metrics", cfg.Metrics, "the gateway's /metrics `URL` (Redis calls, levels, closes); empty: none")
	fs.StringVar(&redisAddrs, "redis", "", "comma-separated Redis `host:port`s: EVALSHA per rejection from INFO commandstats")
	fs.StringVar(&cfg.Admin, "admin", cfg.Admin, "the aggregator's operator API `URL` (penalty levels; token $TOLLGATE_ADMIN_TOKEN); empty: none")
	fs.BoolVar(&cfg.Lift, "lift", cfg.Lift, "lift a penalty an earlier run left before the start, and the storm key's at the end")
	fs.BoolVar(&out.json, "json", false, "write the summary as JSON on stdout (the text goes to stderr)")
	fs.BoolVar(&out.quiet, "quiet", false, "no progress lines")
	fs.StringVar(&out.reportFile, "report", "", "also write an HTML page with charts of the run to `file`.html")
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	cfg.AdminToken = os.Getenv("TOLLGATE_ADMIN_TOKEN")
	if cfg.AdminToken == "" {
		if cfg.Lift {
			fmt.Fprintln(stderr, "loadtest storm: $TOLLGATE_ADMIN_TOKEN is not set: penalty levels come from the gateway's metrics, nothing is lifted")
		}
		cfg.Lift = false
	}
	cfg.Redis = splitList(redisAddrs)
	cfg.RedisUsername = os.Getenv("TOLLGATE_REDIS_USERNAME")
	cfg.RedisPassword = os.Getenv("TOLLGATE_REDIS_PASSWORD")
	if err := cfg.Validate(); err != nil {
		return usageError(fs, err, stderr)
	}
	return out.run(func(progress io.Writer) ended {
		sum, err := loadtest.RunStorm(ctx, cfg, progress)
		if err != nil {
			return ended{err: err}
		}
		return ended{sum: sum, stoppedBy: sum.StoppedBy, answered: sum.Storm.Answers}
	})
}
