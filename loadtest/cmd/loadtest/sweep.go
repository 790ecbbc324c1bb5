package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/tollgate/tollgate/compose/redisserver"
	"github.com/tollgate/tollgate/loadtest/internal/sweep"
)

// runSweep is `loadtest sweep`: how costs grow with the number of keys.
func runSweep(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	def := sweep.DefaultConfig()
	fs := flag.NewFlagSet("loadtest sweep", flag.ContinueOnError)
	setUsage(fs, "Usage: loadtest sweep [-what all] [-keys 1k,100k,1m,10m] [-dist uniform,zipf] [-out DIR] [flags]\n\n"+
		"Measures, at each key count, the gateway's CPU per decision, fast-path share and heap per tracked key\n"+
		"(a guard with its fast path, in this process, over a redis-server it starts), Redis bytes per counter\n"+
		"per algorithm, the aggregator's events per CPU second, and Pebble bytes per usage row with the latency\n"+
		"of a 10 000-row report. Writes the figures as Markdown tables on stdout and one SVG chart per figure\n"+
		"into -out. The default sweep takes about twenty minutes, most of it ten million Redis counters. See loadtest/README.md.\n\nFlags:\n", stderr)
	var (
		what, keys, dists, out, redisBin, commit string
		quiet                                    bool
		allAlgs, pebbleUpTo                      string
		earlier                                  []string
	)
	cfg := def
	fs.StringVar(&what, "what", "all", "comma-separated parts: gateway, redis, aggregator, pebble, or all")
	fs.StringVar(&keys, "keys", "1k,100k,1m,10m", "comma-separated key counts, ascending (k: thousand, m: million)")
	fs.StringVar(&dists, "dist", "uniform,zipf", "the gateway's key distributions: uniform, zipf or both")
	fs.Float64Var(&cfg.ZipfS, "zipf-s", def.ZipfS, "Zipf exponent, > 1")
	fs.DurationVar(&cfg.Point, "point", def.Point, "how long each gateway point checks")
	fs.IntVar(&cfg.Workers, "workers", def.Workers, "goroutines checking at once in a gateway point")
	fs.IntVar(&cfg.Events, "events", def.Events, "decision events each aggregator point counts")
	fs.IntVar(&cfg.Reports, "reports", def.Reports, "10 000-row reports each Pebble point times")
	fs.StringVar(&allAlgs, "all-algorithms-up-to", sweep.KeyName(def.AllAlgorithmsUpTo), "Redis points above this key count measure the token bucket only")
	fs.StringVar(&pebbleUpTo, "pebble-up-to", sweep.KeyName(def.PebbleUpTo), "Pebble points above this key count are not run")
	fs.Uint64Var(&cfg.Seed, "seed", def.Seed, "seed of the key draws")
	fs.StringVar(&out, "out", "", "write one SVG chart per figure into this existing `directory` (e.g. docs/img); empty: no charts")
	fs.StringVar(&redisBin, "redis-server", "", "the redis-server `binary` to start (default: redis-server on $PATH)")
	fs.StringVar(&commit, "commit", "", "the commit to name in the tables (default: the binary's VCS revision)")
	fs.BoolVar(&quiet, "quiet", false, "no progress lines")
	fs.Func("aggregator-earlier", "an earlier aggregator series to draw beside this sweep's, `NAME=V,V,…`: events per CPU second per key count, - for none (repeatable)", func(v string) error {
		earlier = append(earlier, v)
		return nil
	})
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	var errs []error
	var err error
	if cfg.What, err = sweep.ParseWhat(what); err != nil {
		errs = append(errs, err)
	}
	if cfg.Keys, err = sweep.ParseKeys(keys); err != nil {
		errs = append(errs, err)
	}
	if cfg.Dists, err = sweep.ParseDists(dists); err != nil {
		errs = append(errs, err)
	}
	if cfg.AllAlgorithmsUpTo, err = sweep.ParseCount(allAlgs); err != nil {
		errs = append(errs, fmt.Errorf("-all-algorithms-up-to: %w", err))
	}
	if cfg.PebbleUpTo, err = sweep.ParseCount(pebbleUpTo); err != nil {
		errs = append(errs, fmt.Errorf("-pebble-up-to: %w", err))
	}
	for _, v := range earlier {
		e, err := sweep.ParseEarlier(v)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		cfg.AggregatorEarlier = append(cfg.AggregatorEarlier, e)
	}
	if len(errs) == 0 {
		if err := cfg.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if out != "" {
		if st, err := os.Stat(out); err != nil || !st.IsDir() {
			errs = append(errs, fmt.Errorf("-out %q: not an existing directory", out))
		}
	}
	if len(errs) > 0 {
		return usageError(fs, fmt.Errorf("loadtest sweep: %w", errors.Join(errs...)), stderr)
	}
	if commit == "" {
		commit = vcsRevision()
	}
	var progress io.Writer
	if !quiet {
		progress = stderr
	}
	env := sweep.Env{TempDir: os.TempDir()}
	if cfg.Runs(sweep.Gateway) || cfg.Runs(sweep.Redis) {
		var opts []redisserver.Option
		if redisBin != "" {
			opts = append(opts, redisserver.WithBinary(redisBin))
		}
		srv, err := redisserver.Start(ctx, opts...)
		if err != nil {
			return failed(stderr, "loadtest sweep", err)
		}
		defer srv.Stop()
		env.RedisAddr, env.RedisPID = srv.Addr(), srv.Pid()
	}
	res, runErr := sweep.Run(ctx, cfg, env, progress)
	if res == nil {
		return failed(stderr, "loadtest sweep", runErr)
	}
	if err := res.WriteMarkdown(stdout, commit); err != nil {
		return failed(stderr, "loadtest sweep", err)
	}
	if out != "" {
		files, err := res.WriteFigures(out)
		if err != nil {
			return failed(stderr, "loadtest sweep", err)
		}
		if len(files) > 0 {
			fmt.Fprintf(stderr, "loadtest sweep: charts written: %s\n", strings.Join(files, ", "))
		}
	}
	switch {
	case runErr != nil:
		return failed(stderr, "loadtest sweep", runErr)
	case ctx.Err() != nil:
		fmt.Fprintf(stderr, "loadtest sweep: interrupted after %v\n", res.Elapsed.Round(time.Second))
		return exitInterrupted
	}
	return exitOK
}

// vcsRevision returns the short VCS revision the binary was built from
// ("" when unknown), with "+dirty" when the tree was modified.
func vcsRevision() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	var rev string
	dirty := false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev != "" && dirty {
		rev += "+dirty"
	}
	return rev
}
