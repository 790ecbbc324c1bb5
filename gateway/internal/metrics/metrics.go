// Package metrics records the gateway's Prometheus metrics (tollgate_*):
// decisions by outcome, reason, deciding rule and route template, decision
// latency, Redis calls, errors and latency (through a guard.Store
// decorator), shadow would-rejects, the rules version and reload errors.
//
// Labels are bounded sets only: rule ids, decisions, reasons, algorithms and
// route templates of the ruleset in force (any other endpoint is "other").
// API keys, raw paths and client IPs are never labels. The gateway label is
// added by the registerer the gateway passes in.
package metrics

import (
	"context"
	"errors"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/internal/promdef"
)

// Label values.
const (
	// RouteOther is the route label of an endpoint that is not a route
	// template of the ruleset.
	RouteOther = "other"
	// RuleNone is the rule label of a decision without a deciding rule.
	RuleNone = "none"

	DecisionAllowed  = "allowed"
	DecisionRejected = "rejected" // 429
	DecisionBlocked  = "blocked"  // 403
	DecisionInvalid  = "invalid"  // 400
	DecisionError    = "error"    // no decision could be made
)

// Metrics holds the gateway's collectors. Create it with New; it is safe
// for concurrent use.
type Metrics struct {
	checks        *prometheus.CounterVec
	checkDuration prometheus.Histogram
	shadow        *prometheus.CounterVec
	reports       *prometheus.CounterVec

	redisCalls    prometheus.Counter
	redisErrors   prometheus.Counter
	redisDuration prometheus.Histogram

	rulesVersion  prometheus.Gauge
	rulesLoaded   prometheus.Gauge
	reloads       prometheus.Counter
	reloadErrors  prometheus.Counter
	costsDropped  prometheus.Counter
	costsReported prometheus.Counter
	rlsCalls      *prometheus.CounterVec
	tooManyRules  prometheus.Counter

	connsClosed     *prometheus.CounterVec
	closedPenalty   prometheus.Counter
	closedBlocklist prometheus.Counter
	acceptDelayed   prometheus.Counter
	acceptRefused   prometheus.Counter

	routes atomic.Pointer[map[string]struct{}]

	// The counters of checks and rlsCalls by label values, so that a
	// decision does not hash and look up its labels in the vectors:
	// copied on write, new label sets being rare (bounded by the series
	// the vectors hold).
	checkCounters atomic.Pointer[map[checkLabels]prometheus.Counter]
	countersMu    sync.Mutex
	rlsCounters   [len(rlsDecisions)]atomic.Pointer[prometheus.Counter]
}

// rlsDecisions are the decision label values of tollgate_rls_calls_total,
// by the indexes below.
var rlsDecisions = [...]string{rlsAllowed: DecisionAllowed, rlsRejected: DecisionRejected, rlsInvalid: DecisionInvalid, rlsError: DecisionError}

const (
	rlsAllowed = iota
	rlsRejected
	rlsInvalid
	rlsError
)

// checkLabels are the label values of a tollgate_checks_total series.
type checkLabels struct{ decision, reason, rule, route string }

