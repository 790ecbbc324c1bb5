package loadtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate/internal/promtext"
	"github.com/tollgate/tollgate/internal/service"
	"github.com/tollgate/tollgate/loadtest/internal/cmdstats"
	"github.com/tollgate/tollgate/loadtest/internal/procstat"
	"github.com/tollgate/tollgate/loadtest/internal/report"
	"github.com/tollgate/tollgate/loadtest/internal/target"
)

// The retry storm: many clients of one tenant poll at a
// multiple of their key's limit and retry every rejection at once,
// ignoring Retry-After, each from a loopback address of its own, beside a
// well-behaved key of the same tenant that honours Retry-After. The run
// samples the gateway's CPU (its /proc rusage), its Redis calls and the
// key's penalty level as the aggregator climbs the ladder, and reports what
// the storm cost per second and per rejection before the first penalty, at
// each level and at the top.

// Defaults of StormConfig: the keys configs/rules.yaml registers for the
// scenario (tenant ci, tier pro: 1000 requests a minute each), and the
// local stack's addresses (make run).
const (
	DefaultStormKey      = "sk_prod_ci_storm"
	DefaultPoliteKey     = "sk_prod_ci_polite"
	DefaultStormPath     = "/v1/items"
	DefaultStormClients  = 200
	DefaultStormLimit    = 1000.0 / 60
	DefaultStormFactor   = 10
	DefaultStormSource   = "127.0.0.2"
	DefaultPoliteSource  = "127.0.1.1"
	DefaultPoliteRate    = 2
	DefaultStormDuration = 3 * time.Minute
	DefaultStormHold     = 30 * time.Second
	DefaultStormSettle   = 5 * time.Second
	DefaultStormInterval = 250 * time.Millisecond
	DefaultMetricsURL    = "http://127.0.0.1:9091/metrics"
	DefaultAdminURL      = "http://127.0.0.1:8081"
	// TopLevel is the penalty ladder's top level (blocklist, the
	// connection-level answer).
	TopLevel = 3
)

// StormConfig describes one retry storm. Start from DefaultStormConfig.
type StormConfig struct {
	// URL is the gateway proxy's base URL; Path is appended.
	URL, Path string
	// Key is the storm's API key, PoliteKey the well-behaved one; both of
	// one tenant in the gateway's key registry.
	Key, PoliteKey string
	// Clients is the number of storm clients, each on its own source
	// address counting up from Source (127.0.0.2, 127.0.0.3, …: Linux
	// routes all of 127/8 to loopback).
	Clients int
	Source  string
	// Limit is the storm key's limit in requests per second; the clients
	// poll at Factor × Limit together, and retry every rejection at once.
	Limit, Factor float64
	// PoliteSource is the polite client's address; it polls at PoliteRate
	// per second and waits out every Retry-After.
	PoliteSource string
	PoliteRate   float64
	// Duration bounds the run (at most MaxDuration). The run stops earlier
	// once the key has been at TopLevel for Hold; the first Settle of that
	// is the transition, not measured as the top.
	Duration, Hold, Settle time.Duration
	// Interval is the sampling interval. Timeout bounds each request.
	Interval, Timeout time.Duration
	// PID is the gateway's process: its CPU per second is the storm's
	// cost. 0: not measured.
	PID int
	// Metrics is the gateway's /metrics URL: its Redis calls, levels and
	// connection figures. Empty: not read.
	Metrics string
	// Redis lists Redis servers whose INFO commandstats count EVALSHA
	// (server-wide), beside the gateway's own count. Empty: not read.
	Redis                        []string
	RedisUsername, RedisPassword string
	// Admin is the aggregator's operator API (GET and DELETE
	// /admin/v1/penalties/{key}), with AdminToken. Empty: the level comes
	// from the gateway's tollgate_penalized_keys alone.
	Admin, AdminToken string
	// Lift lifts a penalty either key still has from an earlier run before
	// the storm starts, and the storm key's at the end (needs Admin).
	Lift bool
}

// DefaultStormConfig returns the defaults (no PID, no Redis, no token).
func DefaultStormConfig() StormConfig {
	return StormConfig{
		URL: DefaultProxyURL, Path: DefaultStormPath, Key: DefaultStormKey, PoliteKey: DefaultPoliteKey,
		Clients: DefaultStormClients, Source: DefaultStormSource, Limit: DefaultStormLimit, Factor: DefaultStormFactor,
		PoliteSource: DefaultPoliteSource, PoliteRate: DefaultPoliteRate,
		Duration: DefaultStormDuration, Hold: DefaultStormHold, Settle: DefaultStormSettle,
		Interval: DefaultStormInterval, Timeout: 5 * time.Second,
		Metrics: DefaultMetricsURL, Admin: DefaultAdminURL, Lift: true,
	}
}

