package loadtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/tollgate/tollgate/loadtest/internal/cmdstats"
	"github.com/tollgate/tollgate/loadtest/internal/gen"
	"github.com/tollgate/tollgate/loadtest/internal/procstat"
	"github.com/tollgate/tollgate/loadtest/internal/report"
	"github.com/tollgate/tollgate/loadtest/internal/target"
)

// progressInterval is the time between two progress lines.
const progressInterval = time.Second

// closingTarget is what Run needs of a target: gen.Target plus Close.
type closingTarget interface {
	gen.Target
	Close() error
}

// newTarget builds the target cfg names.
func newTarget(cfg Config) (closingTarget, error) {
	conns := cfg.Workers
	if cfg.OpenLoop() {
		conns = cfg.MaxInFlight
	}
	hc := target.HTTPConfig{
		URL:    cfg.Endpoint(),
		Method: cfg.Method,
		Token:  cfg.Token,
		Cost:   cfg.Cost,
		Conns:  conns,
	}
	switch cfg.Target {
	case TargetProxy:
		if cfg.Body != "" {
			hc.Body = []byte(cfg.Body)
		}
		return target.NewProxy(hc), nil
	case TargetCheck:
		return target.NewCheck(hc), nil
	default:
		return target.NewRLS(target.RLSConfig{
			Addrs: strings.Split(cfg.Endpoint(), ","), Domain: cfg.Domain, Cost: cfg.Cost, Conns: cfg.GRPCConns,
		})
	}
}

// observed is a target that reports every answer to a callback.
type observed struct {
	closingTarget
	names []string
	fn    func(key, outcome string)
}

func (o *observed) Do(ctx context.Context, req gen.Request) (int, error) {
	i, err := o.closingTarget.Do(ctx, req)
	if err == nil && i >= 0 && i < len(o.names) {
		o.fn(req.Key, o.names[i])
	}
	return i, err
}

// Run validates cfg, sends its load and returns the summary. It returns
// once the run is over: a bound was reached, or ctx was cancelled (the
// summary then says "interrupted" and counts the requests cut short as
// cancelled), and every request in flight has finished.
//
// If progress is not nil, a progress line (rate, outcome counts, p99 so
// far) is written to it every second from a goroutine Run starts and waits
// for.
//
// Measurements of the target's CPU (cfg.PID) and of Redis (cfg.Redis) are
// taken before the load starts, where a failure ends Run with an error and
// no load sent, and after it ends, where a failure leaves that part out of
// the summary and is returned beside it.
func Run(ctx context.Context, cfg Config, progress io.Writer) (*Summary, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	tgt, err := newTarget(cfg)
	if err != nil {
		return nil, err
	}
	defer tgt.Close()
	if cfg.OnAnswer != nil {
		ob := &observed{closingTarget: tgt, fn: cfg.OnAnswer}
		for _, o := range tgt.Outcomes() {
			ob.names = append(ob.names, o.Name)
		}
		tgt = ob
	}

	var cpuBefore time.Duration
	if cfg.PID > 0 {
		if cpuBefore, err = procstat.CPUTime(cfg.PID); err != nil {
			return nil, fmt.Errorf("loadtest: target cpu: %w", err)
		}
	}
	var sampler *cmdstats.Sampler
	var redisBefore cmdstats.Stats
	if len(cfg.Redis) > 0 {
		sampler = cmdstats.NewSampler(cfg.Redis, cmdstats.Credentials{Username: cfg.RedisUsername, Password: cfg.RedisPassword})
		defer sampler.Close()
		if redisBefore, err = sampler.Sample(ctx); err != nil {
			return nil, fmt.Errorf("loadtest: %w", err)
		}
	}
	selfBefore, selfErr := procstat.CPUTime(os.Getpid())

	rec := report.NewRecorder(tgt.Outcomes())
	stopProgress := startProgress(rec, progress)
	res, err := gen.Run(ctx, gen.Config{
		Target:      tgt,
		Recorder:    rec,
		Keys:        cfg.keyspace(),
		Seed:        cfg.Seed,
		Rate:        cfg.Rate,
		Workers:     cfg.Workers,
		MaxInFlight: cfg.MaxInFlight,
		Requests:    cfg.Requests,
		Duration:    cfg.duration(),
		Timeout:     cfg.Timeout,
	})
	stopProgress()
	if err != nil {
		return nil, fmt.Errorf("loadtest: %w", err)
	}

	s := summarize(cfg, rec, res)
	// The run may have been interrupted: measure anyway.
	after := context.WithoutCancel(ctx)
	var errs []error
	if cfg.PID > 0 {
		if cpuAfter, err := procstat.CPUTime(cfg.PID); err != nil {
			errs = append(errs, fmt.Errorf("loadtest: target cpu after the run: %w", err))
		} else {
			cpu := cpuAfter - cpuBefore
			s.Gateway = &report.GatewayCPU{
				PID:               cfg.PID,
				CPUSeconds:        cpu.Seconds(),
				MicrosPerDecision: perDecision(float64(cpu.Microseconds()), s.Decisions),
			}
		}
	}
	if sampler != nil {
		if redisAfter, err := sampler.Sample(after); err != nil {
			errs = append(errs, fmt.Errorf("loadtest: after the run: %w", err))
		} else {
			d := redisAfter.Sub(redisBefore)
			delete(d, "info")
			s.Redis = &report.RedisUsage{
				Addrs:               cfg.Redis,
				Commands:            d.Total(),
				EvalSHA:             d.EvalSHA(),
				CommandsPerDecision: perDecision(float64(d.Total()), s.Decisions),
				EvalSHAPerDecision:  perDecision(float64(d.EvalSHA()), s.Decisions),
				ByCommand:           d,
			}
		}
	}
	if selfErr == nil {
		if selfAfter, err := procstat.CPUTime(os.Getpid()); err == nil {
			s.LoadtestCPUMicrosPerRequest = perDecision(float64((selfAfter - selfBefore).Microseconds()), s.Sent)
		}
	}
	return s, errors.Join(errs...)
}