// New creates the collectors and registers them with reg.
func New(reg prometheus.Registerer) *Metrics {
	latency := []float64{25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 1}
	m := &Metrics{
		checks:        promdef.CounterVec("tollgate_checks_total", "Decisions made by the proxy and the check API (peeks included; Envoy RLS calls are in tollgate_rls_calls_total), by decision (allowed, rejected, blocked, invalid, error), reason, deciding rule (none without one) and route template (other when the endpoint is not one).", "decision", "reason", "rule", "route"),
		checkDuration: promdef.Histogram("tollgate_check_duration_seconds", "Time to decide one request, Redis round trip included.", latency),
		shadow:        promdef.CounterVec("tollgate_shadow_would_reject_total", "Requests a shadow rule would have rejected, by rule.", "rule"),
		reports:       promdef.CounterVec("tollgate_reports_total", "Costs charged after the fact (POST /v1/report, cost_response_header), by decision: allowed (charged), invalid (refused: a bad key, or a cost above max_cost) or error (Redis unavailable: not charged).", "decision"),
		redisCalls:    promdef.Counter("tollgate_redis_calls_total", "Calls to the Redis store (one per decision that reaches Redis)."),
		redisErrors:   promdef.Counter("tollgate_redis_errors_total", "Redis store calls that failed or timed out (the decision then followed the rules' on_failure)."),
		redisDuration: promdef.Histogram("tollgate_redis_call_duration_seconds", "Duration of Redis store calls, failed ones included.", latency),
		rulesVersion:  promdef.Gauge("tollgate_rules_version", "Version of the ruleset in force: the rules file's `version` field, or in fleet mode the version the operator API assigned (the content hash and the source are in /readyz and the reload log)."),
		rulesLoaded:   promdef.Gauge("tollgate_rules_loaded_timestamp_seconds", "Unix time the ruleset in force was applied."),
		reloads:       promdef.Counter("tollgate_rules_reloads_total", "Rulesets applied after a change of the rules file, or in fleet mode of the tollgate_rules KV bucket."),
		reloadErrors:  promdef.Counter("tollgate_rules_reload_errors_total", "Changes of the rules file (invalid or unreadable), or in fleet mode rulesets from the tollgate_rules KV bucket, refused; the running rules stayed."),
		costsDropped:  promdef.Counter("tollgate_cost_reports_dropped_total", "Costs from cost_response_header not charged because the report queue was full."),
		rlsCalls:      promdef.CounterVec("tollgate_rls_calls_total", "Envoy rate-limit calls, by decision: allowed (OK), rejected (OVER_LIMIT), invalid (malformed call) or error (no decision).", "decision"),
	}
	m.tooManyRules = promdef.Counter("tollgate_too_many_rules_total", "Requests answered 500 TOO_MANY_RULES without a Redis call: they matched more rules than max_rules_per_request (the guard logs them, at most every 10 s).")
	m.connsClosed = promdef.CounterVec("tollgate_penalty_connections_closed_total", "Client connections the proxy answered with Connection: close after offenders.close_after rejections, by reason: penalty (a key at the top of the penalty ladder; its address is then throttled at accept) or blocklist (an operator's block). Never for trusted proxies.", "reason")
	m.closedPenalty = m.connsClosed.WithLabelValues(ClosePenalty)
	m.closedBlocklist = m.connsClosed.WithLabelValues(CloseBlocklist)
	accept := promdef.CounterVec("tollgate_accept_throttled_total", "New proxy connections from client addresses throttled at accept (offenders.throttle), by outcome: delayed (held for offenders.throttle_delay, then served) or refused (closed at once: offenders.max_held were held).", "outcome")
	m.acceptDelayed = accept.WithLabelValues("delayed")
	m.acceptRefused = accept.WithLabelValues("refused")
	m.costsReported = m.reports.WithLabelValues(DecisionAllowed)
	reg.MustRegister(m.checks, m.checkDuration, m.shadow, m.reports, m.redisCalls, m.redisErrors,
		m.redisDuration, m.rulesVersion, m.rulesLoaded, m.reloads, m.reloadErrors, m.costsDropped, m.rlsCalls,
		m.tooManyRules, m.connsClosed, accept)
	empty := map[string]struct{}{}
	m.routes.Store(&empty)
	noChecks := map[checkLabels]prometheus.Counter{}
	m.checkCounters.Store(&noChecks)
	return m
}

// checkCounter returns the tollgate_checks_total counter of labels l.
func (m *Metrics) checkCounter(l checkLabels) prometheus.Counter {
	if c, ok := (*m.checkCounters.Load())[l]; ok {
		return c
	}
	m.countersMu.Lock()
	defer m.countersMu.Unlock()
	old := *m.checkCounters.Load()
	if c, ok := old[l]; ok {
		return c
	}
	c := m.checks.WithLabelValues(l.decision, l.reason, l.rule, l.route)
	next := make(map[checkLabels]prometheus.Counter, len(old)+1)
	maps.Copy(next, old)
	next[l] = c
	m.checkCounters.Store(&next)
	return c
}

// SetRules records the ruleset in force and its route templates (the only
// endpoints used as route labels). reload says whether it replaced another.
func (m *Metrics) SetRules(rs *rules.Ruleset, routes []string, reload bool) {
	set := make(map[string]struct{}, len(routes))
	for _, r := range routes {
		set[r] = struct{}{}
	}
	m.routes.Store(&set)
	m.rulesVersion.Set(float64(rs.Version()))
	m.rulesLoaded.Set(float64(time.Now().UnixMilli()) / 1e3)
	if reload {
		m.reloads.Inc()
	}
}

// ReloadError counts a refused change of the rules file, or a refused
// ruleset from NATS.
func (m *Metrics) ReloadError() { m.reloadErrors.Inc() }

// TooManyRules counts a request refused for matching too many rules
// (guard.WithOnTooManyRules).
func (m *Metrics) TooManyRules(int) { m.tooManyRules.Inc() }

// Reasons of tollgate_penalty_connections_closed_total.
const (
	ClosePenalty   = "penalty"
	CloseBlocklist = "blocklist"
)

// ConnectionClosed counts a client connection answered with Connection:
// close; penalty says it was for the top of the penalty ladder (else an
// operator's block).
func (m *Metrics) ConnectionClosed(penalty bool) {
	if penalty {
		m.closedPenalty.Inc()
	} else {
		m.closedBlocklist.Inc()
	}
}

