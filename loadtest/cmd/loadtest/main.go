// Command loadtest is Tollgate's load generator: it sends a bounded load to
// the gateway's proxy, check API or Envoy rate-limit service, prints a
// progress line every second to stderr and a summary at the end (text, or
// JSON on stdout with -json). `loadtest storm` runs the retry storm of
// a CI fleet instead, `loadtest chaos` the chaos soak (docs/reliability.md),
// `loadtest sweep` the key-count sweeps (docs/benchmarks.md).
// Ctrl-C stops it cleanly, summary included; a
// second Ctrl-C exits at once. See loadtest/README.md.
//
// Exit status: 0 after a run, 1 when the run could not start or no request
// was answered, 2 for bad flags, 130 when interrupted (after the summary).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/loadtest"
	"github.com/tollgate/tollgate/loadtest/internal/chaos"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// After the first signal, restore the default handling: a second
	// Ctrl-C kills the process.
	context.AfterFunc(ctx, stop)
	// go-redis logs dial retries to stderr; the sampler returns its errors.
	redis.SetLogger(silentRedisLog{})
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// silentRedisLog drops go-redis's internal log lines.
type silentRedisLog struct{}

func (silentRedisLog) Printf(context.Context, string, ...any) {}

// Exit statuses.
const (
	exitOK          = 0
	exitFailed      = 1
	exitUsage       = 2
	exitInterrupted = 130
)

