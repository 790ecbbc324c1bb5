// Package gen drives a load-test run: it sends requests to a [Target]
// open-loop at a fixed rate or closed-loop from a fixed number of workers,
// bounded by a request count and a duration, and records every answer in a
// report.Recorder.
//
// Open loop follows a schedule: request i is due at start + i/Rate, whatever
// happened to earlier requests, and its latency is measured from that due
// time, not from when it was actually sent. A slow target therefore shows up
// as latency instead of silently lowering the offered rate (coordinated
// omission). At most MaxInFlight requests are outstanding; a due request
// waits for a free slot, and the wait counts towards its latency.
//
// Closed loop runs Workers goroutines, each sending its next request as soon
// as the previous one is answered; latency is measured from the send.
package gen

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate/loadtest/internal/keyspace"
	"github.com/tollgate/tollgate/loadtest/internal/report"
)

// Request is one request to send.
type Request struct {
	Key  string
	Path string
}

// Target sends requests. Implementations must be safe for concurrent use.
type Target interface {
	// Outcomes lists the classes of answer Do can return, by index. The
	// list is fixed for the life of the Target.
	Outcomes() []report.Outcome
	// Do sends req and returns its outcome's index. A non-nil error means
	// no answer was received (transport failure, timeout, cancellation).
	Do(ctx context.Context, req Request) (int, error)
}

// Reasons a run stopped, as [Result.StoppedBy] reports them.
const (
	StoppedByRequests    = "requests"
	StoppedByDuration    = "duration"
	StoppedByInterrupted = "interrupted"
)

// Config describes a run.
type Config struct {
	Target   Target
	Recorder *report.Recorder
	Keys     keyspace.Config
	// Seed fixes the keys and paths drawn; worker w of a closed-loop run
	// draws from Seed+w.
	Seed uint64
	// Rate > 0 selects open loop at Rate requests per second; 0 selects
	// closed loop.
	Rate float64
	// Workers is the closed-loop concurrency, at least 1.
	Workers int
	// MaxInFlight caps the outstanding requests of an open-loop run, at
	// least 1.
	MaxInFlight int
	// Requests bounds the requests sent; 0 means no count bound.
	Requests int64
	// Duration bounds the time requests are sent, and must be positive.
	// Requests in flight when it ends are still waited for.
	Duration time.Duration
	// Timeout bounds each request, and must be positive.
	Timeout time.Duration
}

// Result describes how a run went; the answers themselves are in the
// Recorder.
type Result struct {
	// Elapsed runs from the first send to the last answer.
	Elapsed time.Duration
	// StoppedBy says which bound ended the run.
	StoppedBy string
	// Sent counts requests sent.
	Sent int64
	// Missed and Waited are open loop only: requests due before the end but
	// never sent for want of a free slot, and requests that waited for one.
	Missed int64
	Waited int64
	// SendLag (open loop) is how late requests left against their due
	// times: the load generator's own share of their latency.
	SendLag report.SendLag
}

// validate reports every problem with cfg at once.
func (cfg Config) validate() error {
	var errs []error
	if cfg.Target == nil {
		errs = append(errs, errors.New("gen: no target"))
	}
	if cfg.Recorder == nil {
		errs = append(errs, errors.New("gen: no recorder"))
	}
	if err := cfg.Keys.Validate(); err != nil {
		errs = append(errs, err)
	}
	switch {
	case math.IsNaN(cfg.Rate) || math.IsInf(cfg.Rate, 0) || cfg.Rate < 0:
		errs = append(errs, fmt.Errorf("gen: rate must be a finite number ≥ 0, got %v", cfg.Rate))
	case cfg.Rate > 0 && cfg.MaxInFlight < 1:
		errs = append(errs, fmt.Errorf("gen: max in flight must be at least 1, got %d", cfg.MaxInFlight))
	case cfg.Rate == 0 && cfg.Workers < 1:
		errs = append(errs, fmt.Errorf("gen: workers must be at least 1, got %d", cfg.Workers))
	}
	if cfg.Requests < 0 {
		errs = append(errs, fmt.Errorf("gen: requests must be ≥ 0, got %d", cfg.Requests))
	}
	if cfg.Duration <= 0 {
		errs = append(errs, fmt.Errorf("gen: duration must be positive, got %v", cfg.Duration))
	}
	if cfg.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("gen: timeout must be positive, got %v", cfg.Timeout))
	}
	return errors.Join(errs...)
}

