package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/tollgate/tollgate/loadtest/internal/chaos/checker"
	"github.com/tollgate/tollgate/loadtest/internal/chaos/history"
	"github.com/tollgate/tollgate/loadtest/internal/procstat"
	"github.com/tollgate/tollgate/loadtest/internal/report"
)

// Bounds the checker applies, written into the history's Meta
// (docs/reliability.md says where each comes from).
const (
	failOpenTail  = 10 * time.Second
	splitBound    = 5 * time.Second
	propagation   = 2 * time.Second
	recoveryBound = 60 * time.Second
	leaseShare    = 0.01
	maxLeaseTTL   = 10 * time.Second
	// maxUnscheduled is the share of answers that may be degraded with no
	// fault in force.
	maxUnscheduled = 0.01
	// healthzBound: a process answers /healthz this soon after its start.
	healthzBound = 3 * time.Second
	warmUp       = 5 * time.Second
)

// Result is a soak's outcome.
type Result struct {
	Seed    uint64
	Plan    []Planned
	History *history.History
	Check   *checker.Result
	// WorkDir holds the fleet's logs and data; Kept says it was left in
	// place.
	WorkDir string
	Kept    bool
	// Phase lengths as they happened.
	Startup, Faults, Heal, Settle, Total time.Duration
	// Missed counts load requests not sent because too many were in
	// flight.
	Missed int64
	// HarnessCPU is this process's CPU time.
	HarnessCPU time.Duration

	// Replay is the command that replays the schedule.
	Replay string

	stats *report.Recorder // answers second by second, for the page
}

// replay is the command line that draws cfg's schedule again.
func replay(cfg Config) string {
	s := fmt.Sprintf("loadtest chaos -seed %d -duration %v", cfg.Seed, cfg.Duration)
	if cfg.Faults > 0 {
		s += fmt.Sprintf(" -faults %d", cfg.Faults)
	}
	if len(cfg.Kinds) != len(Kinds) {
		s += " -kinds " + strings.Join(cfg.Kinds, ",")
	}
	if cfg.RedisMode != "sentinel" {
		s += " -redis " + cfg.RedisMode
	}
	if cfg.Rate != DefaultRate {
		s += fmt.Sprintf(" -rate %g", cfg.Rate)
	}
	if cfg.Gateways != 3 || cfg.Aggregators != 2 {
		s += fmt.Sprintf(" -gateways %d -aggregators %d", cfg.Gateways, cfg.Aggregators)
	}
	return s
}

// Recheck judges a history read back from a file (loadtest chaos -check).
func Recheck(h *history.History) *Result {
	return &Result{Seed: h.Meta.Seed, History: h, Check: checker.Check(h),
		Total:  time.Duration(h.Meta.End-h.Meta.Start) * time.Microsecond,
		Faults: time.Duration(h.Meta.FaultEnd-h.Meta.FaultStart) * time.Microsecond}
}

