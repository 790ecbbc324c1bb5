package loadtest

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/netip"
	"strings"
	"time"

	"github.com/tollgate/tollgate/loadtest/internal/procstat"
	"github.com/tollgate/tollgate/loadtest/internal/report"
)

// withinLimit names the phase before the storm's first rejection.
const withinLimit = "level 0, polling within the limit"

// procstatTick is the resolution of a process's CPU time.
var procstatTick = procstat.TicksToDuration(1)

// levelNames name the ladder's levels (docs/aggregator.md).
var levelNames = [TopLevel + 1]string{"storm, before any penalty", "reduced limit", "cooldown, 429 PENALTY", "blocklist, connection level"}

// summarize builds the summary from the run's samples.
func (r *stormRun) summarize(elapsed time.Duration) *StormSummary {
	cfg := r.cfg
	src, _ := netip.ParseAddr(cfg.Source)
	s := &StormSummary{
		URL: strings.TrimSuffix(cfg.URL, "/") + cfg.Path, Key: keyPrefix(cfg.Key), PoliteKey: keyPrefix(cfg.PoliteKey),
		Clients: cfg.Clients, Sources: src.String() + "–" + lastSource(src, cfg.Clients).String(),
		PollRate: cfg.Limit * cfg.Factor, PoliteSource: cfg.PoliteSource,
		ElapsedSeconds: elapsed.Seconds(), RedisPerRejectionPenalised: -1, RedisPerRejectionTop: -1, FirstRejection: -1,
		recorder: r.rec,
	}
	r.mu.Lock()
	samples := append([]stormSample(nil), r.samples...)
	r.mu.Unlock()
	s.samples = samples

	c := &r.storm
	s.Storm = StormCounts{Answers: c.answers(), OK: c.ok.Load(), RateLimited: c.limited.Load(), Penalty: c.penalty.Load(),
		Blocked: c.blocked.Load(), Other: c.other.Load(), Errors: c.errs.Load(), Closed: c.closed.Load()}
	p := &r.polite
	s.Polite = PoliteResult{Requests: p.req.Load(), OK: p.ok.Load(), RateLimited: p.limited.Load(), Penalised: p.penalised.Load(),
		Errors: p.errs.Load(), Closed: p.closed.Load(), WaitedOut: time.Duration(p.waited.Load()).Seconds(),
		MaxLatency: float64(p.maxLatency.Load()) / 1e6}
	if ns := r.firstRejection.Load(); ns > 0 {
		s.FirstRejection = time.Duration(ns).Seconds()
	}
	if n := len(samples); n > 0 {
		first, last := samples[0], samples[n-1]
		s.ConnectionsClosed, s.AcceptDelayed, s.AcceptRefused = last.closed-first.closed, last.delayed-first.delayed, last.refused-first.refused
	}

	var start []int
	s.Levels, start = levelTimes(samples)

	// The phases: each level from its first sample to the next level's.
	if len(samples) < 2 {
		return s
	}
	before, reduced, top := -1, -1, -1 // indexes into s.Phases
	firstRej := -1                     // the first sample taken after a rejection
	for i, sm := range samples {
		if sm.rejections > 0 {
			firstRej = i
			break
		}
	}
	add := func(from, to int, name string, level int) int {
		ph, ok := phase(samples, from, to)
		if !ok {
			return -1
		}
		ph.Name, ph.Level = name, level
		s.Phases = append(s.Phases, ph)
		return len(s.Phases) - 1
	}
	for level := 0; level <= TopLevel; level++ {
		from := start[level]
		if level == 0 {
			from = 0
		}
		if from < 0 {
			continue
		}
		to := len(samples) - 1
		for next := level + 1; next <= TopLevel; next++ {
			if start[next] >= 0 {
				// The interval the key moved up in belongs to neither level.
				to = max(start[next]-1, from)
				break
			}
		}
		name := fmt.Sprintf("level %d (%s)", level, levelNames[level])
		if level > 0 {
			i := add(from, to, name, level)
			if level == 1 {
				reduced = i
			}
			continue
		}
		// The clients poll within the limit until the first 429: not a
		// storm yet. The interval the first 429 came in is neither.
		switch {
		case firstRej >= 0 && firstRej <= 1:
			before = add(0, to, name, 0)
		case firstRej < 0 || firstRej > to:
			add(0, to, withinLimit, 0)
		default:
			add(0, firstRej-1, withinLimit, 0)
			if firstRej < to {
				before = add(firstRej, to, name, 0)
			}
		}
	}
	if r.topSince >= 0 {
		for i, sm := range samples {
			if sm.at >= r.topSince+cfg.Settle {
				top = add(i, len(samples)-1, fmt.Sprintf("level %d, steady (after %v there)", TopLevel, cfg.Settle), TopLevel)
				break
			}
		}
	}
	if before < 0 && reduced >= 0 {
		// The first step came too soon after the first 429 to measure the
		// storm before it; the reduced limit is decided in Redis as before.
		before = reduced
		s.Notes = append(s.Notes, "the first step came within one sampling interval of the first 429, too soon to measure the storm before it: "+
			"the ratio is against level 1, whose rejections are still a rule's (decided in Redis, or from the fast path's negative cache once a counter is known to be over); "+
			"a higher penalty.backoff_min_ignored and penalty.rejection_min_requests leave the storm unpunished longer")
	}
	if before >= 0 && top >= 0 && s.Phases[before].CPUPerSecond > 0 && s.Phases[top].CPUPerSecond >= 0 {
		b, t := s.Phases[before], s.Phases[top]
		// A top that used less than one clock tick (10 ms) counts as one.
		tick := procstatTick.Seconds() / (t.ToSeconds - t.FromSeconds)
		s.CPURatio = b.CPUPerSecond / max(t.CPUPerSecond, tick)
		s.CPURatioAgainst = b.Name
	}
	// Once penalised: from the first interval that starts with the gateway
	// enforcing level 2 or more (where its metrics are read), so that no
	// decision made before it learned of the step counts.
	if from := penalisedFrom(samples, start[2]); from >= 0 {
		if ph, ok := phase(samples, from, len(samples)-1); ok {
			s.RedisPerRejectionPenalised = ph.RedisPerRejection
			s.RedisResiduePenalised, s.PoliteRequestsPenalised = ph.RedisResidue, ph.PoliteRequests
			s.ReturnedPenalised = samples[len(samples)-1].returned - samples[from].returned
		}
	}
	s.TopRedisResidue = -1
	if top >= 0 {
		s.RedisPerRejectionTop = s.Phases[top].RedisPerRejection
		if s.RedisPerRejectionTop >= 0 {
			s.TopRedisResidue, s.TopPoliteRequests = s.Phases[top].RedisResidue, s.Phases[top].PoliteRequests
		}
	}
	return s
}