// Run sends the load cfg describes and returns when the run is over and
// every goroutine it started has exited: after Requests were sent, or
// Duration passed, or ctx was cancelled, and then every request in flight
// finished. Cancelling ctx also cancels the requests in flight; they are
// recorded with Recorder.Cancel. The error is non-nil only when cfg is not
// valid.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if err := cfg.validate(); err != nil {
		return Result{}, err
	}
	r := &runner{cfg: cfg}
	if cfg.Rate > 0 {
		return r.openLoop(ctx)
	}
	return r.closedLoop(ctx)
}

type runner struct {
	cfg Config
}

// send sends one request and records its outcome, with latency measured
// from since. ctx is the run's parent context: requests outlive the
// duration bound, but not an interruption.
func (r *runner) send(ctx context.Context, since time.Time, req Request) {
	rec := r.cfg.Recorder
	rec.Begin()
	rctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	outcome, err := r.cfg.Target.Do(rctx, req)
	latency := time.Since(since)
	cancel()
	switch {
	case err == nil:
		rec.Record(outcome, since, latency)
	case ctx.Err() != nil:
		rec.Cancel()
	default:
		rec.Error(err)
	}
}

func (r *runner) closedLoop(ctx context.Context) (Result, error) {
	cfg := r.cfg
	pickers := make([]*keyspace.Picker, cfg.Workers)
	for w := range pickers {
		p, err := keyspace.New(cfg.Keys, cfg.Seed+uint64(w))
		if err != nil {
			return Result{}, err
		}
		pickers[w] = p
	}
	start := time.Now()
	stop, cancel := context.WithDeadline(ctx, start.Add(cfg.Duration))
	defer cancel()

	var tickets, sent atomic.Int64
	var wg sync.WaitGroup
	for _, p := range pickers {
		wg.Go(func() {
			for stop.Err() == nil {
				if cfg.Requests > 0 && tickets.Add(1) > cfg.Requests {
					return
				}
				sent.Add(1)
				key, path := p.Next()
				r.send(ctx, time.Now(), Request{Key: key, Path: path})
			}
		})
	}
	wg.Wait()
	res := Result{Elapsed: time.Since(start), Sent: sent.Load()}
	res.StoppedBy = stoppedBy(ctx, cfg.Requests, res.Sent)
	return res, nil
}

func (r *runner) openLoop(ctx context.Context) (Result, error) {
	cfg := r.cfg
	picker, err := keyspace.New(cfg.Keys, cfg.Seed)
	if err != nil {
		return Result{}, err
	}
	interval := float64(time.Second) / cfg.Rate
	due := func(i int64) time.Duration { return time.Duration(float64(i) * interval) }

	pace := newPacer()
	defer pace.close()
	lags := report.NewLags()

	start := time.Now()
	end := start.Add(cfg.Duration)
	stop, cancel := context.WithDeadline(ctx, end)
	defer cancel()

	slots := make(chan struct{}, cfg.MaxInFlight)
	var wg sync.WaitGroup
	var res Result
	broken := false // the schedule stopped while waiting for a free slot
schedule:
	for i := int64(0); cfg.Requests == 0 || i < cfg.Requests; i++ {
		at := start.Add(due(i))
		if !at.Before(end) || ctx.Err() != nil {
			break
		}
		// A request due before the end is sent even if the scheduler runs
		// late (starved of CPU, say) and the end has passed meanwhile: its
		// latency, from at, shows the lag.
		if !pace.wait(ctx, at) {
			break schedule
		}
		// Without a free slot by the end, the rest is missed.
		select {
		case slots <- struct{}{}:
		default:
			res.Waited++
			select {
			case slots <- struct{}{}:
			case <-stop.Done():
				broken = true
				break schedule
			}
		}
		key, path := picker.Next()
		res.Sent++
		lags.Record(time.Since(at))
		wg.Go(func() {
			defer func() { <-slots }()
			r.send(ctx, at, Request{Key: key, Path: path})
		})
	}
	if broken {
		// Requests due before the schedule stopped: i with
		// start + i·interval before min(now, end).
		horizon := min(time.Since(start), cfg.Duration)
		dueCount := int64(math.Ceil(float64(horizon) / interval))
		if cfg.Requests > 0 {
			dueCount = min(dueCount, cfg.Requests)
		}
		res.Missed = max(dueCount-res.Sent, 0)
	}
	res.SendLag = lags.Summary()
	wg.Wait()
	res.Elapsed = time.Since(start)
	res.StoppedBy = stoppedBy(ctx, cfg.Requests, res.Sent)
	return res, nil
}

func stoppedBy(ctx context.Context, requests, sent int64) string {
	switch {
	case ctx.Err() != nil:
		return StoppedByInterrupted
	case requests > 0 && sent >= requests:
		return StoppedByRequests
	default:
		return StoppedByDuration
	}
}
