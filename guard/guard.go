package guard

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"math"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/tollgate/tollgate/guard/apierror"
	"github.com/tollgate/tollgate/guard/keyid"
	"github.com/tollgate/tollgate/guard/rules"
)

// Errors.
var (
	// ErrNoRules is returned while no ruleset has been loaded.
	ErrNoRules = errors.New("guard: no ruleset loaded")
	// ErrInvalidKey is the error of a key that ValidKey refuses.
	ErrInvalidKey = errors.New("guard: invalid API key")
	// ErrUnavailable is wrapped by a Store's errors that mean the store is
	// known to be unavailable and was not even called (redisstore's
	// ErrBreakerOpen: an open circuit breaker). Checks then degrade at
	// once, as after any store error.
	ErrUnavailable = errors.New("guard: store unavailable")
	// ErrNotSent is wrapped by a Store's errors that mean the call surely
	// never reached the store, so nothing of it ran: an open circuit
	// breaker, a failed dial, a deadline that passed or a caller that gave
	// up while the call was still queued. Any other error leaves the outcome unknown (a timeout after
	// the call was sent: the store may have run it). Callers that would
	// repeat a call whose effect must not happen twice (lease returns)
	// repeat it only after this error.
	ErrNotSent = errors.New("guard: call not sent")
	// ErrWouldBlock is returned by a decision asked for under LocalOnly
	// that needs the store: nothing was decided, charged or observed.
	ErrWouldBlock = errors.New("guard: decision needs the store")
)

// MaxKeyLen is the longest API key accepted, in bytes.
const MaxKeyLen = 256

// DefaultMaxRules is the most rules one request may match (WithMaxRules).
const DefaultMaxRules = 32

// Guard decides requests against a ruleset, with counters in a Store.
// Create it with New; it is safe for concurrent use and starts no
// goroutines.
type Guard struct {
	store    Store
	namer    func(*CounterID) string
	fallback Store
	share    float64
	hasher   *keyid.Hasher
	maxCost  int64
	controls *Controls
	clock    func() int64
	log      *slog.Logger
	onDegr   func(error)
	maxRules int
	region   string
	// regionsPeriod is the regions' loan period in µs (0: the default).
	regionsPeriod int64
	onTooMany     func(matched int)
	cache         *resolutionCache
	cacheSize     int

	rules atomic.Pointer[rules.Ruleset]
	// shares is the share table of global rules' counters (SetShares);
	// nil until the first.
	shares atomic.Pointer[shareTable]

	observers []Observer

	// Rate limits of the "deciding degraded" log line and of the one
	// about requests matching too many rules.
	degrLog, manyLog sampledLog
}

// sampledLog rate-limits a log line about an event that may come at every
// request: it counts the events and lets a line through at most once per
// interval, with the count since the last line.
type sampledLog struct {
	logged atomic.Int64 // Unix ns of the last line
	count  atomic.Int64 // events since
}

// event counts one event; when a line is due (every has passed since the
// last) it reports true with the events since the last line, this one
// included.
func (l *sampledLog) event(every time.Duration) (n int64, due bool) {
	n = l.count.Add(1)
	now := time.Now().UnixNano()
	last := l.logged.Load()
	if now-last < int64(every) || !l.logged.CompareAndSwap(last, now) {
		return n, false
	}
	l.count.Add(-n)
	return n, true
}

// tooManyLogInterval is the least time between two log lines about
// requests matching more than maxRules rules.
const tooManyLogInterval = 10 * time.Second

// degradedLogInterval is the least time between two log lines about
// degraded decisions.
const degradedLogInterval = time.Second

var _ Checker = (*Guard)(nil)

// Option configures a Guard.
type Option func(*Guard)

// WithMaxCost sets the largest cost a request may ask for (default 1000).
func WithMaxCost(n int64) Option { return func(g *Guard) { g.maxCost = n } }

// WithControls sets the dynamic blocklist, allowlist, penalties and
// overrides (default: empty Controls of the Guard's own, see Controls).
func WithControls(c *Controls) Option { return func(g *Guard) { g.controls = c } }

