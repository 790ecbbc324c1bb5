// Command tollgate-stack is `make run`: the local Tollgate stack in one
// foreground process (package compose/stack) — Redis, NATS, a
// Kafka-protocol broker, the aggregator, a demo API and a gateway in front
// of it — printing the addresses and curl lines to try.
// It is configured by TOLLGATE_* variables only, listed by --help. Logs go
// to stderr, the banner to stdout.
//
// Exit codes: 0 after a clean shutdown (SIGINT or SIGTERM), 1 when the
// stack failed to start (a busy port, say) or stopped on an error, 2 for
// bad flags or configuration.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/compose/stack"
	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/guard/redisstore"
)

func main() {
	configs.Main("tollgate-stack", run)
}

const usageHead = `Usage: tollgate-stack   (or: make run)

Starts the whole local Tollgate pipeline in one foreground process, from the
repository root: Redis (redis-server from PATH on a free port, else an
embedded stand-in), an embedded NATS server (JetStream) and Kafka-protocol
broker, the aggregator (usage reports and the operator API), a demo API, and
a gateway in front of it in fleet mode: the aggregator seeds the rules in
NATS from configs/rules.yaml, and every decision streams through Kafka to the
aggregator. Once ready it prints the addresses and curl lines to try, and
writes bin/stack.env (and bin/stack.pid) so that a second bin/gateway or
bin/aggregator can join. Ctrl-C stops everything.

TOLLGATE_STACK_REGIONS=2 (up to 7) starts that many regions on one machine,
each its own Redis, NATS, broker, aggregator, demo API and gateway, their NATS
servers linked through proxies whose control APIs add latency, cut and heal;
bin/stack.env then names every region's addresses.

The key secret and the admin token are generated and printed unless set.
A busy port stops the start, naming the variable that moves it; "127.0.0.1:0"
picks a free port.

Flags:
  --help   print this help and exit

Environment variables:
`

func run(ctx context.Context, args []string, lookup configs.LookupFunc, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tollgate-stack", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if status, ok := configs.ParseArgs(fs, args, stderr, "tollgate-stack", "tollgate-stack", func() int { return help(stdout, stderr) }); !ok {
		return status
	}

	cfg, err := stack.LoadConfig(lookup)
	if err != nil {
		fail(stderr, err)
		return 2
	}
	log := cfg.Log.NewLogger(stderr)
	st, err := stack.New(cfg, log, stdout)
	if err != nil {
		fail(stderr, err)
		return 1
	}
	// go-redis logs failed dials through its own process-wide logger:
	// route it into ours at debug level, as bin/gateway does.
	redis.SetLogger(redisstore.SlogLogger{Log: log})
	if err := st.Run(ctx); err != nil {
		fail(stderr, err)
		return 1
	}
	return 0
}

// fail prints why the stack did not start or stopped, one line per
// problem, without the package prefix twice.
func fail(stderr io.Writer, err error) {
	for line := range strings.SplitSeq(err.Error(), "\n") {
		fmt.Fprintf(stderr, "tollgate-stack: %s\n", strings.TrimPrefix(line, "stack: "))
	}
}

func help(stdout, stderr io.Writer) int {
	if status := configs.WriteUsage(stdout, stderr, "tollgate-stack", usageHead, stack.Vars); status != 0 {
		return status
	}
	_, _ = fmt.Fprintf(stdout, "  TOLLGATE_REDIS_SERVER  (default: redis-server from PATH)\n      Path of the redis-server binary to run.\n")
	return 0
}