// Validate reports every problem with c at once.
func (c StormConfig) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("loadtest storm: "+format, args...)) }
	for _, u := range []struct{ name, v string }{{"url", c.URL}, {"metrics", c.Metrics}, {"admin", c.Admin}} {
		if u.v == "" && u.name != "url" {
			continue
		}
		if p, err := url.Parse(u.v); err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			bad("%s %q is not an http(s) URL", u.name, u.v)
		}
	}
	if !strings.HasPrefix(c.Path, "/") {
		bad("path %q must start with /", c.Path)
	}
	if c.Key == "" || c.PoliteKey == "" || c.Key == c.PoliteKey {
		bad("the storm key and the polite key must be set and differ")
	}
	if c.Clients < 1 || c.Clients > 60_000 {
		bad("clients must be in [1, 60000], got %d", c.Clients)
	}
	src, err := netip.ParseAddr(c.Source)
	if err != nil || !src.Is4() || !src.IsLoopback() {
		bad("source %q must be an IPv4 loopback address (127.x.y.z)", c.Source)
	}
	pol, err := netip.ParseAddr(c.PoliteSource)
	switch {
	case err != nil || !pol.IsLoopback():
		bad("polite source %q must be a loopback address", c.PoliteSource)
	case src.IsValid() && c.Clients > 0 && !pol.Less(src) && !lastSource(src, c.Clients).Less(pol):
		bad("polite source %s is among the storm's addresses %s–%s", pol, src, lastSource(src, c.Clients))
	}
	if !(c.Limit > 0) || !(c.Factor > 0) || !(c.PoliteRate > 0) || math.IsInf(c.Limit*c.Factor, 0) {
		bad("limit, factor and polite rate must be positive")
	}
	switch {
	case c.Duration <= 0 || c.Duration > MaxDuration:
		bad("duration must be in (0, %v], got %v", MaxDuration, c.Duration)
	case c.Hold <= 0 || c.Settle < 0 || c.Settle >= c.Hold:
		bad("hold must be positive and longer than settle (%v, %v)", c.Hold, c.Settle)
	}
	if c.Interval < 10*time.Millisecond || c.Timeout <= 0 {
		bad("interval must be at least 10ms and timeout positive")
	}
	if c.PID < 0 {
		bad("pid must be ≥ 0")
	}
	if c.Lift && (c.Admin == "" || c.AdminToken == "") {
		bad("lifting penalties needs the operator API and its token (-admin, $TOLLGATE_ADMIN_TOKEN); or -lift=false")
	}
	return errors.Join(errs...)
}

// lastSource is the address of the last of n storm clients from first.
func lastSource(first netip.Addr, n int) netip.Addr {
	v := first.As4()
	x := uint32(v[0])<<24 | uint32(v[1])<<16 | uint32(v[2])<<8 | uint32(v[3])
	x += uint32(n - 1)
	return netip.AddrFrom4([4]byte{byte(x >> 24), byte(x >> 16), byte(x >> 8), byte(x)})
}