// WithFallback sets the store that decides `on_failure: closed` rules when
// the main store fails (typically a memstore.Store), with their limits
// scaled by share (this gateway's share of the fleet; default 0.25).
func WithFallback(s Store, share float64) Option {
	return func(g *Guard) { g.fallback, g.share = s, share }
}

// DefaultRegion is the region a Guard is in unless WithRegion says
// otherwise.
const DefaultRegion = "local"

// WithRegion sets the region the guard decides in (default DefaultRegion):
// a `regions: global` rule is enforced against this region's share of its
// limit (rules.Ruleset.RegionShare), `regional` rules whole. Without a
// `regions` list in the rules the region holds every limit whole.
func WithRegion(name string) Option { return func(g *Guard) { g.region = name } }

// WithRegionsPeriod sets the period of the loans between regions that a
// global rule's share ledger counts in (default 1 s): every gateway and
// aggregator of the fleet must use the same, the one the regions' agents
// lend by. Zero keeps the default.
func WithRegionsPeriod(d time.Duration) Option {
	return func(g *Guard) { g.regionsPeriod = d.Microseconds() }
}

// WithClock sets the clock for expiries of controls (Unix µs; default the
// system clock). Counters always use the store's time.
func WithClock(now func() int64) Option { return func(g *Guard) { g.clock = now } }

// WithLogger sets the logger (default: discard). Keys are never logged.
// While the store fails, the guard logs one warning per second at most,
// with the number of degraded decisions since the previous one.
func WithLogger(l *slog.Logger) Option { return func(g *Guard) { g.log = l } }

// WithObserver adds observers told of every decided request (see
// Observer; default: none). They run in the order given, on the deciding
// goroutine.
func WithObserver(obs ...Observer) Option {
	return func(g *Guard) { g.observers = append(g.observers, obs...) }
}

// WithOnDegraded sets a function called once for every check or peek (or
// CheckMany call) decided degraded because the store failed, with the
// store's error (default: none), for metrics: errors.Is(err,
// ErrUnavailable) tells a call refused by an open circuit breaker from a
// failed or timed-out one. It runs on the deciding goroutine and must be
// quick. Decision.Degraded and Reason ReasonRedisUnavailable say the same
// per decision.
func WithOnDegraded(fn func(err error)) Option { return func(g *Guard) { g.onDegr = fn } }

// WithMaxRules sets the most rules one request may match (default
// DefaultMaxRules; n ≤ 0 keeps it). Every matching rule is a counter in the
// request's store call and an item in its headers, so this bounds the work
// and the header size of one request. A request matching more is answered
// 500 TOO_MANY_RULES without a store call (counted by WithOnTooManyRules,
// logged at most every 10 s), and New refuses a ruleset where every request
// of some kind provably matches more (rules.Ruleset.CheckMatchLimit; call
// CheckRules before SetRules to refuse it on reload).
func WithMaxRules(n int) Option {
	return func(g *Guard) {
		if n > 0 {
			g.maxRules = n
		}
	}
}

// WithResolutionCache sets how many request resolutions the guard caches
// (default DefaultResolutionCache; 0 disables the cache). A resolution is
// what a request's key, tenant, tier, endpoint, method and domain resolve
// to before any counter is consulted (key_id, lists, penalty, matched
// rules with their parameters and counter names); a cached one is reused
// until the ruleset or the controls change, which makes a check of a known
// key free of HMACs, matching and allocations. Each takes a few hundred
// bytes.
func WithResolutionCache(n int) Option { return func(g *Guard) { g.cacheSize = n } }

// WithOnTooManyRules sets a function called for every request answered 500
// TOO_MANY_RULES, with the number of rules it matched (default: none), for
// metrics. It runs on the deciding goroutine and must be quick.
func WithOnTooManyRules(fn func(matched int)) Option { return func(g *Guard) { g.onTooMany = fn } }