// levelTimes says when the key reached each penalty level, by the
// aggregator's and the gateway's account, and start, the index of the
// first sample at each level by either (-1: never; start[TopLevel+1] is
// -1 too, so that the level above the top is never reached).
func levelTimes(samples []stormSample) (levels []LevelTime, start []int) {
	start = make([]int, TopLevel+2)
	start[TopLevel+1] = -1
	for level := 1; level <= TopLevel; level++ {
		lt := LevelTime{Level: level, Aggregator: -1, Gateway: -1}
		start[level] = -1
		for i, sm := range samples {
			if lt.Aggregator < 0 && sm.level >= level {
				lt.Aggregator = sm.at.Seconds()
			}
			if lt.Gateway < 0 && sm.gwLevel >= level {
				lt.Gateway = sm.at.Seconds()
			}
			if start[level] < 0 && sm.levelNow() >= level {
				start[level] = i
			}
		}
		levels = append(levels, lt)
	}
	return levels, start
}

// penalisedFrom returns the index of the first sample after which the
// gateway enforces level 2 or more: the sample after the first showing
// it, or after levelAt (the first at level 2 by any account) when the
// gateway's levels are unknown; -1 when there is none.
func penalisedFrom(samples []stormSample, levelAt int) int {
	if levelAt < 0 {
		return -1
	}
	for i := levelAt; i < len(samples); i++ {
		if samples[i].gwLevel >= 2 || (samples[i].gwLevel < 0 && i == levelAt) {
			if i+1 < len(samples) {
				return i + 1
			}
			return -1
		}
	}
	return -1
}

