// Command gateway runs a Tollgate gateway: the rate-limiting reverse proxy,
// the check API, Envoy's rate-limit service and the metrics endpoints
// (docs/gateway.md). It is configured by an optional YAML file (--config) and the
// TOLLGATE_* environment variables, listed by --help.
//
// Exit codes: 0 after a clean shutdown (SIGINT or SIGTERM), 1 when the
// gateway failed to start or stopped on an error, 2 for bad flags or
// configuration.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"runtime/debug"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/gateway"
	"github.com/tollgate/tollgate/guard/redisstore"
)

func main() {
	configs.Main("gateway", run)
}

const usageHead = `Usage: bin/gateway [--config FILE]

Runs a Tollgate gateway. Configuration comes from the YAML file given with
--config (optional), then from the environment: every field is overridden by
TOLLGATE_ + its path in upper snake case. Only TOLLGATE_KEY_SECRET is
required (at least 16 bytes); set TOLLGATE_UPSTREAM to start the proxy. For
example, from the repository root after make build, with a redis-server on
6379 and an upstream on 9000 (python3 -m http.server 9000 will do):

  TOLLGATE_REDIS_ADDRS=127.0.0.1:6379 TOLLGATE_RULES_FILE=configs/rules.yaml \
  TOLLGATE_KEY_SECRET=$(openssl rand -base64 32) \
  TOLLGATE_UPSTREAM=http://127.0.0.1:9000 bin/gateway

Flags:
  --config FILE      YAML configuration file (unknown fields are refused)
  --example-config   print the documented example configuration and exit
  --help             print this help and exit

Environment variables:
`

func run(ctx context.Context, args []string, lookup configs.LookupFunc, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	configPath := fs.String("config", "", "")
	example := fs.Bool("example-config", false, "")
	if status, ok := configs.ParseArgs(fs, args, stderr, "gateway", "bin/gateway", func() int { return help(stdout, stderr) }); !ok {
		return status
	}
	if *example {
		_, _ = stdout.Write(configs.GatewayYAML())
		return 0
	}

	cfg, err := gateway.LoadConfig(*configPath, lookup)
	if err != nil {
		fmt.Fprintf(stderr, "gateway: %v\n", err)
		return 2
	}
	log := cfg.Log.NewLogger(stderr)
	applyRuntime(cfg.Runtime, lookup)
	// go-redis logs every failed dial through its own process-wide logger:
	// route it into ours at debug level (the gateway logs the outage once
	// and counts the errors in tollgate_redis_errors_total).
	redis.SetLogger(redisstore.SlogLogger{Log: log})

	srv, err := gateway.New(cfg, log)
	if err != nil {
		// One line per problem (every busy listener, every invalid
		// setting), each readable on its own.
		for line := range strings.SplitSeq(err.Error(), "\n") {
			if line = strings.TrimPrefix(line, "gateway: "); line != "" {
				log.Error("gateway did not start", "error", line)
			}
		}
		return 1
	}
	if err := srv.Run(ctx); err != nil {
		return 1
	}
	return 0
}

// applyRuntime sets the garbage collector from the runtime section,
// unless GOGC or GOMEMLIMIT say otherwise (the runtime read them at start).
func applyRuntime(rc gateway.RuntimeConfig, lookup configs.LookupFunc) {
	if _, ok := lookup("GOGC"); !ok {
		debug.SetGCPercent(rc.GCPercent)
	}
	if _, ok := lookup("GOMEMLIMIT"); !ok {
		debug.SetMemoryLimit(int64(rc.MemoryLimitMB) << 20)
	}
}

func help(stdout, stderr io.Writer) int {
	return configs.WriteUsage(stdout, stderr, "gateway", usageHead, gateway.Vars)
}