// StormSummary is the end of a storm run. Its JSON form is `loadtest storm
// -json`; field names are stable.
type StormSummary struct {
	URL            string  `json:"url"`
	Key            string  `json:"key"`
	PoliteKey      string  `json:"polite_key"`
	Clients        int     `json:"clients"`
	Sources        string  `json:"sources"`
	PollRate       float64 `json:"poll_rate"`
	PoliteSource   string  `json:"polite_source"`
	StoppedBy      string  `json:"stopped_by"` // "top level held", "duration" or "interrupted"
	ElapsedSeconds float64 `json:"elapsed_seconds"`
	// FirstRejection is when the storm got its first rejection, in
	// seconds since the clients started (-1: never): the clients poll
	// within the key's limit until then.
	FirstRejection float64 `json:"first_rejection_seconds"`

	// Levels lists when the key reached each level, in seconds since the
	// storm started: as the operator API reported it (aggregator) and as
	// the gateway enforced it (its tollgate_penalized_keys); -1: not seen.
	Levels []LevelTime `json:"levels"`
	// Phases: the storm's cost at each level; the last is the top after
	// Settle (steady).
	Phases []StormPhase `json:"phases"`
	// CPURatio is the gateway CPU per second before the first penalty
	// divided by that at the top (steady); 0 when either is unknown.
	// CPURatioAgainst names the phase it divides: the storm before any
	// penalty, or level 1 when the first step came too soon to measure it.
	CPURatio        float64 `json:"cpu_ratio"`
	CPURatioAgainst string  `json:"cpu_ratio_against"`
	// RedisPerRejectionPenalised is the Redis calls per storm rejection
	// once the key was answered from memory (levels 2 and up); -1 when
	// unknown.
	RedisPerRejectionPenalised float64 `json:"redis_calls_per_rejection_penalised"`
	// RedisPerRejectionTop is the same at the top, steady (-1: unknown),
	// and ReturnedPenalised the lease units the gateway gave back to Redis
	// from level 2 on (its tollgate_fastpath_returned_units_total): in the
	// seconds after the penalty the gateway returns what the storm's
	// counters still held from before it, and each return is a Redis call
	// that the figure from level 2 on counts, though no rejection made it.
	RedisPerRejectionTop float64 `json:"redis_calls_per_rejection_top"`
	ReturnedPenalised    float64 `json:"lease_units_returned_penalised"`
	// RedisResiduePenalised is the Redis calls from level 2 on beyond one
	// per polite request, and PoliteRequestsPenalised the polite requests
	// meanwhile: a residue no larger than those can be the polite client's
	// own lease calls.
	RedisResiduePenalised   float64 `json:"redis_calls_residue_penalised"`
	PoliteRequestsPenalised int64   `json:"polite_requests_penalised"`
	// TopRedisResidue and TopPoliteRequests are the same at the steady
	// top (-1: unknown).
	TopRedisResidue   float64 `json:"redis_calls_residue_top"`
	TopPoliteRequests int64   `json:"polite_requests_top"`

	Storm  StormCounts  `json:"storm"`
	Polite PoliteResult `json:"polite"`
	// Gateway figures over the run (from its metrics): connections closed
	// for the top of the ladder and connections throttled at accept.
	ConnectionsClosed float64 `json:"connections_closed"`
	AcceptDelayed     float64 `json:"accept_delayed"`
	AcceptRefused     float64 `json:"accept_refused"`

	LoadtestCPUSeconds float64 `json:"loadtest_cpu_seconds"`
	Notes              []string

	samples  []stormSample
	recorder *report.Recorder
}

// LevelTime is when the key reached one level of the ladder.
type LevelTime struct {
	Level      int     `json:"level"`
	Aggregator float64 `json:"aggregator_seconds"`
	Gateway    float64 `json:"gateway_seconds"`
}

// StormPhase is the storm's cost over one stretch of the run.
type StormPhase struct {
	Name        string  `json:"name"`
	Level       int     `json:"level"`
	FromSeconds float64 `json:"from_seconds"`
	ToSeconds   float64 `json:"to_seconds"`
	Answers     int64   `json:"answers"`
	Rejections  int64   `json:"rejections"`
	// AnswersPerSecond is the storm's answers per second.
	AnswersPerSecond float64 `json:"answers_per_second"`
	// CPUPerSecond is the gateway's CPU seconds per second (1 = one core
	// busy); CPUPerRejection its CPU µs per storm rejection. -1: unknown.
	CPUPerSecond    float64 `json:"gateway_cpu_per_second"`
	CPUPerRejection float64 `json:"gateway_cpu_us_per_rejection"`
	// RedisPerRejection is the Redis calls the storm caused per rejection
	// (the gateway's tollgate_redis_calls_total, less the polite key's
	// one call per request), -1: unknown; EvalSHAPerRejection the same
	// from INFO commandstats (server-wide).
	RedisPerRejection   float64 `json:"redis_calls_per_rejection"`
	EvalSHAPerRejection float64 `json:"evalsha_per_rejection"`
	// RedisResidue is the gateway's Redis calls beyond one per polite
	// request, PoliteRequests the polite requests: the counts behind
	// RedisPerRejection.
	RedisResidue   float64 `json:"redis_calls_residue"`
	PoliteRequests int64   `json:"polite_requests"`
}