// New returns a Guard deciding with store, deriving key_ids under secret
// (at least keyid.MinSecretLen bytes), enforcing rs (which may be nil until
// SetRules is called). It fails for a short secret (keyid.ErrNoSecret,
// keyid.ErrShortSecret) and for a ruleset CheckRules refuses.
func New(store Store, secret []byte, rs *rules.Ruleset, opts ...Option) (*Guard, error) {
	h, err := keyid.New(secret)
	if err != nil {
		return nil, err
	}
	g := &Guard{
		store:     store,
		namer:     PlainName,
		hasher:    h,
		maxCost:   1000,
		share:     0.25,
		maxRules:  DefaultMaxRules,
		region:    DefaultRegion,
		cacheSize: DefaultResolutionCache,
		clock:     func() int64 { return time.Now().UnixMicro() },
	}
	for _, o := range opts {
		o(g)
	}
	if g.cacheSize > 0 {
		g.cache = newResolutionCache(g.cacheSize)
	}
	if n, ok := store.(Namer); ok {
		g.namer = n.CounterName
	}
	if rs != nil {
		if err := g.CheckRules(rs); err != nil {
			return nil, err
		}
	}
	if g.controls == nil {
		g.controls = NewControls()
	}
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	if rs != nil {
		g.rules.Store(rs)
	}
	return g, nil
}

// SetRules swaps the ruleset atomically. Requests already being decided
// finish with the ruleset they started with. Local state derived from the
// old ruleset (a store's leases and negative cache: Invalidator) is
// dropped. It does not check rs: call CheckRules first to refuse a ruleset
// that would answer every request of some kind with TOO_MANY_RULES.
func (g *Guard) SetRules(rs *rules.Ruleset) {
	if rs != nil && !rs.HasRegion(g.region) && slices.ContainsFunc(rs.Rules(), func(r *rules.Rule) bool { return r.Regions == rules.RegionsGlobal }) {
		g.log.Warn("the rules' regions list does not name this region: its global rules admit nothing here",
			slog.String("region", g.region))
	}
	g.rules.Store(rs)
	g.ForgetCounters()
}

// CounterNames returns the names (Counter.Name) of the counters of every
// rule applicable to req — those Reset empties and AddQuota refills — or
// nil when none applies (no ruleset or rule, a listed key, an invalid
// request). Another process with the same ruleset, key secret and store
// naming gets the same names: the operator API sends them to the gateways
// (ForgetNames).
func (g *Guard) CounterNames(req *Request) []string {
	rs := g.rules.Load()
	if rs == nil {
		return nil
	}
	var abuf [8]applicable
	apps, ok := g.resolve(rs, OpReset, req, &Decision{}, abuf[:0])
	if !ok || len(apps) == 0 {
		return nil
	}
	names := make([]string, len(apps))
	for i := range apps {
		names[i] = apps[i].counter.Name
	}
	return names
}

// ForgetNames drops the local state a store keeps of the named counters
// (Forgetter) after another process reset them (reset true: their leases
// are dropped without giving their units back to the fresh counters) or
// granted them quota (their negative cache). Without names, or with a
// store that cannot forget by name, it forgets everything
// (ForgetCounters). It does not block.
func (g *Guard) ForgetNames(reset bool, names []string) {
	if f, ok := g.store.(Forgetter); ok && len(names) > 0 {
		f.Forget(reset, names)
		return
	}
	g.ForgetCounters()
}

// ForgetCounters drops the local state a store derived from the counters
// it saw (leases and the negative cache: Invalidator), for when they were
// changed in Redis by someone else than this guard — another process reset
// them or granted quota (the operator API) — so that no decision is
// answered from what they were. Like SetRules, it does not block.
func (g *Guard) ForgetCounters() {
	if inv, ok := g.store.(Invalidator); ok {
		inv.Invalidate()
	}
}

// CheckRules reports whether the guard can enforce rs: an error (a
// *rules.ValidationError naming a rule) when some kind of request provably
// matches more rules than WithMaxRules allows.
func (g *Guard) CheckRules(rs *rules.Ruleset) error { return rs.CheckMatchLimit(g.maxRules) }

