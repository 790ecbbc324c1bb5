package guard

import (
	"cmp"
	"hash/maphash"
	"math"
	"net/netip"
	"sync/atomic"

	"github.com/tollgate/tollgate/guard/keyid"
	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/internal/regions"
)

// DefaultResolutionCache is the default number of resolutions the guard
// caches (WithResolutionCache).
const DefaultResolutionCache = 1 << 16

// resolution is what a request resolves to before any counter is
// consulted, under one ruleset and one state of the controls: its key_id,
// tenant and tier, its list status and penalty, the rules it matches with
// their parameters (overrides applied) and counter names. It depends on
// the request's key, tenant, tier, endpoint, method, domain and (where
// rules count by IP) client address only, so it is computed once per such
// combination and cached (resolutionCache) until the ruleset, the key
// registry (part of the ruleset) or the controls change, or a control it
// used expires. A cached resolution is shared and never modified.
type resolution struct {
	// The cache key: what the resolution was computed from.
	hash                                         uint64
	key, tenantIn, tierIn, endpoint, method, dom string
	ip                                           netip.Addr

	// Valid for rs at controls generation gen, before until (Unix µs: the
	// earliest expiry of a control it applied).
	rs     *rules.Ruleset
	gen    uint64
	shares *shareTable
	until  int64

	keyID, keyPrefix, tenant, tier string
	status                         rules.ListStatus
	penalised                      bool
	penalty                        Penalty
	matched                        int // rules matched (before TOO_MANY_RULES)
	rules                          []resolvedRule
}

// resolvedRule is one matched rule: its parameters for this key and its
// counter's name (empty for a block rule).
type resolvedRule struct {
	rule   *rules.Rule
	params rules.Params
	// limit is the rule's limit for this key before the region's share
	// was taken (a regional rule: params.Limit): a cost above it can
	// never be admitted anywhere.
	limit  int64
	window int64 // params.PolicyWindow
	name   string
	// ledger: a global rule's counter decided against the region's share
	// ledger (Counter.Ledger); nil for every other.
	ledger *Ledger
}

// cacheIP is the client address a resolution depends on: the request's
// when it is anonymous (every rule then counts per IP) or some rule counts
// by IP; none otherwise, so that one key's requests from many addresses
// share one resolution.
func cacheIP(rs *rules.Ruleset, req *Request) netip.Addr {
	if req.Key == "" || rs.CountsByIP() {
		return req.IP
	}
	return netip.Addr{}
}

// matches reports whether r was computed for this request.
func (r *resolution) matches(req *Request, endpoint string, ip netip.Addr) bool {
	return r.key == req.Key && r.endpoint == endpoint && r.method == req.Method && r.dom == req.Domain &&
		r.tenantIn == req.Tenant && r.tierIn == req.Tier && r.ip == ip
}

// current reports whether r still holds for rs, the controls at
// generation gen and the share table st, at time now.
func (r *resolution) current(rs *rules.Ruleset, gen uint64, st *shareTable, now int64) bool {
	return r.rs == rs && r.gen == gen && r.shares == st && now < r.until
}