// StormCounts are the storm clients' answers.
type StormCounts struct {
	Answers     int64 `json:"answers"`
	OK          int64 `json:"ok"`
	RateLimited int64 `json:"rate_limited"` // 429 of a rule
	Penalty     int64 `json:"penalty"`      // 429 PENALTY
	Blocked     int64 `json:"blocked"`      // 403
	Other       int64 `json:"other"`
	Errors      int64 `json:"errors"`
	Closed      int64 `json:"closed"` // answers with Connection: close
}

// PoliteResult is what the well-behaved key saw.
type PoliteResult struct {
	Requests    int64   `json:"requests"`
	OK          int64   `json:"ok"`
	RateLimited int64   `json:"rate_limited"`
	Penalised   int64   `json:"penalised"` // 429 PENALTY or 403
	Errors      int64   `json:"errors"`
	Closed      int64   `json:"closed"`
	WaitedOut   float64 `json:"waited_out_seconds"` // Retry-After honoured
	MaxLatency  float64 `json:"max_latency_ms"`
	// Level and History are the polite key's penalty state at the end
	// (operator API); -1: unknown.
	Level   int `json:"level"`
	History int `json:"history"`
}

// stormSample is one sampling instant.
type stormSample struct {
	at                       time.Duration
	cpu                      time.Duration
	cpuOK                    bool
	redis, evalsha           float64
	redisOK, evalOK          bool
	answers, rejections      int64
	politeReq                int64
	level                    int // aggregator, -1 unknown
	gwLevel                  int // highest level the gateway holds a key at, -1 unknown
	closed, delayed, refused float64
	returned                 float64 // lease units the gateway gave back
}

// stormClient counters, shared by all storm clients.
type stormCounters struct {
	ok, limited, penalty, blocked, other, errs, closed atomic.Int64
}

func (c *stormCounters) answers() int64 {
	return c.ok.Load() + c.limited.Load() + c.penalty.Load() + c.blocked.Load() + c.other.Load()
}

func (c *stormCounters) rejections() int64 {
	return c.limited.Load() + c.penalty.Load() + c.blocked.Load()
}

type politeCounters struct {
	req, ok, limited, penalised, errs, closed atomic.Int64
	waited, maxLatency                        atomic.Int64 // ns
}

// RunStorm runs the retry storm described by cfg and returns its summary
// once it is over: the key held the top level for cfg.Hold, cfg.Duration
// passed, or ctx was cancelled. It starts cfg.Clients storm goroutines, the
// polite client, a sampler and (with progress) a progress writer, and waits
// for all of them. A failure to read the gateway's process or metrics, or
// the operator API, before the start ends RunStorm with an error and no
// load sent.
func RunStorm(ctx context.Context, cfg StormConfig, progress io.Writer) (*StormSummary, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &stormRun{cfg: cfg, http: &http.Client{Timeout: 5 * time.Second}}
	defer r.http.CloseIdleConnections()
	if len(cfg.Redis) > 0 {
		r.cmd = cmdstats.NewSampler(cfg.Redis, cmdstats.Credentials{Username: cfg.RedisUsername, Password: cfg.RedisPassword})
		defer r.cmd.Close()
	}
	if err := r.prepare(ctx, progress); err != nil {
		return nil, err
	}
	return r.run(ctx, progress)
}

// stormRun is one run's state.
type stormRun struct {
	cfg      StormConfig
	http     *http.Client // metrics and the operator API
	cmd      *cmdstats.Sampler
	storm    stormCounters
	polite   politeCounters
	rec      *report.Recorder
	start    time.Time
	noAdmin  bool // the operator API has no penalties endpoint
	mu       sync.Mutex
	samples  []stormSample
	topSince time.Duration // -1 until the top level is seen

	firstRejection atomic.Int64  // ns since start; 0: none yet
	lastScrape     time.Duration // of the gateway's metrics; -1: never (sampler's)
}

// topMetricsEvery is how often the gateway's /metrics is read once the key
// is at the top: a scrape costs the gateway about 1.5 ms of CPU, which at
// the top is a measurable share of what the storm costs.
const topMetricsEvery = 2 * time.Second

// metricsEvery is how often the sampler reads the gateway's metrics now:
// every sample until the key is at the top, then every topMetricsEvery.
func (r *stormRun) metricsEvery() time.Duration {
	if r.topSince >= 0 {
		return topMetricsEvery
	}
	return r.cfg.Interval
}