// phase measures the storm from samples[from] to samples[to]. The
// gateway's metrics are not read at every sample (see metricsEvery): its
// Redis calls are measured between the first and the last samples of the
// range that read them.
func phase(samples []stormSample, from, to int) (StormPhase, bool) {
	a, b := samples[from], samples[to]
	dt := (b.at - a.at).Seconds()
	if dt <= 0 {
		return StormPhase{}, false
	}
	ph := StormPhase{
		FromSeconds: a.at.Seconds(), ToSeconds: b.at.Seconds(),
		Answers: b.answers - a.answers, Rejections: b.rejections - a.rejections,
		CPUPerSecond: -1, CPUPerRejection: -1, RedisPerRejection: -1, EvalSHAPerRejection: -1,
	}
	ph.AnswersPerSecond = float64(ph.Answers) / dt
	if a.cpuOK && b.cpuOK {
		cpu := (b.cpu - a.cpu).Seconds()
		ph.CPUPerSecond = cpu / dt
		if ph.Rejections > 0 {
			ph.CPUPerRejection = cpu * 1e6 / float64(ph.Rejections)
		}
	}
	// Each polite request costs one Redis call; the storm's are the rest.
	perRejection := func(x, y stormSample, calls func(stormSample) float64) float64 {
		rej := y.rejections - x.rejections
		if rej <= 0 {
			return -1
		}
		return max(calls(y)-calls(x)-float64(y.politeReq-x.politeReq), 0) / float64(rej)
	}
	rf, rt := from, to
	for rf < to && !samples[rf].redisOK {
		rf++
	}
	for rt > rf && !samples[rt].redisOK {
		rt--
	}
	if rt > rf && samples[rf].redisOK && samples[rt].redisOK {
		x, y := samples[rf], samples[rt]
		ph.RedisPerRejection = perRejection(x, y, func(s stormSample) float64 { return s.redis })
		ph.RedisResidue = max(y.redis-x.redis-float64(y.politeReq-x.politeReq), 0)
		ph.PoliteRequests = y.politeReq - x.politeReq
	}
	if a.evalOK && b.evalOK {
		ph.EvalSHAPerRejection = perRejection(a, b, func(s stormSample) float64 { return s.evalsha })
	}
	return ph, true
}

// Untouched reports whether the polite key was never penalised nor
// throttled: no penalty answer, no closed connection (the gateway
// throttles only an address one of whose connections it closed for the
// top of the ladder, and the polite client keeps its one connection), and,
// where the operator API was read, level 0 with an empty history.
func (p PoliteResult) Untouched() bool {
	return p.Requests > 0 && p.Penalised == 0 && p.Closed == 0 && p.Level <= 0 && p.History <= 0
}

// WriteJSON writes s as indented JSON followed by a newline.
func (s *StormSummary) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(s)
}

func na(v float64, format string) string {
	if v < 0 {
		return "n/a"
	}
	return fmt.Sprintf(format, v)
}