// resolve computes r for req (whose key is valid) under rs and the
// controls ctl at time now. It allocates: the key_id, names and the rules'
// slice.
func (g *Guard) resolveInto(r *resolution, rs *rules.Ruleset, ctl *ControlSet, st *shareTable, req *Request, endpoint string, ip netip.Addr, now int64) {
	*r = resolution{
		key: req.Key, tenantIn: req.Tenant, tierIn: req.Tier, endpoint: endpoint,
		method: req.Method, dom: req.Domain, ip: ip,
		rs: rs, gen: ctl.Generation(), shares: st, until: math.MaxInt64,
	}
	mreq := rules.Request{
		Key:        req.Key,
		Method:     req.Method,
		Domain:     req.Domain,
		Descriptor: req.Descriptor,
		IP:         req.IP,
		Endpoint:   endpoint,
	}
	if req.Key != "" {
		mreq.KeyID = g.hasher.ID(req.Key)
		r.keyID, r.keyPrefix = mreq.KeyID, keyid.Prefix(req.Key)
		// Identity before the lists, so blocked, allowlisted and penalised
		// decisions carry the key's tenant too: their events go to the
		// tenant's decisions partition, where the aggregator keeps the
		// key's penalty state.
		info, registered := rs.Identify(req.Key)
		switch {
		case registered:
			mreq.Tenant, mreq.Tier = info.Tenant, info.Tier
		default:
			mreq.Tenant, mreq.Tier = req.Tenant, req.Tier
			mreq.Tier = cmp.Or(mreq.Tier, info.Tier)
		}
		mreq.Tenant = cmp.Or(mreq.Tenant, mreq.KeyID)
		r.tenant, r.tier = mreq.Tenant, mreq.Tier

		// Precedence: blocklist > allowlist > penalty > rules.
		st := rs.Listed(req.Key)
		if st == rules.Unlisted {
			var exp int64
			st, exp = ctl.statusExpiry(mreq.KeyID, now)
			r.expires(exp)
		} else if st == rules.Allowlisted {
			if cst, exp := ctl.statusExpiry(mreq.KeyID, now); cst == rules.Blocklisted {
				st = rules.Blocklisted
				r.expires(exp)
			}
		}
		r.status = st
		if st != rules.Unlisted {
			return
		}
		if p, ok := ctl.penalty(mreq.KeyID, now); ok {
			r.penalised, r.penalty = true, p
			r.expires(p.Until)
		}
	}
	r.tenant, r.tier = mreq.Tenant, mreq.Tier

	var buf [8]*rules.Rule
	matched := rs.Match(&mreq, buf[:0])
	r.matched = len(matched)
	if len(matched) == 0 || len(matched) > g.maxRules {
		return
	}
	r.rules = make([]resolvedRule, 0, len(matched))
	for _, rule := range matched {
		rr := resolvedRule{rule: rule}
		if !rule.Block {
			rr.params, _ = rule.ParamsFor(req.Key, mreq.KeyID)
			if o, exp, ok := ctl.overrideExpiry(rule, mreq.KeyID, mreq.Tenant, now); ok {
				rr.params = o.Apply(rr.params)
				r.expires(exp)
			}
			rr.name = g.counterName(rule, &mreq)
			rr.limit = rr.params.Limit
			if rule.Regions == rules.RegionsGlobal {
				// Decided against the share ledger, the counter's limit
				// in the headers is the static share; otherwise the share
				// table's entry or the static share is the limit.
				if rr.ledger = regionLedger(rs, g.region, g.regionsConfig(), rule.Algorithm, rr.params); rr.ledger != nil {
					rr.params.Limit = rr.ledger.Static
				} else {
					rr.params = regionShare(rs, g.region, st, rr.name, rr.params)
				}
			}
			rr.window = rr.params.PolicyWindow(rule.Algorithm)
		}
		r.rules = append(r.rules, rr)
	}
}

// regionShare is p cut to region's share of a global rule's limit: the
// share table's entry for the counter when it has one (never above the
// limit), else the static share. The share is of a window's units, or of
// a bucket's capacity, whose full-refill time stays so that its rate is
// split in the same proportion.
func regionShare(rs *rules.Ruleset, region string, st *shareTable, name string, p rules.Params) rules.Params {
	if u, ok := st.get(name); ok {
		p.Limit = min(max(u, 0), p.Limit)
		return p
	}
	p.Limit = rs.RegionShare(region, p.Limit)
	return p
}