// prepare checks what the run measures and clears what an earlier run
// left: the keys' penalties (Lift) and throttled addresses (waited out).
func (r *stormRun) prepare(ctx context.Context, progress io.Writer) error {
	cfg := r.cfg
	if cfg.PID > 0 {
		if _, err := procstat.CPUTime(cfg.PID); err != nil {
			return fmt.Errorf("loadtest storm: gateway cpu: %w", err)
		}
	}
	if r.cmd != nil {
		if _, err := r.cmd.Sample(ctx); err != nil {
			return fmt.Errorf("loadtest storm: %w", err)
		}
	}
	if cfg.Admin != "" && cfg.AdminToken != "" {
		for _, key := range []string{cfg.Key, cfg.PoliteKey} {
			level, _, err := r.penalty(ctx, key)
			switch {
			case errors.Is(err, errNoPenaltyAPI):
				r.noAdmin = true
			case err != nil:
				return err
			case level > 0 && cfg.Lift:
				if err := r.lift(ctx, key); err != nil {
					return err
				}
				say(progress, "lifted the level %d penalty an earlier run left on %s", level, keyPrefix(key))
			case level > 0:
				return fmt.Errorf("loadtest storm: %s is at penalty level %d already: lift it (DELETE /admin/v1/penalties/{key}) or run with -lift", keyPrefix(key), level)
			}
			if r.noAdmin {
				break
			}
		}
	} else {
		r.noAdmin = true
	}
	if cfg.Metrics == "" {
		return nil
	}
	ss, err := promtext.Get(ctx, r.http, cfg.Metrics)
	if err != nil {
		return fmt.Errorf("loadtest storm: gateway metrics: %w", err)
	}
	if ss.Sum("tollgate_accept_throttled_addresses") == 0 {
		return nil
	}
	// An earlier storm's addresses are still throttled: a storm now would
	// start half-throttled and its "before" would mean nothing.
	say(progress, "waiting until the gateway no longer throttles an earlier run's addresses (offenders.throttle_for)")
	deadline := time.Now().Add(3 * time.Minute)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
		ss, err := promtext.Get(ctx, r.http, cfg.Metrics)
		if err != nil {
			return fmt.Errorf("loadtest storm: gateway metrics: %w", err)
		}
		if ss.Sum("tollgate_accept_throttled_addresses") == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("loadtest storm: the gateway still throttles addresses after 3 minutes")
		}
	}
}

func say(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, format+"\n", args...)
	}
}

// keyPrefix is how the run names a key on screen: a short prefix, as the
// gateway's logs do.
func keyPrefix(key string) string {
	return key[:min(len(key), 10)] + "…"
}

func (r *stormRun) run(ctx context.Context, progress io.Writer) (*StormSummary, error) {
	cfg := r.cfg
	ctx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	stop, stopStorm := context.WithCancel(ctx) // ended by the sampler once the top was held
	defer stopStorm()

	r.rec = report.NewRecorder(target.HTTPOutcomes)
	r.topSince, r.lastScrape = -1, -1
	selfBefore, selfErr := procstat.CPUTime(os.Getpid())
	r.start = time.Now()
	var cpu0 time.Duration
	if cfg.PID > 0 {
		cpu0, _ = procstat.CPUTime(cfg.PID)
	}

	var wg sync.WaitGroup
	src, _ := netip.ParseAddr(cfg.Source)
	period := time.Duration(float64(cfg.Clients) / (cfg.Limit * cfg.Factor) * float64(time.Second))
	for i := range cfg.Clients {
		a := src
		if i > 0 {
			a = lastSource(src, i+1)
		}
		offset := time.Duration(int64(period) * int64(i) / int64(cfg.Clients))
		wg.Go(func() { r.stormClient(stop, a, offset, period) })
	}
	wg.Go(func() { r.politeClient(stop) })
	var samplerWG sync.WaitGroup
	samplerWG.Go(func() { r.sample(stop, stopStorm, cpu0, progress) })
	samplerWG.Wait()
	stopStorm()
	wg.Wait()
	elapsed := time.Since(r.start)

	s := r.summarize(elapsed)
	switch {
	case r.topSince >= 0 && ctx.Err() == nil:
		s.StoppedBy = "top level held"
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		s.StoppedBy = "duration"
		if r.topSince < 0 {
			s.Notes = append(s.Notes, fmt.Sprintf("the key did not reach level %d within %v", TopLevel, cfg.Duration))
		}
	default:
		s.StoppedBy = "interrupted"
	}
	if selfErr == nil {
		if after, err := procstat.CPUTime(os.Getpid()); err == nil {
			s.LoadtestCPUSeconds = (after - selfBefore).Seconds()
		}
	}
	after := context.WithoutCancel(ctx)
	s.Polite.Level, s.Polite.History = -1, -1
	if !r.noAdmin {
		actx, acancel := context.WithTimeout(after, 10*time.Second)
		defer acancel()
		if level, hist, err := r.penalty(actx, cfg.PoliteKey); err == nil {
			s.Polite.Level, s.Polite.History = level, hist
		}
		if cfg.Lift {
			// Connections the gateway still holds at accept carry requests
			// it will decide once it releases them: a lift before that would
			// have them count towards a new penalty.
			r.waitHeld(actx)
			if err := r.lift(actx, cfg.Key); err != nil {
				s.Notes = append(s.Notes, "lifting the storm key's penalty: "+err.Error())
			} else {
				s.Notes = append(s.Notes, "the storm key's penalty was lifted at the end (DELETE /admin/v1/penalties/{key})")
			}
		}
	}
	return s, nil
}