// RedisVerdict says whether the storm cost Redis no call once penalised
// (levels 2 and up), and why. The gateway's Redis calls count every
// client's: the polite client's (one per request is subtracted; its lease
// takes and returns add a few) and, in the seconds after the penalty, the
// sweep's calls giving back the lease units of the storm's counters, which
// it had leased before the penalty (each call gives back one unit or
// more). So a residue of calls is met when the polite client's requests
// outnumber it, or when the units given back do too while the steady top,
// the sweep done, has no more calls than the polite client's requests
// there; and not met otherwise: then rejections called Redis.
func (s *StormSummary) RedisVerdict() (met bool, why string) {
	residue, polite := s.RedisResiduePenalised, float64(s.PoliteRequestsPenalised)
	switch {
	case s.RedisPerRejectionPenalised < 0:
		return false, "unknown"
	case residue == 0:
		return true, "met"
	case residue <= polite:
		return true, fmt.Sprintf("met: %s beyond one per polite request, fewer than the polite client's %.0f requests, whose lease takes and returns Redis counts too",
			calls(residue), polite)
	case residue <= polite+s.ReturnedPenalised && (s.TopRedisResidue < 0 || s.TopRedisResidue <= float64(s.TopPoliteRequests)):
		return true, fmt.Sprintf("met: %s beyond one per polite request while the gateway gave back %.0f lease units the storm's counters held from before the penalty (each return a call); at the steady top %s for %d polite requests",
			calls(residue), s.ReturnedPenalised, calls(max(s.TopRedisResidue, 0)), s.TopPoliteRequests)
	}
	return false, fmt.Sprintf("NOT met: %s beyond one per polite request, %.0f lease units given back", calls(residue), s.ReturnedPenalised)
}

// calls is "1 call" or "n calls".
func calls(n float64) string {
	if n == 1 {
		return "1 call"
	}
	return fmt.Sprintf("%.0f calls", n)
}