// run is the command: it parses args, runs the load and writes the
// summary, and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "storm":
			return runStorm(ctx, args[1:], stdout, stderr)
		case "chaos":
			return runChaos(ctx, args[1:], stdout, stderr)
		case "sweep":
			return runSweep(ctx, args[1:], stdout, stderr)
		case chaos.ChildCommand:
			return runChaosChild(ctx, args[1:], stdout, stderr)
		}
	}
	cfg := loadtest.DefaultConfig()
	fs := flag.NewFlagSet("loadtest", flag.ContinueOnError)
	setUsage(fs, "Usage: loadtest -target proxy|check|grpc (-requests N | -duration D) [flags]\n"+
		"       loadtest storm [flags]   (the retry storm: loadtest storm -h)\n"+
		"       loadtest chaos [flags]   (the chaos soak: loadtest chaos -h)\n"+
		"       loadtest sweep [flags]   (costs as keys grow: loadtest sweep -h)\n\n"+
		"Sends a bounded load to a Tollgate gateway and reports throughput, outcomes and latency.\n"+
		"Open loop with -rate, closed loop with -workers (default). See loadtest/README.md.\n\nFlags:\n", stderr)
	var paths, redisAddrs, cpuProfile string
	out := outputs{name: "loadtest", stdout: stdout, stderr: stderr}
	fs.StringVar(&cfg.Target, "target", cfg.Target, "`target`: proxy (HTTP through the gateway), check (POST /v1/check) or grpc (Envoy RLS)")
	fs.StringVar(&cfg.URL, "url", "", "URL of an HTTP target (default "+loadtest.DefaultProxyURL+" for proxy, "+loadtest.DefaultCheckURL+" for check)")
	fs.StringVar(&cfg.Addr, "addr", "", "host:port of the grpc target, or several comma-separated used in turn (default "+loadtest.DefaultGRPCAddr+")")
	fs.StringVar(&cfg.Method, "method", cfg.Method, "HTTP `method` of proxy requests; the method named in check bodies")
	fs.StringVar(&cfg.Body, "body", "", "body of every proxy request (e.g. with -method POST)")
	fs.StringVar(&cfg.Token, "token", "", "bearer token for the check API (default $TOLLGATE_API_TOKEN, which keeps it out of ps)")
	fs.StringVar(&cfg.Domain, "domain", cfg.Domain, "domain of grpc requests")
	fs.IntVar(&cfg.GRPCConns, "grpc-conns", cfg.GRPCConns, "gRPC connections, used round-robin")
	fs.Float64Var(&cfg.Rate, "rate", 0, "open loop: send `N` requests per second on a fixed schedule (latency from the scheduled time)")
	fs.IntVar(&cfg.Workers, "workers", cfg.Workers, "closed loop: `N` concurrent workers, each sending when its last request is answered")
	fs.IntVar(&cfg.MaxInFlight, "max-inflight", cfg.MaxInFlight, "open loop: at most `N` outstanding requests")
	fs.Int64Var(&cfg.Requests, "requests", 0, "stop after `N` requests (0: no count bound)")
	fs.DurationVar(&cfg.Duration, "duration", 0, "stop after `D` (0: no time bound; never longer than "+loadtest.MaxDuration.String()+")")
	fs.DurationVar(&cfg.Timeout, "timeout", cfg.Timeout, "timeout of each request")
	fs.IntVar(&cfg.Keys, "keys", cfg.Keys, "number of distinct API keys")
	fs.StringVar(&cfg.KeyPrefix, "key-prefix", cfg.KeyPrefix, "prefix of every key; the key index follows")
	fs.StringVar(&cfg.Dist, "dist", cfg.Dist, "key distribution: uniform or zipf (key 0 most frequent)")
	fs.Float64Var(&cfg.ZipfS, "zipf-s", cfg.ZipfS, "Zipf exponent, > 1")
	fs.StringVar(&paths, "paths", "", "comma-separated endpoints, drawn uniformly (default: the proxy URL as given; / for check and grpc)")
	fs.IntVar(&cfg.Cost, "cost", cfg.Cost, "cost of each request (check body cost; grpc hits, 0 is a peek)")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the key and path draws")
	fs.IntVar(&cfg.PID, "pid", 0, "`pid` of the target process: report its CPU µs per decision (Linux /proc)")
	fs.StringVar(&redisAddrs, "redis", "", "comma-separated Redis `host:port`s: report commands and EVALSHA per decision from INFO commandstats\n(credentials from $TOLLGATE_REDIS_USERNAME, $TOLLGATE_REDIS_PASSWORD)")
	fs.BoolVar(&out.json, "json", false, "write the summary as JSON on stdout (the text summary goes to stderr)")
	fs.BoolVar(&out.quiet, "quiet", false, "no progress lines")
	fs.StringVar(&out.reportFile, "report", "", "also write the summary and charts of the run second by second (throughput, p50/p99, outcomes)\nto `file`.html, a self-contained page that opens offline")
	fs.StringVar(&cpuProfile, "cpuprofile", "", "write loadtest's own CPU profile to `file` (to tune the generator)")
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["rate"] && set["workers"] {
		fmt.Fprintln(stderr, "loadtest: -rate (open loop) and -workers (closed loop) exclude each other; cap an open loop with -max-inflight")
		return exitUsage
	}
	if !set["token"] {
		cfg.Token = os.Getenv("TOLLGATE_API_TOKEN") // not a flag default: -h would print it
	}
	cfg.Paths = splitList(paths)
	cfg.Redis = splitList(redisAddrs)
	cfg.RedisUsername = os.Getenv("TOLLGATE_REDIS_USERNAME")
	cfg.RedisPassword = os.Getenv("TOLLGATE_REDIS_PASSWORD")
	if err := cfg.Validate(); err != nil {
		return usageError(fs, err, stderr)
	}

	if cpuProfile != "" {
		f, err := os.Create(cpuProfile)
		if err != nil {
			return failed(stderr, "loadtest", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return failed(stderr, "loadtest: cpu profile", err)
		}
		defer pprof.StopCPUProfile()
	}

	return out.run(func(progress io.Writer) ended {
		sum, err := loadtest.Run(ctx, cfg, progress)
		if sum == nil {
			return ended{err: err}
		}
		return ended{sum: sum, err: err, stoppedBy: sum.StoppedBy, answered: sum.Answered}
	})
}

// outputs are where a run's summary goes (the -json, -quiet and -report
// flags of the runs that write loadtest.Summary or loadtest.StormSummary).
type outputs struct {
	name        string // the command, as its messages start
	json, quiet bool
	reportFile  string
	stdout      io.Writer
	stderr      io.Writer
	report      *os.File
}