// MaxRules returns the most rules one request may match (WithMaxRules).
func (g *Guard) MaxRules() int { return g.maxRules }

// Rules returns the ruleset in force (nil before the first).
func (g *Guard) Rules() *rules.Ruleset { return g.rules.Load() }

// Controls returns the guard's dynamic controls.
func (g *Guard) Controls() *Controls { return g.controls }

// KeyID returns the key_id of an API key.
func (g *Guard) KeyID(key string) string { return g.hasher.ID(key) }

// Check decides req and charges its cost when it is admitted.
func (g *Guard) Check(ctx context.Context, req *Request) (*Decision, error) {
	d := &Decision{}
	return d, g.CheckInto(ctx, req, d)
}

// CheckInto is Check filling d, reusing d.Rules' storage.
func (g *Guard) CheckInto(ctx context.Context, req *Request, d *Decision) error {
	return g.decide(ctx, OpCheck, req, d)
}

// Peek answers what a request of cost 1 would get, charging nothing.
func (g *Guard) Peek(ctx context.Context, req *Request) (*Decision, error) {
	d := &Decision{}
	return d, g.decide(ctx, OpPeek, req, d)
}

// Report charges req.Cost to every rule applicable to req after the fact
// (usage known only once the response is complete). Counters may go into
// debt, at most one full limit below zero. The decision holds the state
// afterwards.
func (g *Guard) Report(ctx context.Context, req *Request) (*Decision, error) {
	d := &Decision{}
	return d, g.decide(ctx, OpReport, req, d)
}

// Reset empties the counters of every rule applicable to req: they start
// full.
func (g *Guard) Reset(ctx context.Context, req *Request) (*Decision, error) {
	d := &Decision{}
	return d, g.decide(ctx, OpReset, req, d)
}

// AddQuota gives n units back to every rule applicable to req (never above
// a full counter).
func (g *Guard) AddQuota(ctx context.Context, req *Request, n int64) (*Decision, error) {
	r := *req
	r.Cost = n
	d := &Decision{}
	return d, g.decide(ctx, OpAddQuota, &r, d)
}