// regionLedger is the share ledger a global rule's counter is decided
// against when the rules list more than one region: p's whole limit and
// the region's static share of it, with the regions' default skew bound
// and period. It is nil for a single region (the rule is then a regional
// one) and for a limit too large for the ledger's exact arithmetic (units
// × window at or above 2^51 µs: an hourly bucket above 625,000 units),
// which then runs at the region's static share without loans.
func regionLedger(rs *rules.Ruleset, region string, cfg regions.Config, alg rules.Algorithm, p rules.Params) *Ledger {
	if len(rs.Regions()) < 2 {
		return nil
	}
	lim := regions.Limit{Kind: regions.FixedWindow, Units: p.Limit, Window: p.Window}
	switch {
	case alg.Bucket():
		lim.Kind = regions.Bucket
		if p.FullDen <= 0 {
			return nil
		}
		// The full-refill time, rounded up: the share refills no faster.
		lim.Window = p.FullNum/p.FullDen + min(1, p.FullNum%p.FullDen)
	case alg != rules.FixedWindow:
		lim.Kind = regions.SlidingWindow
	}
	if lim.Validate(cfg) != nil || lim.Units > 1<<52 || lim.Kind == regions.Bucket && lim.Units > maxLedgerUnitTime/lim.Window {
		return nil
	}
	return &Ledger{
		Region: region, Limit: lim.Units, Static: rs.RegionShare(region, lim.Units),
		Window: lim.Window, Skew: cfg.Skew, Period: cfg.Period,
	}
}

// regionsConfig is the regions protocol's configuration the guard's
// ledgers are kept by: the defaults, but for the period (WithRegionsPeriod).
func (g *Guard) regionsConfig() regions.Config {
	return regions.Config{Period: g.regionsPeriod}.WithDefaults()
}

// maxLedgerUnitTime bounds a ledger's units × window (µs), where its
// arithmetic stays exact (regionstore.MaxBucketUnitTime).
const maxLedgerUnitTime = 1 << 51

// expires makes r valid no later than exp (Unix µs; 0: never expires).
func (r *resolution) expires(exp int64) {
	if exp > 0 {
		r.until = min(r.until, exp)
	}
}

// resolutionProbe is how many slots a resolution may occupy from its hash.
const resolutionProbe = 4

// resolutionCache holds resolutions: open addressing over a fixed array of
// atomic pointers, so that a hit takes no lock, writes nothing and
// allocates nothing, and memory stays bounded (a resolution takes the
// first free or stale slot of its neighbourhood, else replaces its home
// slot's).
type resolutionCache struct {
	slots []atomic.Pointer[resolution]
	mask  uint64
	seed  maphash.Seed
}

func newResolutionCache(n int) *resolutionCache {
	size := resolutionProbe
	for size < n {
		size <<= 1
	}
	return &resolutionCache{slots: make([]atomic.Pointer[resolution], size), mask: uint64(size - 1), seed: maphash.MakeSeed()}
}

// hash hashes the key and endpoint of a request: most requests of one key
// and endpoint share the rest (method, domain, tenant, tier, address),
// which get compares.
func (c *resolutionCache) hash(req *Request, endpoint string) uint64 {
	return maphash.String(c.seed, req.Key) ^ maphash.String(c.seed, endpoint)*0x9e3779b97f4a7c15
}

// get returns the cached resolution of a request, current or not, or nil.
func (c *resolutionCache) get(h uint64, req *Request, endpoint string, ip netip.Addr) *resolution {
	for i := uint64(0); i < resolutionProbe; i++ {
		if r := c.slots[(h+i)&c.mask].Load(); r != nil && r.hash == h && r.matches(req, endpoint, ip) {
			return r
		}
	}
	return nil
}

// put caches r (whose hash is set) for rs at generation gen, share table
// st and time now.
func (c *resolutionCache) put(r *resolution, rs *rules.Ruleset, gen uint64, st *shareTable, now int64) {
	for i := uint64(0); i < resolutionProbe; i++ {
		p := &c.slots[(r.hash+i)&c.mask]
		old := p.Load()
		if old == nil || !old.current(rs, gen, st, now) || (old.hash == r.hash && old.key == r.key && old.endpoint == r.endpoint) {
			p.Store(r)
			return
		}
	}
	c.slots[r.hash&c.mask].Store(r)
}