// perDecision divides, returning 0 when there is nothing to divide by.
func perDecision(v float64, n int64) float64 {
	if n <= 0 {
		return 0
	}
	return v / float64(n)
}

func summarize(cfg Config, rec *report.Recorder, res gen.Result) *Summary {
	seconds := rec.Seconds() // first: the last second ends with the run
	snap := rec.Snapshot()
	s := &Summary{
		Target:         cfg.Target,
		Endpoint:       cfg.Endpoint(),
		Mode:           "closed",
		Workers:        cfg.Workers,
		Keys:           cfg.Keys,
		Dist:           cfg.keyspace().Dist,
		Paths:          len(cfg.keyspace().Paths),
		Cost:           cfg.Cost,
		StoppedBy:      res.StoppedBy,
		ElapsedSeconds: res.Elapsed.Seconds(),
		Sent:           res.Sent,
		Answered:       snap.Answered(),
		Decisions:      rec.Decisions(),
		Errors:         snap.Errors,
		Cancelled:      snap.Cancelled,
		Missed:         res.Missed,
		Waited:         res.Waited,
		Statuses:       rec.Counts(),
		LatencyFrom:    "sent",
		LatencyUS:      rec.Latency(),
		ErrorSamples:   rec.ErrorSamples(),
		Seconds:        seconds,
	}
	if cfg.Target == TargetGRPC {
		s.Endpoint = "grpc://" + s.Endpoint + " domain " + cfg.Domain
	}
	if cfg.OpenLoop() {
		s.Mode, s.Rate, s.Workers, s.MaxInFlight = "open", cfg.Rate, 0, cfg.MaxInFlight
		s.LatencyFrom = "scheduled"
		lag := res.SendLag
		s.SendLagUS = &lag
	}
	if res.Elapsed > 0 {
		s.ThroughputRPS = float64(s.Answered) / res.Elapsed.Seconds()
	}
	for _, o := range rec.Outcomes() {
		s.Order = append(s.Order, o.Name)
		if o.Penalty {
			s.PenaltyAnswers += s.Statuses[o.Name]
		}
	}
	return s
}

// startProgress writes a progress line to w every second until the
// returned stop is called; stop waits for the goroutine to exit. A nil w
// starts nothing.
func startProgress(rec *report.Recorder, w io.Writer) (stop func()) {
	if w == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(progressInterval)
		defer t.Stop()
		var prev report.Snapshot
		for {
			select {
			case <-done:
				return
			case <-t.C:
				cur := rec.Snapshot()
				fmt.Fprintln(w, rec.ProgressLine(prev, cur))
				prev = cur
			}
		}
	})
	var once sync.Once
	return func() {
		once.Do(func() { close(done) })
		wg.Wait()
	}
}