// ValidKey reports whether key is an acceptable API key: at most
// MaxKeyLen bytes of valid UTF-8 holding no control character (C0, DEL, C1:
// U+0000–U+001F, U+007F–U+009F) and no space (U+0020, which no header or
// query source could carry unambiguously). Other Unicode is fine. The empty
// key (an anonymous request) is valid. Every surface — the proxy's
// identity sources, the check API and Envoy RLS — refuses the same keys
// with this function (400 INVALID_KEY), so a key never means two things.
func ValidKey(key string) bool {
	if len(key) > MaxKeyLen {
		return false
	}
	for i := 0; i < len(key); {
		c := key[i]
		if c < utf8.RuneSelf {
			if c <= ' ' || c == 0x7f {
				return false
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(key[i:])
		if (r == utf8.RuneError && size == 1) || r <= 0x9f {
			return false // invalid UTF-8, or a C1 control
		}
		i += size
	}
	return true
}

// applicable is one rule applying to a request, with its counter.
type applicable struct {
	rule    *rules.Rule
	params  rules.Params
	window  int64 // params.PolicyWindow
	counter Counter
}

func (g *Guard) decide(ctx context.Context, op Op, req *Request, d *Decision) error {
	if len(g.observers) == 0 {
		return g.decideOnce(ctx, op, req, d)
	}
	start := time.Now()
	err := g.decideOnce(ctx, op, req, d)
	if err == ErrWouldBlock {
		return err
	}
	g.observe(ctx, op, req, d, err, time.Since(start))
	return err
}

// observe tells every observer of one decision.
func (g *Guard) observe(ctx context.Context, op Op, req *Request, d *Decision, err error, took time.Duration) {
	for _, o := range g.observers {
		o.Decided(ctx, op, req, d, err, took)
	}
}

func (g *Guard) decideOnce(ctx context.Context, op Op, req *Request, d *Decision) error {
	rs := g.rules.Load()
	if rs == nil {
		return ErrNoRules
	}
	var abuf [8]applicable
	apps, ok := g.resolve(rs, op, req, d, abuf[:0])
	if !ok {
		return nil
	}
	return g.run(ctx, op, apps, d)
}

// resolve starts d for req under rs and appends the rules applicable to req,
// with their counters, to apps. ok is false when d is already final, decided
// without the store: an invalid key, the blocklist, the allowlist, a
// penalty, a block rule, no applicable rule, or a cost exceeding a limit.
//
// What does not depend on the request's cost or operation (the key_id, the
// lists and penalty, the rules matched with their parameters and counter
// names) is a resolution, cached per key, tenant, tier, endpoint, method,
// domain (and client IP where rules count by it) until the ruleset or the
// controls change: a cached request costs no HMAC, no matching and no
// allocation. Requests whose descriptor entries some rule matches are
// resolved afresh every time.
func (g *Guard) resolve(rs *rules.Ruleset, op Op, req *Request, d *Decision, apps []applicable) (_ []applicable, ok bool) {
	*d = Decision{Rules: d.Rules[:0], Deciding: -1, Status: 200, Allowed: true, Reason: ReasonAllowed}
	// The one place every surface normalises its path: before the
	// lists, so that no request, allowlisted or not, goes on with a path
	// the limiter and the upstream would read differently.
	path, ok := rules.CleanPath(req.Path)
	if !ok {
		if !ValidKey(req.Key) {
			d.reject(400, apierror.InvalidKey, ReasonInvalidKey)
			return apps, false
		}
		d.reject(400, apierror.InvalidPath, ReasonInvalidPath)
		return apps, false
	}
	endpoint := rs.Normalize(path)
	// One state of the controls for the whole decision: a change made
	// meanwhile is seen entirely or not at all.
	ctl := g.controls.current()
	st := g.shares.Load()
	ip := cacheIP(rs, req)

	if g.cache == nil || (len(req.Descriptor) > 0 && rs.MatchesDescriptors()) {
		if !ValidKey(req.Key) {
			d.reject(400, apierror.InvalidKey, ReasonInvalidKey)
			return apps, false
		}
		now := g.clock()
		var r resolution
		g.resolveInto(&r, rs, ctl, st, req, endpoint, ip, now)
		d.Path, d.Endpoint = path, endpoint
		return g.apply(op, req, d, &r, now, apps)
	}
	h := g.cache.hash(req, endpoint)
	r := g.cache.get(h, req, endpoint, ip)
	// The clock is read only when something cached can expire: a check of
	// a resolution without controls needs no time of its own.
	now := int64(0)
	if r == nil || r.until != math.MaxInt64 || r.penalised {
		now = g.clock()
	}
	if r == nil || !r.current(rs, ctl.Generation(), st, now) {
		// A cached resolution's key was valid: only a new one needs the
		// check.
		if !ValidKey(req.Key) {
			d.reject(400, apierror.InvalidKey, ReasonInvalidKey)
			return apps, false
		}
		if now == 0 {
			now = g.clock()
		}
		r = new(resolution)
		g.resolveInto(r, rs, ctl, st, req, endpoint, ip, now)
		r.hash = h
		g.cache.put(r, rs, r.gen, st, now)
	}
	d.Path, d.Endpoint = path, endpoint
	return g.apply(op, req, d, r, now, apps)
}

// apply finishes resolving req from its resolution r at time now: the
// decisions made without the store, and otherwise the request's counters
// with its cost.
func (g *Guard) apply(op Op, req *Request, d *Decision, r *resolution, now int64, apps []applicable) (_ []applicable, ok bool) {
	d.Tenant, d.Tier = r.tenant, r.tier
	if req.Key != "" {
		d.KeyID, d.KeyPrefix = r.keyID, r.keyPrefix
		switch r.status {
		case rules.Blocklisted:
			d.reject(403, apierror.KeyBlocked, ReasonBlocklisted)
			if e, ok := g.controls.current().blockEntry(d.KeyID, now); ok {
				d.PenaltyLevel, d.CloseConnection = e.Level, e.Close
				if e.Level > 0 {
					d.PenaltyUntil, d.PenaltyReason = e.Expiry, e.Reason
					d.PenaltyUntil = cmp.Or(d.PenaltyUntil, math.MaxInt64)
				}
			}
			return apps, false
		case rules.Allowlisted:
			d.Reason = ReasonAllowlisted
			return apps, false
		}
		if p := r.penalty; r.penalised && p.Until > now && op == OpCheck {
			d.reject(429, apierror.Penalty, ReasonPenalty)
			d.RetryAfter = max(1, ceilDiv(p.Until-now, 1_000_000))
			d.PenaltyLevel, d.CloseConnection = p.Level, p.Close
			if p.Level > 0 {
				d.PenaltyUntil, d.PenaltyReason = p.Until, p.Reason
			}
			d.Time = now
			return apps, false
		}
	}

	if r.matched == 0 {
		d.Reason = ReasonNoRule
		return apps, false
	}
	if r.matched > g.maxRules {
		d.reject(500, apierror.TooManyRules, ReasonTooManyRules)
		g.tooManyRules(r.matched, d.Endpoint)
		return apps, false
	}

	cost := req.Cost
	if cost <= 0 {
		cost = 1
	}
	if op == OpPeek {
		cost = 1
	}
	if (op == OpCheck || op == OpReport) && cost > g.maxCost {
		d.Cost, d.RefusingLimit = cost, g.maxCost
		d.reject(400, apierror.CostExceedsLimit, ReasonCostExceedsLimit)
		return apps, false
	}

	for i := range r.rules {
		rr := &r.rules[i]
		rule := rr.rule
		if rule.Block {
			if rule.Shadow {
				continue
			}
			code := apierror.EndpointBlocked
			if rule.SelectsKeysOnly() {
				code = apierror.KeyBlocked
			}
			d.RefusingRule = rule.ID
			d.reject(403, code, ReasonBlockRule)
			return apps, false
		}
		c := cost
		if rule.Cost > 0 && op == OpCheck {
			c = rule.Cost
		}
		// Against the whole limit: a global rule's share may be below the
		// cost here and units may be lent to this region later (429).
		if !rule.Shadow && (op == OpCheck || op == OpPeek) && c > rr.limit {
			d.Cost, d.RefusingRule, d.RefusingLimit = c, rule.ID, rr.limit
			d.reject(400, apierror.CostExceedsLimit, ReasonCostExceedsLimit)
			return apps, false
		}
		apps = append(apps, applicable{
			rule:   rule,
			params: rr.params,
			window: rr.window,
			counter: Counter{
				Name:      rr.name,
				Algorithm: rule.Algorithm,
				Params:    rr.params,
				Cost:      c,
				Shadow:    rule.Shadow,
				Strict:    rule.Strict,
				Ledger:    rr.ledger,
			},
		})
	}
	d.Cost = cost
	if len(apps) == 0 {
		d.Reason = ReasonNoRule
		return apps, false
	}
	return apps, true
}

// scratch is the storage of one store call: the store is an interface, so
// slices handed to it escape, and pooling them keeps a decision free of
// allocations.
type scratch struct {
	counters [8]Counter
	res      [8]CounterResult
	at       [8]int
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// run sends the counters to the store and fills the decision.
func (g *Guard) run(ctx context.Context, op Op, apps []applicable, d *Decision) error {
	sc := scratchPool.Get().(*scratch)
	defer func() {
		// Drop the names and tokens this call left (no more than it used).
		n := min(len(apps), len(sc.counters))
		clear(sc.counters[:n])
		clear(sc.res[:n])
		scratchPool.Put(sc)
	}()
	counters, res, at := sc.counters[:0], sc.res[:0], sc.at[:0]
	for i := range apps {
		counters = append(counters, apps[i].counter)
		res = append(res, CounterResult{})
		at = append(at, i)
	}
	now, err := g.storeDo(ctx, op, counters, res)
	if err == ErrWouldBlock {
		return err
	}
	degraded := false
	if err != nil {
		if op != OpCheck && op != OpPeek {
			return err
		}
		g.degraded(err)
		degraded = true
		var rbuf [8]*rules.Rule
		ruleOf := rbuf[:0]
		for i := range apps {
			ruleOf = append(ruleOf, apps[i].rule)
		}
		now, err = g.degrade(ctx, op, ruleOf, counters, res)
		if err != nil {
			return err
		}
	}
	g.finish(op, apps, res, at, now, degraded, d)
	return nil
}

// finish fills d from the store's results, the result of apps[i] being
// res[at[i]], decided at now (Unix µs); degraded: the store failed and res
// came from degrade.
func (g *Guard) finish(op Op, apps []applicable, res []CounterResult, at []int, now int64, degraded bool, d *Decision) {
	d.Time = now
	d.Degraded = degraded
	if degraded {
		d.Reason = ReasonRedisUnavailable
	}

	// Results in ruleset order: enforced rules, then shadow ones.
	for pass := 0; pass < 2; pass++ {
		for i := range apps {
			if apps[i].rule.Shadow != (pass == 1) {
				continue
			}
			local := degraded && apps[i].rule.OnFailure == rules.FailClosed && g.fallback != nil
			rr := g.result(apps[i], &res[at[i]], now, degraded && !local)
			rr.Degraded = degraded
			d.Rules = append(d.Rules, rr)
		}
	}

	admitted := true
	for i := range d.Rules {
		if !d.Rules[i].Shadow && !d.Rules[i].Allowed {
			admitted = false
		}
	}
	deciding := -1
	for i := range d.Rules {
		rr := &d.Rules[i]
		if rr.Shadow {
			continue
		}
		if deciding < 0 {
			deciding = i
			continue
		}
		best := &d.Rules[deciding]
		if !admitted {
			if !rr.Allowed && (best.Allowed || rr.RetryAfter > best.RetryAfter) {
				deciding = i
			}
		} else if rr.Remaining < best.Remaining || (rr.Remaining == best.Remaining && rr.Limit < best.Limit) {
			deciding = i
		}
	}
	d.Deciding = deciding
	if deciding < 0 {
		// Only shadow rules applied: no headers.
		d.Reason = ReasonNoRule
		if degraded {
			d.Reason = ReasonRedisUnavailable
		}
		return
	}
	// A state says what a check of req's cost would get now: the 429 a
	// rule that could not take it would give, charging nothing.
	if !admitted && (op == OpCheck || op == OpPeek || op == OpState) {
		d.reject(429, apierror.RateLimitExceeded, ReasonRateLimited)
		d.RetryAfter = d.Rules[deciding].RetryAfter
	}
	d.Peek = op == OpPeek
}

// result turns a store's counter result into a RuleResult.
func (g *Guard) result(a applicable, r *CounterResult, now int64, failOpen bool) RuleResult {
	rr := RuleResult{
		ID:        a.rule.ID,
		Algorithm: a.rule.Algorithm,
		Shadow:    a.rule.Shadow,
		Allowed:   r.Allowed,
		Limit:     a.params.Limit,
		Window:    a.window,
	}
	if failOpen {
		rr.Allowed, rr.Remaining, rr.Degraded, rr.FailOpen = true, -1, true, true
		rr.Reset = ceilDiv(now, 1_000_000)
		return rr
	}
	rr.Remaining = max(r.Remaining, 0)
	rr.Reset = ceilDiv(now+r.ResetAfter, 1_000_000)
	rr.Next = ceilDiv(r.NextAfter, 1_000_000)
	if !r.Allowed {
		rr.RetryAfter = max(1, ceilDiv(r.RetryAfter, 1_000_000), rr.Next)
	}
	return rr
}

// degraded records a decision made degraded after the store failed with
// err: the hook, and a log line at most every degradedLogInterval.
func (g *Guard) degraded(err error) {
	if g.onDegr != nil {
		g.onDegr(err)
	}
	if n, due := g.degrLog.event(degradedLogInterval); due {
		g.log.Warn("store unavailable: deciding degraded (on_failure open rules allow, closed rules are limited locally)",
			"error", err, "degraded_decisions", n)
	}
}

// tooManyRules records a request refused for matching n rules, more than
// maxRules: the hook, and a log line at most every tooManyLogInterval.
func (g *Guard) tooManyRules(n int, endpoint string) {
	if g.onTooMany != nil {
		g.onTooMany(n)
	}
	if count, due := g.manyLog.event(tooManyLogInterval); due {
		g.log.Error("request matched more rules than max_rules_per_request: answered 500 TOO_MANY_RULES without a store call; narrow the rules' match",
			"matched_rules", n, "max_rules", g.maxRules, "endpoint", endpoint, "refused_requests", count)
	}
}

// degrade decides a check while the store is unavailable: `on_failure:
// closed` rules through the fallback store with their limits scaled by the
// gateway's share of the fleet; every other rule allows (fail open).
//
// Nothing decided here is ever sent to the store afterwards: admissions
// made while degraded are not charged to the shared counters once Redis is
// back (replaying them would reject clients for traffic the fleet already
// let through, long after the fact). The cost of an outage is therefore
// bounded by its length: fail-open rules admit everything meanwhile, and
// fail-closed rules up to share × limit per gateway.
func (g *Guard) degrade(ctx context.Context, op Op, ruleOf []*rules.Rule, counters []Counter, res []CounterResult) (int64, error) {
	now := g.clock()
	for i := range res {
		res[i] = CounterResult{Allowed: true}
	}
	if g.fallback == nil {
		return now, nil
	}
	var closed []Counter
	var idx []int
	for i, c := range counters {
		if ruleOf[i].OnFailure == rules.FailClosed {
			c.Params.Limit = max(1, int64(float64(c.Params.Limit)*g.share))
			closed = append(closed, c)
			idx = append(idx, i)
		}
	}
	if len(closed) == 0 {
		return now, nil
	}
	fr := make([]CounterResult, len(closed))
	if _, err := g.fallback.Do(ctx, op, now, closed, fr); err != nil {
		return now, err
	}
	for j, i := range idx {
		res[i] = fr[j]
	}
	return now, nil
}

// counterID returns the identity of rule r's counter for req:
// anonymous requests count key- and tenant-scope rules per client IP.
func counterID(r *rules.Rule, req *rules.Request) CounterID {
	id := CounterID{Rule: r.Tag, Scope: r.Scope}
	if req.Key == "" && (id.Scope == rules.ScopeKey || id.Scope == rules.ScopeTenant) {
		id.Scope = rules.ScopeIP
	}
	switch id.Scope {
	case rules.ScopeIP:
		id.IP = counterIP(req.IP)
	case rules.ScopeKey:
		id.Tenant, id.KeyID = req.Tenant, req.KeyID
	case rules.ScopeTenant:
		id.Tenant = req.Tenant
	}
	if r.ByEndpoint {
		id.Endpoint = req.Endpoint
	}
	return id
}

// counterIP returns the address an ip-scope counter counts by: an IPv4
// address (unmapped), or an IPv6 address's /64.
func counterIP(ip netip.Addr) netip.Addr {
	if !ip.IsValid() {
		return ip
	}
	ip = ip.Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.Addr()
	}
	return ip
}

// counterName names rule r's counter for req through the store's Namer.
func (g *Guard) counterName(r *rules.Rule, req *rules.Request) string {
	id := counterID(r, req)
	return g.namer(&id)
}

func (d *Decision) reject(status int, code string, reason Reason) {
	d.Allowed, d.Status, d.Code, d.Reason = false, status, code, reason
}

func ceilDiv(x, y int64) int64 {
	q := x / y
	if x%y != 0 && (x < 0) == (y < 0) {
		q++
	}
	return q
}