// WriteText writes s as the table `loadtest storm` prints.
func (s *StormSummary) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "storm      %d clients from %s -> %s, key %s, polling %.1f/s together, every rejection retried at once\n",
		s.Clients, s.Sources, s.URL, s.Key, s.PollRate)
	fmt.Fprintf(&b, "polite     1 client from %s, key %s, waiting out every Retry-After\n", s.PoliteSource, s.PoliteKey)
	fmt.Fprintf(&b, "elapsed    %.1fs (stopped by %s)\n", s.ElapsedSeconds, s.StoppedBy)
	var lv []string
	for _, l := range s.Levels {
		lv = append(lv, fmt.Sprintf("level %d at %s (gateway %s)", l.Level, na(l.Aggregator, "%.1fs"), na(l.Gateway, "%.1fs")))
	}
	fmt.Fprintf(&b, "ladder     %s since the clients started", strings.Join(lv, ", "))
	if s.FirstRejection >= 0 {
		fmt.Fprintf(&b, "; the first 429 came at %.1fs", s.FirstRejection)
	}
	b.WriteString("\n\n")
	fmt.Fprintf(&b, "%-42s %6s %6s %9s %10s %10s %10s %10s\n", "phase", "from s", "to s", "answers/s",
		"gateway", "CPU µs per", "Redis per", "EVALSHA")
	fmt.Fprintf(&b, "%-42s %6s %6s %9s %10s %10s %10s %10s\n", "", "", "", "", "CPU s/s", "rejection", "rejection", "per rej.")
	for _, ph := range s.Phases {
		fmt.Fprintf(&b, "%-42s %6.1f %6.1f %9.0f %10s %10s %10s %10s\n", ph.Name, ph.FromSeconds, ph.ToSeconds, ph.AnswersPerSecond,
			na(ph.CPUPerSecond, "%.3f"), na(ph.CPUPerRejection, "%.1f"), na(ph.RedisPerRejection, "%.3f"), na(ph.EvalSHAPerRejection, "%.3f"))
	}
	b.WriteString("\n")
	if s.CPURatio > 0 {
		verdict := "met"
		if s.CPURatio < 10 {
			verdict = "NOT met"
		}
		fmt.Fprintf(&b, "result     at the top the storm costs 1/%.1f of the gateway CPU per second it cost at %s (target ≤ 1/10 of before any penalty: %s)\n",
			s.CPURatio, s.CPURatioAgainst, verdict)
	}
	if s.RedisPerRejectionPenalised >= 0 {
		_, verdict := s.RedisVerdict()
		fmt.Fprintf(&b, "           %.3f Redis calls per rejection once penalised, level 2 and up (target 0: %s)\n", s.RedisPerRejectionPenalised, verdict)
	}
	st := s.Storm
	fmt.Fprintf(&b, "storm      %d answers: 2xx=%d 429=%d 429 PENALTY=%d 403=%d other=%d; errors=%d; Connection: close on %d\n",
		st.Answers, st.OK, st.RateLimited, st.Penalty, st.Blocked, st.Other, st.Errors, st.Closed)
	fmt.Fprintf(&b, "gateway    connections closed for the top level %.0f; new connections held at accept %.0f, refused %.0f\n",
		s.ConnectionsClosed, s.AcceptDelayed, s.AcceptRefused)
	p := s.Polite
	state := "penalty state unknown (no operator API)"
	if p.Level >= 0 {
		state = fmt.Sprintf("penalty level %d, %d steps in its history", p.Level, p.History)
	}
	verdict := "never penalised, never throttled"
	if !p.Untouched() {
		verdict = "TOUCHED by the storm's penalty"
	}
	fmt.Fprintf(&b, "polite     %d requests: 2xx=%d 429=%d (%.0fs of Retry-After waited out) penalised=%d errors=%d; Connection: close %d; max latency %.1fms; %s: %s\n",
		p.Requests, p.OK, p.RateLimited, p.WaitedOut, p.Penalised, p.Errors, p.Closed, p.MaxLatency, state, verdict)
	fmt.Fprintf(&b, "loadtest   %.1fs CPU\n", s.LoadtestCPUSeconds)
	for _, n := range s.Notes {
		fmt.Fprintf(&b, "note       %s\n", n)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteHTML writes the run as loadtest's HTML page: the storm clients'
// answers second by second (throughput, latency, outcomes), then the
// gateway's CPU per second, the level and the Redis calls per rejection
// over the run.
func (s *StormSummary) WriteHTML(w io.Writer) error {
	return s.htmlSummary().WriteHTML(w)
}

// htmlSummary is the page's summary: the storm clients' answers as a
// loadtest run's, with the gateway's charts added over the run's seconds.
func (s *StormSummary) htmlSummary() *report.Summary {
	rec := s.recorder
	snap := rec.Snapshot()
	sum := &report.Summary{
		Target: "storm", Endpoint: s.URL, Mode: "closed", Workers: s.Clients, Keys: 1, Paths: 1, Cost: 1,
		StoppedBy: s.StoppedBy, ElapsedSeconds: s.ElapsedSeconds, Sent: s.Storm.Answers + s.Storm.Errors,
		Answered: snap.Answered(), Decisions: rec.Decisions(), Errors: snap.Errors, Statuses: rec.Counts(), PenaltiesExpected: true,
		LatencyFrom: "sent", LatencyUS: rec.Latency(), ErrorSamples: rec.ErrorSamples(), Seconds: rec.Seconds(),
	}
	if s.ElapsedSeconds > 0 {
		sum.ThroughputRPS = float64(sum.Answered) / s.ElapsedSeconds
	}
	if sum.Sent > 0 {
		sum.LoadtestCPUMicrosPerRequest = s.LoadtestCPUSeconds * 1e6 / float64(sum.Sent)
	}
	for _, o := range rec.Outcomes() {
		sum.Order = append(sum.Order, o.Name)
		if o.Penalty {
			sum.PenaltyAnswers += sum.Statuses[o.Name]
		}
	}
	if x := sum.ChartX(); len(x) > 0 && len(s.samples) >= 2 {
		// The gateway's figures at the run charts' seconds, so that every
		// chart of the page shares one x axis: CPU and Redis counters
		// interpolated between the samples around each second's ends, the
		// level the last sample before its end saw.
		cpu, agg, gw, redis := make([]float64, len(x)), make([]float64, len(x)), make([]float64, len(x)), make([]float64, len(x))
		for i, end := range x {
			begin := 0.0
			if i > 0 {
				begin = x[i-1]
			}
			cpu[i] = counterRate(s.samples, begin, end, func(sm stormSample) (float64, bool) { return sm.cpu.Seconds(), sm.cpuOK })
			agg[i], gw[i] = levelAt(s.samples, end, false), levelAt(s.samples, end, true)
			calls := counterRate(s.samples, begin, end, func(sm stormSample) (float64, bool) {
				return sm.redis - float64(sm.politeReq), sm.redisOK
			})
			answers := counterRate(s.samples, begin, end, func(sm stormSample) (float64, bool) { return float64(sm.answers), true })
			redis[i] = math.NaN()
			if answers > 0 && !math.IsNaN(calls) {
				redis[i] = max(calls, 0) / answers
			}
		}
		sum.AddChart(report.Chart{Title: "Gateway CPU", YTitle: "CPU seconds per second", X: x,
			Series: []report.Series{{Name: "gateway CPU", Values: cpu}}})
		sum.AddChart(report.Chart{Title: "Penalty level of the storm key", YTitle: "level", X: x, YMax: TopLevel, YLabels: TopLevel + 1,
			Series: []report.Series{{Name: "aggregator", Values: agg}, {Name: "gateway", Values: gw}}})
		sum.AddChart(report.Chart{Title: "Redis calls per storm request", YTitle: "calls per request", X: x,
			Series: []report.Series{{Name: "redis calls", Values: redis}}})
	}
	return sum
}

// minRateSpan is the shortest interval counterRate measures: the CPU
// time's 10 ms ticks make a shorter one noise.
const minRateSpan = 0.5

// counterRate returns how fast a counter of the samples (get: its value
// and whether the sample read it) grew per second from time from to time
// to, in seconds since the start, interpolating between the samples that
// read it around each end. An interval that reaches past the last such
// sample (the run's last second, after the sampler stopped) is measured
// up to it. NaN when the samples do not cover what is left, or less than
// minRateSpan of it.
func counterRate(samples []stormSample, from, to float64, get func(stormSample) (float64, bool)) float64 {
	for i := len(samples) - 1; i >= 0; i-- {
		if _, ok := get(samples[i]); ok {
			to = min(to, samples[i].at.Seconds())
			break
		}
	}
	if to-from < minRateSpan {
		return math.NaN()
	}
	a, okA := counterAt(samples, from, get)
	b, okB := counterAt(samples, to, get)
	if !okA || !okB {
		return math.NaN()
	}
	return (b - a) / (to - from)
}

// counterAt interpolates a counter of the samples at time t (seconds since
// the start), between the samples that read it just before and just after
// t; t = 0, the start, takes the first sample's value (the sampler reads
// everything once as the storm starts). False when the samples that read
// it do not surround t.
func counterAt(samples []stormSample, t float64, get func(stormSample) (float64, bool)) (float64, bool) {
	prevT, prevV, have := 0.0, 0.0, false
	for _, sm := range samples {
		v, ok := get(sm)
		if !ok {
			continue
		}
		at := sm.at.Seconds()
		switch {
		case at == t, at > t && !have && t <= 0:
			return v, true
		case at > t && !have:
			return 0, false
		case at > t:
			return prevV + (v-prevV)*(t-prevT)/(at-prevT), true
		}
		prevT, prevV, have = at, v, true
	}
	return 0, false
}

// levelAt is the storm key's level at time t as the last sample at or
// before it that read it saw it (the gateway's, or the aggregator's): a
// sample whose read failed (a busy machine's timeout) keeps the level
// last read. NaN when no sample up to t read it.
func levelAt(samples []stormSample, t float64, gateway bool) float64 {
	level := -1
	for _, sm := range samples {
		if sm.at.Seconds() > t {
			break
		}
		read := sm.level
		if gateway {
			read = sm.gwLevel
		}
		if read >= 0 {
			level = read
		}
	}
	return nanUnless(level >= 0, float64(level))
}

func nanUnless(ok bool, v float64) float64 {
	if !ok {
		return math.NaN()
	}
	return v
}