// Run runs one soak (docs/reliability.md): it starts the fleet, drives the
// load and the schedule, heals, settles, checks the history and stops the
// fleet. The error is the harness's own failure (the fleet could not
// start); a run whose invariants do not all hold is a Result like any
// other. An interrupted run (ctx) heals, stops and checks what it has.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := supported(); err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Self == "" {
		self, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("chaos: find this executable: %w", err)
		}
		cfg.Self = self
	}
	for _, bin := range []string{"gateway", "aggregator"} {
		if _, err := os.Stat(filepath.Join(cfg.BinDir, bin)); err != nil {
			return nil, fmt.Errorf("chaos: %w (build the binaries first: make build)", err)
		}
	}
	dir, owned := cfg.WorkDir, false
	if dir == "" {
		d, err := os.MkdirTemp("", "tollgate-chaos-")
		if err != nil {
			return nil, fmt.Errorf("chaos: work dir: %w", err)
		}
		dir, owned = d, true
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("chaos: work dir: %w", err)
	}
	cpu0, _ := procstat.CPUTime(os.Getpid())
	t0 := time.Now()
	rec := newRecorder(cfg.Log)
	f := newFleet(cfg, dir, rec)
	res := &Result{Seed: cfg.Seed, WorkDir: dir, stats: rec.stats, Replay: replay(cfg)}
	res.Plan = Plan(cfg.Seed, cfg.Duration, cfg.Faults, cfg.Kinds, f.shape())
	rec.logf("seed %d: %d faults planned over %v; work dir %s", cfg.Seed, len(res.Plan), cfg.Duration, dir)

	meta := history.Meta{Seed: cfg.Seed, RedisMode: cfg.RedisMode, Gateways: cfg.Gateways, Aggregators: cfg.Aggregators,
		Rate: cfg.Rate, Kinds: cfg.Kinds, Start: now(), FailureShare: failureShare,
		ClientDeadline: cfg.ClientDeadline.Microseconds(), FailOpenTail: failOpenTail.Microseconds(),
		SplitBound: splitBound.Microseconds(), Propagation: propagation.Microseconds(),
		RecoveryBound: recoveryBound.Microseconds(), LeaseShare: leaseShare, MaxLeaseTTL: maxLeaseTTL.Microseconds(),
		MaxUnscheduledDegraded: maxUnscheduled, StallTail: stallTail.Microseconds(), HealthzBound: healthzBound.Microseconds()}

	sctx, cancel := context.WithTimeout(ctx, cfg.Startup)
	err := f.start(sctx)
	cancel()
	if err != nil {
		f.stop()
		res.Kept = true
		return res, fmt.Errorf("%w (logs in %s)", err, dir)
	}
	res.Startup = time.Since(t0)

	c := newClient(cfg.ClientDeadline)
	defer c.close()
	missing := newCounters("tollgate_aggregator_events_missing_total")
	dropped := newCounters("tollgate_events_dropped_total")
	e := newExecutor(f, rec, c, missing, dropped)
	var bg sync.WaitGroup
	mctx, stopMonitor := context.WithCancel(context.WithoutCancel(ctx))
	bg.Add(2)
	go func() { defer bg.Done(); e.monitor(mctx) }()
	go func() { defer bg.Done(); rec.detectStalls(mctx) }()

	ld := &load{f: f, c: c, rec: rec, rate: cfg.Rate, seed: cfg.Seed}
	lctx, stopLoad := context.WithCancel(context.WithoutCancel(ctx))
	loadDone := make(chan struct{})
	go func() { defer close(loadDone); ld.run(lctx) }()
	interrupted := sleep(ctx, warmUp)

	// The fault phase.
	phaseStart := time.Now()
	meta.FaultStart = now()
	op := newOperator(f, rec, cfg.Seed)
	fctx, endPhase := context.WithDeadline(ctx, phaseStart.Add(cfg.Duration))
	if !interrupted {
		bg.Add(1)
		go func() { defer bg.Done(); op.run(fctx) }()
		e.run(fctx, phaseStart, res.Plan)
		<-fctx.Done()
	}
	endPhase()
	interrupted = interrupted || ctx.Err() != nil
	meta.FaultEnd = now()
	res.Faults = time.Since(phaseStart)
	rec.logf("fault phase over: healing")

	// Heal: every fault in force ends, every part must be ready again.
	t1 := time.Now()
	e.healAll()
	hctx := context.WithoutCancel(ctx)
	if err := pollUntil(hctx, cfg.Heal, func() error { return f.healthy(hctx, e) }); err != nil {
		rec.logf("after the heal, not everything is ready: %v", err)
		rec.probe(history.Probe{What: "recovery", Kind: "heal", Target: "fleet", OK: false, Detail: err.Error(), Took: time.Since(t1).Microseconds()})
	}
	res.Heal = time.Since(t1)

	// Settle: the load goes on; then the last operator change.
	t2 := time.Now()
	if !interrupted {
		interrupted = sleep(ctx, cfg.Settle)
	}
	if !interrupted {
		if err := op.final(hctx, c); err != nil {
			rec.logf("the last operator change: %v", err)
		}
	}
	stopLoad()
	<-loadDone
	res.Missed = ld.missed.Load()
	usage, ok := f.converge(hctx, t0, cfg.Heal)
	if !ok {
		rec.logf("the usage reports did not settle within %v", cfg.Heal)
	}
	e.scrapeAll(hctx)
	op.politeUnpenalised(hctx)
	stopMonitor()
	bg.Wait()
	res.Settle = time.Since(t2)

	rec.logf("stopping the fleet")
	f.stop()
	meta.End = now()
	meta.Interrupted = interrupted
	h := rec.history()
	h.Meta, h.Rules, h.Keys, h.Usage = meta, f.rules, f.keys, usage
	h.Counts = history.Counts{Missing: int64(missing.total()), Dropped: int64(dropped.total()), Complete: missing.complete()}
	res.History = &h
	res.Check = checker.Check(&h)
	res.Total = time.Since(t0)
	if cpu1, err := procstat.CPUTime(os.Getpid()); err == nil {
		res.HarnessCPU = cpu1 - cpu0
	}
	res.Kept = cfg.Keep || !owned || res.Check.Held() < len(res.Check.Verdicts)
	if !res.Kept {
		if err := os.RemoveAll(dir); err != nil {
			res.Kept = true
		}
	}
	return res, nil
}

// sleep waits d; it reports whether ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return true
	case <-t.C:
		return false
	}
}

// healthy: every part of the fleet is up and ready, and every gateway
// decides through Redis.
func (f *fleet) healthy(ctx context.Context, e *executor) error {
	var errs []error
	if err := f.redisHealthy(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := f.brokerReady(ctx); err != nil {
		errs = append(errs, fmt.Errorf("broker: %w", err))
	}
	if err := f.natsReady(ctx); err != nil {
		errs = append(errs, fmt.Errorf("nats: %w", err))
	}
	for _, a := range f.aggs {
		if err := f.aggReady(ctx, a); err != nil {
			errs = append(errs, err)
		}
	}
	for _, g := range f.gws {
		if err := f.gatewayReady(ctx, g); err != nil {
			errs = append(errs, err)
		} else if err := e.undegraded(ctx, g); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