// ended is how a run ended, as finish takes it: a nil sum means the run
// failed with err before any summary.
type ended struct {
	sum       summary
	err       error
	stoppedBy string
	answered  int64
}

// run opens the outputs, runs do with where its progress goes and
// returns finish's exit code for how it ended.
func (o *outputs) run(do func(progress io.Writer) ended) int {
	progress, code, ok := o.open()
	if !ok {
		return code
	}
	defer o.close()
	start := time.Now()
	e := do(progress)
	return o.finish(e.sum, e.err, start, e.stoppedBy, e.answered)
}

// open creates the report's file first (a bad path should not cost a run)
// and returns where progress goes: nil when quiet.
func (o *outputs) open() (progress io.Writer, code int, ok bool) {
	if o.report, code, ok = createReport(o.name, o.reportFile, o.stderr); !ok {
		return nil, code, false
	}
	if o.quiet {
		return nil, 0, true
	}
	return o.stderr, 0, true
}

// fail says err, prefixed with the command's name unless it is already.
func (o *outputs) fail(err error) {
	msg := err.Error()
	if !strings.HasPrefix(msg, o.name+":") {
		msg = o.name + ": " + msg
	}
	fmt.Fprintln(o.stderr, msg)
}

// close closes the report's file if finish has not.
func (o *outputs) close() {
	if o.report != nil {
		o.report.Close()
	}
}

// finish writes sum (nil: the run failed with err before any summary,
// and the report's file goes) and returns the exit code: failed for err or
// a run in which no request was answered, interrupted when stoppedBy says
// so.
func (o *outputs) finish(sum summary, err error, start time.Time, stoppedBy string, answered int64) int {
	if sum == nil {
		o.fail(err)
		if o.report != nil {
			o.report.Close()
			os.Remove(o.reportFile)
			o.report = nil
		}
		return exitFailed
	}
	code := writeSummary(o.name, sum, o.json, o.stdout, o.stderr, o.report, o.reportFile)
	o.report = nil // writeSummary closed it
	if code != exitOK {
		return code
	}
	switch {
	case err != nil:
		o.fail(err)
		return exitFailed
	case stoppedBy == "interrupted":
		fmt.Fprintf(o.stderr, "%s: interrupted after %v\n", o.name, time.Since(start).Round(time.Millisecond))
		return exitInterrupted
	case answered == 0:
		fmt.Fprintf(o.stderr, "%s: no request was answered\n", o.name)
		return exitFailed
	}
	return exitOK
}

// summary is what a run's outputs are written from: loadtest.Summary and
// loadtest.StormSummary.
type summary interface {
	WriteText(io.Writer) error
	WriteJSON(io.Writer) error
	WriteHTML(io.Writer) error
}

// writeSummary writes sum as text on stdout (or JSON on stdout and the
// text on stderr) and, when reportOut is set, the HTML report into it
// (then closed); it returns exitOK or exitFailed, having said why.
func writeSummary(name string, sum summary, jsonOut bool, stdout, stderr io.Writer, reportOut *os.File, reportFile string) int {
	text := stdout
	if jsonOut {
		text = stderr
		if err := sum.WriteJSON(stdout); err != nil {
			return failed(stderr, name, err)
		}
	}
	if err := sum.WriteText(text); err != nil {
		return failed(stderr, name, err)
	}
	if reportOut == nil {
		return exitOK
	}
	if err := sum.WriteHTML(reportOut); err != nil {
		return failed(stderr, name, err)
	}
	if err := reportOut.Close(); err != nil {
		return failed(stderr, name+": report", err)
	}
	fmt.Fprintf(stderr, "%s: report written to %s\n", name, reportFile)
	return exitOK
}

// splitList splits a comma-separated list, dropping blanks.
func splitList(s string) []string {
	var out []string
	for part := range strings.SplitSeq(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}