// stormClient polls from its own address at one request per period
// (starting at offset) and retries every answer that is not a 2xx — and
// every failure — at once.
func (r *stormRun) stormClient(ctx context.Context, src netip.Addr, offset, period time.Duration) {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: r.cfg.Timeout, LocalAddr: &net.TCPAddr{IP: src.AsSlice()}}).DialContext,
		MaxIdleConnsPerHost: 1,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: r.cfg.Timeout, CheckRedirect: noRedirect}
	u := strings.TrimSuffix(r.cfg.URL, "/") + r.cfg.Path
	next := r.start.Add(offset)
	timer := time.NewTimer(time.Until(next))
	defer timer.Stop()
	for service.Wait(ctx, timer.C) {
		for {
			status, closed, penalty, err := r.send(ctx, client, u, r.cfg.Key)
			if ctx.Err() != nil {
				return
			}
			r.countStorm(status, closed, penalty, err)
			if err == nil && status/100 == 2 {
				break
			}
		}
		next = next.Add(period)
		timer.Reset(time.Until(next))
	}
}

func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// send sends one GET with key and reads the answer: its status, whether
// it closed the connection, and whether a 429 was a penalty's (its body's
// code PENALTY).
func (r *stormRun) send(ctx context.Context, client *http.Client, u, key string) (status int, closed, penalty bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, false, false, err
	}
	req.Header.Set("X-API-Key", key)
	r.rec.Begin()
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			r.rec.Cancel()
		} else {
			r.rec.Error(err)
		}
		return 0, false, false, err
	}
	o, err := target.Finish(resp)
	if err != nil {
		r.rec.Error(err)
		return 0, false, false, err
	}
	r.rec.Record(o, start, time.Since(start))
	return resp.StatusCode, resp.Close, o == target.HTTP429Penalty, nil
}

func (r *stormRun) countStorm(status int, closed, penalty bool, err error) {
	c := &r.storm
	switch {
	case err != nil:
		c.errs.Add(1)
		return
	case status/100 == 2:
		c.ok.Add(1)
	case status == http.StatusTooManyRequests && penalty:
		c.penalty.Add(1)
	case status == http.StatusTooManyRequests:
		c.limited.Add(1)
	case status == http.StatusForbidden:
		c.blocked.Add(1)
	default:
		c.other.Add(1)
	}
	if closed {
		c.closed.Add(1)
	}
	if status == http.StatusTooManyRequests || status == http.StatusForbidden {
		if r.firstRejection.Load() == 0 {
			r.firstRejection.CompareAndSwap(0, int64(max(time.Since(r.start), 1)))
		}
	}
}