// AcceptThrottled counts a new connection from a throttled address:
// held, or refused at once.
func (m *Metrics) AcceptThrottled(refused bool) {
	if refused {
		m.acceptRefused.Inc()
	} else {
		m.acceptDelayed.Inc()
	}
}

// CostDropped counts a cost report the queue had no room for.
func (m *Metrics) CostDropped() { m.costsDropped.Inc() }

// route returns the route label of a normalised endpoint.
func (m *Metrics) route(endpoint string) string {
	if _, ok := (*m.routes.Load())[endpoint]; ok {
		return endpoint
	}
	return RouteOther
}

// Decision records one decision (d may be nil when err is not) and the time
// it took.
func (m *Metrics) Decision(d *guard.Decision, err error, took time.Duration) {
	m.checkDuration.Observe(took.Seconds())
	if err != nil || d == nil {
		m.checkCounter(checkLabels{DecisionError, "error", RuleNone, RouteOther}).Inc()
		return
	}
	rule := RuleNone
	if dr := d.DecidingRule(); dr != nil {
		rule = dr.ID
	}
	m.checkCounter(checkLabels{decisionLabel(d), string(d.Reason), rule, m.route(d.Endpoint)}).Inc()
	for i := range d.Rules {
		if rr := &d.Rules[i]; rr.Shadow && !rr.Allowed && !rr.Degraded {
			m.shadow.WithLabelValues(rr.ID).Inc()
		}
	}
}

// RLSCall records one Envoy rate-limit call: over says the answer was
// OVER_LIMIT; code is the gRPC status code of the call.
func (m *Metrics) RLSCall(over bool, code codes.Code) {
	i := rlsAllowed
	switch {
	case code == codes.InvalidArgument:
		i = rlsInvalid
	case code != codes.OK:
		i = rlsError
	case over:
		i = rlsRejected
	}
	// Created when first used, as the vector's series are.
	c := m.rlsCounters[i].Load()
	if c == nil {
		cc := m.rlsCalls.WithLabelValues(rlsDecisions[i])
		c = &cc
		m.rlsCounters[i].Store(c)
	}
	(*c).Inc()
}

// Report records one after-the-fact charge.
func (m *Metrics) Report(d *guard.Decision, err error) {
	switch {
	case err != nil || d == nil:
		m.reports.WithLabelValues(DecisionError).Inc()
	case d.Status == 400:
		m.reports.WithLabelValues(DecisionInvalid).Inc()
	default:
		m.costsReported.Inc()
	}
}

func decisionLabel(d *guard.Decision) string {
	switch {
	case d.Allowed:
		return DecisionAllowed
	case d.Status == 403:
		return DecisionBlocked
	case d.Status == 400:
		return DecisionInvalid
	case d.Status >= 500:
		return DecisionError // TOO_MANY_RULES: a fault of the rules
	}
	return DecisionRejected
}

// Store returns s wrapped so that every call is counted and timed. The
// result names counters as s does (guard.Namer), so s must implement it
// when the guard is to use s's names: redisstore does.
func (m *Metrics) Store(s guard.Store) guard.Store {
	st := &store{s: s, m: m, namer: guard.PlainName}
	if n, ok := s.(guard.Namer); ok {
		st.namer = n.CounterName
	}
	return st
}

// store is a guard.Store decorator recording Redis metrics.
type store struct {
	s     guard.Store
	m     *Metrics
	namer func(*guard.CounterID) string
}

var (
	_ guard.Store = (*store)(nil)
	_ guard.Namer = (*store)(nil)
)

// CounterName implements guard.Namer with the wrapped store's names.
func (s *store) CounterName(id *guard.CounterID) string { return s.namer(id) }

// Do implements guard.Store.
func (s *store) Do(ctx context.Context, op guard.Op, now int64, counters []guard.Counter, res []guard.CounterResult) (int64, error) {
	start := time.Now()
	t, err := s.s.Do(ctx, op, now, counters, res)
	if errors.Is(err, guard.ErrUnavailable) {
		// Refused by an open circuit breaker: no call reached Redis.
		return t, err
	}
	s.m.redisDuration.Observe(time.Since(start).Seconds())
	s.m.redisCalls.Inc()
	// A caller that went away is not a Redis error.
	if err != nil && !(errors.Is(err, context.Canceled) && ctx.Err() != nil) {
		s.m.redisErrors.Inc()
	}
	return t, err
}

var _ guard.Observer = (*Metrics)(nil)

// Decided implements guard.Observer: checks and peeks count in
// tollgate_checks_total and the decision latency, reports in
// tollgate_reports_total, whatever the surface.
func (m *Metrics) Decided(_ context.Context, op guard.Op, _ *guard.Request, d *guard.Decision, err error, took time.Duration) {
	switch op {
	case guard.OpCheck, guard.OpPeek:
		m.Decision(d, err, took)
	case guard.OpReport:
		m.Report(d, err)
	}
}
