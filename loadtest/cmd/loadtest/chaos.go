package main

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/tollgate/tollgate/loadtest/internal/chaos"
	"github.com/tollgate/tollgate/loadtest/internal/chaos/history"
)

// runChaos is `loadtest chaos`: the chaos soak (docs/reliability.md).
func runChaos(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg := chaos.DefaultConfig()
	fs := flag.NewFlagSet("loadtest chaos", flag.ContinueOnError)
	setUsage(fs, "Usage: loadtest chaos [flags]\n"+
		"       loadtest chaos -check HISTORY   (judge a history written with -history again)\n\n"+
		"The chaos soak: a fleet of real processes on loopback (Redis Sentinel, the Kafka-protocol broker, NATS,\n"+
		"aggregators, gateways), every link through a proxy the soak controls, open-loop load through the proxy,\n"+
		"the check API and Envoy RLS, operator changes, and a seeded schedule of faults (kills, pauses, restarts,\n"+
		"link cuts, stalls and latency, a full spool). A checker written apart from the code judges what clients\n"+
		"saw against five invariants. The last line is\n"+
		"  chaos: N invariants held, M violated, F faults (seed S)\n"+
		"and the exit status 0 only when every invariant held. -duration is the fault phase; start-up, heal and\n"+
		"settling come on top (bounded by -startup and -heal). Needs Linux and bin/gateway, bin/aggregator\n"+
		"(make build). See docs/reliability.md.\n\nFlags:\n", stderr)
	var (
		seed                                  uint64
		kinds, reportFile, jsonFile, histFile string
		checkFile                             string
		quiet                                 bool
	)
	fs.Uint64Var(&seed, "seed", 0, "seed of the fault schedule, the load and the operator's changes (0: a random one, printed)")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "length of the fault phase")
	fs.IntVar(&cfg.Faults, "faults", 0, "number of faults (0: one every 6 s on average)")
	fs.StringVar(&kinds, "kinds", "all", "fault kinds, comma-separated: "+joinKinds())
	fs.Float64Var(&cfg.Rate, "rate", cfg.Rate, "requests per second of the open-loop load (polite clients come on top)")
	fs.IntVar(&cfg.Gateways, "gateways", cfg.Gateways, "gateway processes (at least 3)")
	fs.IntVar(&cfg.Aggregators, "aggregators", cfg.Aggregators, "aggregator processes (at least 2)")
	fs.StringVar(&cfg.RedisMode, "redis", cfg.RedisMode, "Redis topology: sentinel (a primary, a replica, three sentinels) or cluster (three shards, each a primary and a replica)")
	fs.StringVar(&cfg.BinDir, "bin", "", "directory of the gateway and aggregator binaries (default: this executable's directory)")
	fs.StringVar(&cfg.WorkDir, "dir", "", "directory of the fleet's data and logs (default: a temporary one, removed after a run where everything held)")
	fs.BoolVar(&cfg.Keep, "keep", false, "keep the work directory even when every invariant held")
	fs.DurationVar(&cfg.Startup, "startup", cfg.Startup, "bound of the start-up")
	fs.DurationVar(&cfg.Heal, "heal", cfg.Heal, "bound of the heal and of the settling")
	fs.DurationVar(&cfg.Settle, "settle", cfg.Settle, "load after the heal, before the last operator change")
	fs.DurationVar(&cfg.ClientDeadline, "deadline", cfg.ClientDeadline, "each request's deadline")
	fs.StringVar(&reportFile, "report", "", "write the HTML report (summary, verdicts, fault timeline, charts) to `file`.html")
	fs.StringVar(&jsonFile, "json", "", "write the summary as JSON to `file`")
	fs.StringVar(&histFile, "history", "", "write the whole history (every answer, fault and change) as JSON lines to `file`")
	fs.StringVar(&checkFile, "check", "", "judge the history in `file` (written with -history) instead of running a soak")
	fs.BoolVar(&quiet, "quiet", false, "no progress lines")
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	var err error
	if cfg.Kinds, err = chaos.ParseKinds(kinds); err != nil {
		fmt.Fprintf(stderr, "loadtest chaos: %v\n", err)
		return exitUsage
	}
	outputs := func(res *chaos.Result) int {
		code := exitOK
		write := func(name string, fn func(io.Writer) error) {
			if name == "" {
				return
			}
			f, err := os.Create(name)
			if err == nil {
				err = fn(f)
				if cerr := f.Close(); err == nil {
					err = cerr
				}
			}
			if err != nil {
				fmt.Fprintf(stderr, "loadtest chaos: %s: %v\n", name, err)
				code = exitFailed
			}
		}
		write(histFile, func(w io.Writer) error { return history.Write(w, res.History) })
		write(jsonFile, res.WriteJSON)
		write(reportFile, res.WriteHTML)
		if err := res.WriteText(stdout); err != nil {
			return exitFailed
		}
		if res.Check.Held() < len(res.Check.Verdicts) {
			how := fmt.Sprintf("-seed %d", res.Seed)
			if res.Replay != "" {
				how = res.Replay
			}
			fmt.Fprintf(stderr, "loadtest chaos: invariants violated; replay the schedule with: %s\n", how)
			return exitFailed
		}
		return code
	}
	if checkFile != "" {
		f, err := os.Open(checkFile)
		if err != nil {
			return failed(stderr, "loadtest chaos", err)
		}
		h, err := history.Read(f)
		f.Close()
		if err != nil {
			return failed(stderr, "loadtest chaos", err)
		}
		histFile = ""
		return outputs(chaos.Recheck(h))
	}
	if seed == 0 {
		var b [8]byte
		_, _ = crand.Read(b[:])
		seed = binary.LittleEndian.Uint64(b[:])>>1 | 1
	}
	cfg.Seed = seed
	if cfg.BinDir == "" {
		self, err := os.Executable()
		if err != nil {
			return failed(stderr, "loadtest chaos", err)
		}
		cfg.BinDir = filepath.Dir(self)
	}
	if !quiet {
		cfg.Log = stderr
	}
	if err := cfg.Validate(); err != nil {
		return usageError(fs, err, stderr)
	}
	fmt.Fprintf(stderr, "loadtest chaos: seed %d\n", seed)
	res, err := chaos.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "loadtest chaos: %v (seed %d)\n", err, seed)
		if res != nil && res.History != nil {
			return outputs(res)
		}
		return exitFailed
	}
	code := outputs(res)
	if res.History.Meta.Interrupted {
		return exitInterrupted
	}
	return code
}

// runChaosChild is the hidden `loadtest chaos-child`: one server of the
// soak's fleet in a process of its own.
func runChaosChild(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return chaos.RunChild(ctx, args, stdout, stderr)
}

func joinKinds() string {
	s := ""
	for i, k := range chaos.Kinds {
		if i > 0 {
			s += ","
		}
		s += k
	}
	return s
}