// politeClient polls at PoliteRate and, on a 429, waits its Retry-After.
func (r *stormRun) politeClient(ctx context.Context) {
	src, _ := netip.ParseAddr(r.cfg.PoliteSource)
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: r.cfg.Timeout, LocalAddr: &net.TCPAddr{IP: src.AsSlice()}}).DialContext,
		MaxIdleConnsPerHost: 1,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: r.cfg.Timeout, CheckRedirect: noRedirect}
	u := strings.TrimSuffix(r.cfg.URL, "/") + r.cfg.Path
	period := time.Duration(float64(time.Second) / r.cfg.PoliteRate)
	p := &r.polite
	timer := time.NewTimer(0)
	defer timer.Stop()
	for service.Wait(ctx, timer.C) {
		wait := period
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		req.Header.Set("X-API-Key", r.cfg.PoliteKey)
		start := time.Now()
		resp, err := client.Do(req)
		if ctx.Err() != nil {
			return
		}
		p.req.Add(1)
		if err != nil {
			p.errs.Add(1)
		} else {
			o, _ := target.Finish(resp)
			lat := int64(time.Since(start))
			for cur := p.maxLatency.Load(); lat > cur && !p.maxLatency.CompareAndSwap(cur, lat); cur = p.maxLatency.Load() {
			}
			if resp.Close {
				p.closed.Add(1)
			}
			switch {
			case resp.StatusCode/100 == 2:
				p.ok.Add(1)
			case resp.StatusCode == http.StatusForbidden, o == target.HTTP429Penalty:
				p.penalised.Add(1)
			case resp.StatusCode == http.StatusTooManyRequests:
				p.limited.Add(1)
			}
			if resp.StatusCode == http.StatusTooManyRequests {
				if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && ra > 0 {
					wait = max(wait, time.Duration(ra)*time.Second)
					p.waited.Add(int64(time.Duration(ra) * time.Second))
				}
			}
		}
		timer.Reset(wait)
	}
}

// sample takes a sample every Interval until ctx ends, writes a progress
// line every second, and ends the storm (stopStorm) once the key has held
// the top level for Hold.
func (r *stormRun) sample(ctx context.Context, stopStorm context.CancelFunc, cpu0 time.Duration, progress io.Writer) {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	lastLine := time.Duration(0)
	var prev stormSample
	first := true
	for {
		s := r.takeSample(ctx, cpu0)
		r.mu.Lock()
		r.samples = append(r.samples, s)
		r.mu.Unlock()
		if r.topSince < 0 && s.levelNow() >= TopLevel {
			r.topSince = s.at
		}
		if progress != nil && (first || s.at-lastLine >= time.Second) {
			if !first {
				fmt.Fprintln(progress, progressLine(prev, s))
			}
			prev, lastLine, first = s, s.at, false
		}
		if r.topSince >= 0 && s.at-r.topSince >= r.cfg.Hold {
			stopStorm()
			return
		}
		if !service.Wait(ctx, t.C) {
			return
		}
	}
}

// levelNow is the key's level at the sample: the aggregator's, else the
// gateway's.
func (s stormSample) levelNow() int {
	if s.level >= 0 {
		return s.level
	}
	return max(s.gwLevel, 0)
}

func (r *stormRun) takeSample(ctx context.Context, cpu0 time.Duration) stormSample {
	s := stormSample{level: -1, gwLevel: -1}
	// Counters first, then the gateway's figures: they are read within a
	// few milliseconds of each other.
	s.answers, s.rejections = r.storm.answers(), r.storm.rejections()
	s.politeReq = r.polite.req.Load()
	s.at = time.Since(r.start)
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if r.cfg.PID > 0 {
		if c, err := procstat.CPUTime(r.cfg.PID); err == nil {
			s.cpu, s.cpuOK = c-cpu0, true
		}
	}
	// Half an interval's slack: the ticker does not wait to the nanosecond.
	scrape := r.cfg.Metrics != "" && (r.lastScrape < 0 || s.at-r.lastScrape >= r.metricsEvery()-r.cfg.Interval/2)
	if !scrape && len(r.samples) > 0 {
		prev := r.samples[len(r.samples)-1]
		s.gwLevel, s.closed, s.delayed, s.refused, s.returned = prev.gwLevel, prev.closed, prev.delayed, prev.refused, prev.returned
	}
	if scrape {
		r.lastScrape = s.at
		if ss, err := promtext.Get(qctx, r.http, r.cfg.Metrics); err == nil {
			s.redis, s.redisOK = ss.Sum("tollgate_redis_calls_total"), true
			for level := TopLevel; level >= 1; level-- {
				if ss.Sum("tollgate_penalized_keys", `level="`+strconv.Itoa(level)+`"`) > 0 {
					s.gwLevel = level
					break
				}
			}
			if s.gwLevel < 0 {
				s.gwLevel = 0
			}
			s.closed = ss.Sum("tollgate_penalty_connections_closed_total", `reason="penalty"`)
			s.delayed = ss.Sum("tollgate_accept_throttled_total", `outcome="delayed"`)
			s.refused = ss.Sum("tollgate_accept_throttled_total", `outcome="refused"`)
			s.returned = ss.Sum("tollgate_fastpath_returned_units_total")
		}
	}
	if r.cmd != nil {
		if st, err := r.cmd.Sample(qctx); err == nil {
			s.evalsha, s.evalOK = float64(st.EvalSHA()), true
		}
	}
	if !r.noAdmin {
		if level, _, err := r.penalty(qctx, r.cfg.Key); err == nil {
			s.level = level
		}
	}
	return s
}

