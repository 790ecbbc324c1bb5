// Command aggregator runs a Tollgate aggregator instance: the exactly-once
// consumer of the decision stream, the usage reports, and (with the
// control plane) the operator API. It is configured by an
// optional YAML file (--config) and the TOLLGATE_* environment variables,
// listed by --help.
//
// Exit codes: 0 after a clean shutdown (SIGINT or SIGTERM), 1 when the
// aggregator failed to start or stopped on an error, 2 for bad flags or
// configuration.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/aggregator"
	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/guard/redisstore"
)

func main() {
	configs.Main("aggregator", run)
}

const usageHead = `Usage: aggregator [--config FILE]

Runs a Tollgate aggregator instance. Configuration comes from the YAML file
given with --config (optional), then from the environment: every field is
overridden by TOLLGATE_ + its path in upper snake case. TOLLGATE_KAFKA_BROKERS
and TOLLGATE_KEY_SECRET are required. For example, joining the local stack
(make run writes bin/stack.env):

  set -a; . bin/stack.env; set +a
  TOLLGATE_AGGREGATOR_ID=agg-2 TOLLGATE_DATA_DIR=/tmp/tollgate-agg2 \
  TOLLGATE_AGGREGATOR_LISTEN=127.0.0.1:18081 TOLLGATE_AGGREGATOR_METRICS_LISTEN=127.0.0.1:19093 bin/aggregator

Flags:
  --config FILE      YAML configuration file (unknown fields are refused)
  --help             print this help and exit

Subcommands:
  audit --snapshot DIR [filters]   read an audit snapshot offline (audit --help)

Environment variables:
`

func run(ctx context.Context, args []string, lookup configs.LookupFunc, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "audit" {
		return runAudit(args[1:], lookup, stdout, stderr)
	}
	fs := flag.NewFlagSet("aggregator", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	configPath := fs.String("config", "", "")
	if status, ok := configs.ParseArgs(fs, args, stderr, "aggregator", "aggregator", func() int { return help(stdout, stderr) }); !ok {
		return status
	}
	cfg, err := aggregator.LoadConfig(*configPath, lookup)
	if err != nil {
		fmt.Fprintf(stderr, "aggregator: %v\n", err)
		return 2
	}
	log := cfg.Log.NewLogger(stderr)
	// go-redis logs every failed dial through its own process-wide logger:
	// route it into ours at debug level (/readyz and one log line per
	// outage say that Redis is down).
	redis.SetLogger(redisstore.SlogLogger{Log: log})
	srv, err := aggregator.New(cfg, log)
	if err != nil {
		log.Error("aggregator did not start", "error", err.Error())
		return 1
	}
	if err := srv.Run(ctx); err != nil {
		return 1
	}
	return 0
}

func help(stdout, stderr io.Writer) int {
	return configs.WriteUsage(stdout, stderr, "aggregator", usageHead, aggregator.Vars)
}