func progressLine(a, b stormSample) string {
	dt := (b.at - a.at).Seconds()
	line := fmt.Sprintf("%6.1fs  storm %7.0f answers/s  level %s", b.at.Seconds(),
		float64(b.answers-a.answers)/dt, levelText(b))
	if a.cpuOK && b.cpuOK {
		line += fmt.Sprintf("  gateway CPU %.2f s/s", (b.cpu-a.cpu).Seconds()/dt)
	}
	if a.redisOK && b.redisOK && b.rejections > a.rejections {
		calls := b.redis - a.redis - float64(b.politeReq-a.politeReq)
		line += fmt.Sprintf("  redis %.3f/rejection", max(calls, 0)/float64(b.rejections-a.rejections))
	}
	return line
}

func levelText(s stormSample) string {
	switch {
	case s.level >= 0 && s.gwLevel >= 0:
		return fmt.Sprintf("%d (gateway %d)", s.level, s.gwLevel)
	case s.level >= 0:
		return strconv.Itoa(s.level)
	case s.gwLevel >= 0:
		return fmt.Sprintf("gateway %d", s.gwLevel)
	}
	return "?"
}

// waitHeld waits until the gateway holds no connection at accept, and one
// sampling interval more for the last released ones to be decided.
func (r *stormRun) waitHeld(ctx context.Context) {
	if r.cfg.Metrics == "" {
		return
	}
	for ctx.Err() == nil {
		ss, err := promtext.Get(ctx, r.http, r.cfg.Metrics)
		if err != nil || ss.Sum("tollgate_accept_held_connections") == 0 {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(r.cfg.Interval):
		}
	}
	select {
	case <-ctx.Done():
	case <-time.After(r.cfg.Interval):
	}
}

// errNoPenaltyAPI: the operator API answered 404 for the penalties path
// itself (an aggregator without the penalty ladder).
var errNoPenaltyAPI = errors.New("loadtest storm: the operator API has no /admin/v1/penalties")

// penalty returns key's level and the length of its history from the
// operator API.
func (r *stormRun) penalty(ctx context.Context, key string) (level, history int, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet,
		strings.TrimSuffix(r.cfg.Admin, "/")+"/admin/v1/penalties/"+url.PathEscape(key), nil)
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Authorization", "Bearer "+r.cfg.AdminToken)
	resp, err := r.http.Do(req)
	if err != nil {
		return 0, 0, fmt.Errorf("loadtest storm: operator API: %w", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	switch {
	case resp.StatusCode == http.StatusNotFound && !strings.Contains(string(b), `"level"`):
		return 0, 0, errNoPenaltyAPI
	case resp.StatusCode != http.StatusOK:
		return 0, 0, fmt.Errorf("loadtest storm: GET penalties of %s: %s %s", keyPrefix(key), resp.Status, strings.TrimSpace(string(b)))
	}
	var p struct {
		Level   int               `json:"level"`
		History []json.RawMessage `json:"history"`
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return 0, 0, fmt.Errorf("loadtest storm: penalties of %s: %w", keyPrefix(key), err)
	}
	return p.Level, len(p.History), nil
}

// lift lifts key's penalty (a key without one is fine).
func (r *stormRun) lift(ctx context.Context, key string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete,
		strings.TrimSuffix(r.cfg.Admin, "/")+"/admin/v1/penalties/"+url.PathEscape(key)+"?reason=loadtest+storm", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+r.cfg.AdminToken)
	req.Header.Set("X-Tollgate-Actor", "loadtest")
	resp, err := r.http.Do(req)
	if err != nil {
		return fmt.Errorf("loadtest storm: lift: %w", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode/100 != 2 && resp.StatusCode != http.StatusNotFound {
		return fmt.Errorf("loadtest storm: lift %s: %s %s", keyPrefix(key), resp.Status, strings.TrimSpace(string(b)))
	}
	return nil
}
