package rls

import (
	"context"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/apierror"
	"github.com/tollgate/tollgate/guard/httpguard"
)

// Defaults of the limits on one call.
const (
	DefaultMaxDescriptors = 64
	DefaultMaxEntries     = 32
	DefaultMaxValueLen    = 1024
)

// Server is the Envoy rate-limit service. Create it with New and attach it
// to a gRPC server with Register. It is safe for concurrent use and starts
// no goroutines.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer

	g      guard.Checker
	log    *slog.Logger
	limits limits
}

var _ rlsv3.RateLimitServiceServer = (*Server)(nil)

// Option configures a Server.
type Option interface{ apply(*Server) }

type optionFunc func(*Server)

func (f optionFunc) apply(s *Server) { f(s) }

// WithLogger sets the logger for calls that could not be decided (warn)
// and malformed calls (debug). Default, and for nil: discard. API keys are
// never logged.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(s *Server) {
		if l != nil {
			s.log = l
		}
	})
}

// WithMaxDescriptors sets the most descriptors one call may hold (default
// DefaultMaxDescriptors); a longer call gets InvalidArgument. n ≤ 0 keeps
// the default.
func WithMaxDescriptors(n int) Option {
	return optionFunc(func(s *Server) {
		if n > 0 {
			s.limits.descriptors = n
		}
	})
}

// WithMaxEntries sets the most entries one descriptor may hold (default
// DefaultMaxEntries); more get InvalidArgument. n ≤ 0 keeps the default.
func WithMaxEntries(n int) Option {
	return optionFunc(func(s *Server) {
		if n > 0 {
			s.limits.entries = n
		}
	})
}

// WithMaxValueLen sets the longest domain, entry key or entry value, in
// bytes (default DefaultMaxValueLen); longer ones get InvalidArgument. An
// api_key value within it but longer than guard.MaxKeyLen is an invalid
// key, answered OVER_LIMIT like its HTTP 400. n ≤ 0 keeps the default.
func WithMaxValueLen(n int) Option {
	return optionFunc(func(s *Server) {
		if n > 0 {
			s.limits.valueLen = n
		}
	})
}

// New returns a Server deciding with g.
func New(g guard.Checker, opts ...Option) *Server {
	s := &Server{
		g:   g,
		log: slog.New(slog.DiscardHandler),
		limits: limits{
			descriptors: DefaultMaxDescriptors,
			entries:     DefaultMaxEntries,
			valueLen:    DefaultMaxValueLen,
		},
	}
	for _, o := range opts {
		o.apply(s)
	}
	return s
}

// Register registers s as gs's envoy.service.ratelimit.v3.RateLimitService.
func (s *Server) Register(gs *grpc.Server) { rlsv3.RegisterRateLimitServiceServer(gs, s) }

// ShouldRateLimit decides one call: all its descriptors together, all or
// nothing (see the package documentation). Malformed calls get
// InvalidArgument; calls that cannot be decided at all get Unavailable (or
// the context's code when the caller gave up).
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return s.shouldRateLimit(ctx, req, nil)
}

// An Exchange is one call given as its encoded request: the request,
// decoded, and the storage of its response, pooled, so that a call
// decided and encoded at once (Server.Decide, then AppendResponse)
// allocates little. Release it once its response is encoded.
type Exchange struct {
	req   rlsv3.RateLimitRequest
	arena requestArena
	resp  response
}

var exchangePool = sync.Pool{New: func() any { return new(Exchange) }}

// DecodeExchange decodes msg, a RateLimitRequest, as DecodeRequest does,
// into a pooled Exchange.
func DecodeExchange(msg []byte) (*Exchange, error) {
	x := exchangePool.Get().(*Exchange)
	if err := decodeRequest(msg, &x.req, &x.arena); err != nil {
		x.Release()
		return nil, err
	}
	return x, nil
}

// Release empties x (the call's keys among it) and pools it: neither x
// nor the response Decide returned for it may be used after.
func (x *Exchange) Release() {
	x.req = rlsv3.RateLimitRequest{}
	x.arena = requestArena{}
	x.resp = response{}
	exchangePool.Put(x)
}

// Decide is ShouldRateLimit for x's request; the response is x's, valid
// until x.Release.
func (s *Server) Decide(ctx context.Context, x *Exchange) (*rlsv3.RateLimitResponse, error) {
	return s.shouldRateLimit(ctx, &x.req, &x.resp)
}

// shouldRateLimit is ShouldRateLimit answering into ar (nil: allocated).
func (s *Server) shouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest, ar *response) (*rlsv3.RateLimitResponse, error) {
	c := callPool.Get().(*call)
	defer c.release()
	if err := s.limits.convert(req, c); err != nil {
		s.log.Debug("rls: malformed call", "error", err)
		return nil, status.Error(codes.InvalidArgument, "tollgate: "+err.Error())
	}
	if s.g == nil {
		return nil, status.Error(codes.Unavailable, "tollgate: no guard")
	}
	if guard.IsLocalOnly(ctx) && slices.Contains(c.peek, true) {
		// Peeks are decided one by one, each told to the observers: a
		// call that has them is decided where it may wait, all at once.
		return nil, guard.ErrWouldBlock
	}
	// Per-descriptor side effects (metrics, decision events) are the
	// guard's observers: they see every descriptor decided.
	ds, err := s.decide(ctx, c)
	if err == guard.ErrWouldBlock {
		return nil, err
	}
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, status.FromContextError(ctxErr).Err()
		}
		s.log.Warn("rls: no decision", "domain", req.Domain, "error", err)
		return nil, status.Error(codes.Unavailable, "tollgate: no rate-limit decision could be made")
	}
	for _, d := range ds {
		if d != nil && d.Code == apierror.TooManyRules {
			// HTTP's 500: a fault of the rules, not of the client, so not
			// OVER_LIMIT; Envoy's failure_mode_deny decides. The guard
			// logs it (rate-limited) and the metrics count it.
			return nil, status.Error(codes.Internal, "tollgate: "+apierror.TooManyRules+": a descriptor matches more rules than max_rules_per_request")
		}
	}
	if ar == nil {
		ar = new(response)
	}
	return s.answer(ar, c.reqs, ds), nil
}

// call is the storage of one call, pooled: its requests (with their
// Descriptor maps) and decisions (with their Rules) are reused, so a call
// allocates little of its own beyond its response.
type call struct {
	reqs   []guard.Request
	peek   []bool
	maps   []map[string]string
	store  []guard.Decision
	ds     []*guard.Decision
	check  []*guard.Request
	checkD []*guard.Decision
}

var callPool = sync.Pool{New: func() any { return new(call) }}

// maxPooledDescriptors is the largest call whose storage goes back to the
// pool: a rare call of many descriptors does not keep its storage alive.
const maxPooledDescriptors = 8

// size makes c hold n requests, peeks, maps and decisions.
func (c *call) size(n int) {
	for len(c.maps) < n {
		c.maps = append(c.maps, make(map[string]string, 4))
	}
	if cap(c.reqs) < n {
		c.reqs = make([]guard.Request, n)
		c.peek = make([]bool, n)
		c.store = make([]guard.Decision, n)
		c.ds = make([]*guard.Decision, n)
	}
	c.reqs, c.peek, c.store, c.ds = c.reqs[:n], c.peek[:n], c.store[:n], c.ds[:n]
}

// release empties c of the call's data (keys among it) and pools it.
func (c *call) release() {
	clear(c.reqs)
	for i := range c.store {
		d := &c.store[i]
		rules := d.Rules[:0]
		clear(d.Rules)
		*d = guard.Decision{Rules: rules}
	}
	for _, m := range c.maps {
		clear(m)
	}
	clear(c.ds)
	clear(c.check)
	clear(c.checkD)
	if len(c.maps) > maxPooledDescriptors {
		return
	}
	callPool.Put(c)
}

// decide decides the call's requests: peeks first, one by one, then, if
// none of them would be rejected, the others together with CheckMany.
// ds[i] is nil for a request not decided.
func (s *Server) decide(ctx context.Context, c *call) ([]*guard.Decision, error) {
	reqs, ds := c.reqs, c.ds
	check, checkD := c.check[:0], c.checkD[:0]
	defer func() { c.check, c.checkD = check, checkD }()
	for i := range reqs {
		if !c.peek[i] {
			ds[i] = &c.store[i]
			check = append(check, &reqs[i])
			checkD = append(checkD, ds[i])
			continue
		}
		d, err := s.g.Peek(ctx, &reqs[i])
		if err != nil {
			return nil, err
		}
		ds[i] = d
		if !d.Allowed {
			// The call is refused: decide nothing more, charge nothing.
			for j := range reqs {
				if !c.peek[j] || j > i {
					ds[j] = nil
				}
			}
			return ds, nil
		}
	}
	if len(check) > 0 {
		if err := s.g.CheckMany(ctx, check, checkD); err != nil {
			return nil, err
		}
	}
	return ds, nil
}

// response is the storage of a one-descriptor answer, allocated at once
// (gRPC marshals it after the handler returns, so it is pooled only in an
// Exchange).
type response struct {
	resp    rlsv3.RateLimitResponse
	ptrs    [1]*rlsv3.RateLimitResponse_DescriptorStatus
	status  rlsv3.RateLimitResponse_DescriptorStatus
	limit   rlsv3.RateLimitResponse_RateLimit
	reset   durationpb.Duration
	hdrPtrs [12]*corev3.HeaderValue
	hdrs    [12]corev3.HeaderValue
	// contentType is the header of an error body (RawBody).
	contentType corev3.HeaderValue
}

// answer builds the response for decisions ds of reqs in ar (zero).
func (s *Server) answer(ar *response, reqs []guard.Request, ds []*guard.Decision) *rlsv3.RateLimitResponse {
	resp := &ar.resp
	resp.OverallCode = rlsv3.RateLimitResponse_OK
	if len(ds) == 1 {
		ar.ptrs[0] = &ar.status
		resp.Statuses = ar.ptrs[:]
	} else {
		resp.Statuses = make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(ds))
	}
	rs := s.g.Rules()
	for i, d := range ds {
		st := resp.Statuses[i]
		if st == nil {
			st = new(rlsv3.RateLimitResponse_DescriptorStatus)
			resp.Statuses[i] = st
		}
		st.Code = rlsv3.RateLimitResponse_UNKNOWN
		if d == nil || !d.Allowed {
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if d == nil {
			continue
		}
		switch {
		case d.Allowed:
			st.Code = rlsv3.RateLimitResponse_OK
		case d.Reason == guard.ReasonCallRejected:
			if len(d.Rules) > 0 {
				st.Code = rlsv3.RateLimitResponse_OK
			}
		default:
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		rr := d.DecidingRule()
		if rr == nil || rr.FailOpen {
			continue
		}
		num, den, own := period(rs, rr, reqs[i].Key, d.KeyID)
		var cl *rlsv3.RateLimitResponse_RateLimit
		var reset *durationpb.Duration
		if i == 0 {
			cl, reset = &ar.limit, &ar.reset
		} else {
			cl, reset = new(rlsv3.RateLimitResponse_RateLimit), new(durationpb.Duration)
		}
		currentLimit(cl, rr.ID, rr.Limit, num, den, own)
		st.CurrentLimit = cl
		st.LimitRemaining = uint32(min(max(rr.Remaining, 0), math.MaxUint32))
		untilReset(reset, rr.Reset, d.Time)
		st.DurationUntilReset = reset
	}
	if k := guard.CallDeciding(ds); k >= 0 {
		var buf [12][2]string
		pairs := httpguard.HeaderPairs(ds[k], buf[:0])
		hdrs := ar.hdrPtrs[:0]
		for j, p := range pairs {
			var h *corev3.HeaderValue
			if j < len(ar.hdrs) {
				h = &ar.hdrs[j]
			} else {
				h = new(corev3.HeaderValue)
			}
			h.Key, h.Value = p[0], p[1]
			hdrs = append(hdrs, h)
		}
		// A refusal that HTTP answers other than 429 (400 INVALID_KEY,
		// INVALID_PATH, COST_EXCEEDS_LIMIT; 403 KEY_BLOCKED,
		// ENDPOINT_BLOCKED) carries the proxy's JSON error body, which
		// Envoy sends with its rate_limited_status: the client sees the
		// code. A 429 stays bodiless, as envoyproxy/ratelimit's.
		if d := ds[k]; !d.Allowed && d.Status != http.StatusTooManyRequests {
			var status int
			if resp.RawBody, status = httpguard.AppendDecisionBody(nil, d); status != http.StatusOK {
				ar.contentType = corev3.HeaderValue{Key: "content-type", Value: "application/json"}
				hdrs = append(hdrs, &ar.contentType)
			}
		}
		resp.ResponseHeadersToAdd = hdrs
	}
	return resp
}

// maxResetUS bounds duration_until_reset (a century) so that no clock
// oddity overflows time.Duration.
const maxResetUS = 100 * 365 * 86400 * 1_000_000

// untilReset sets into the time from the decision time now (Unix µs) to
// reset (Unix seconds, rounded up), at least 0.
func untilReset(into *durationpb.Duration, reset, now int64) {
	us := int64(0)
	if reset > 0 && reset < math.MaxInt64/1_000_000 {
		us = min(max(reset*1_000_000-now, 0), maxResetUS)
	}
	into.Seconds, into.Nanos = us/1_000_000, int32(us%1_000_000)*1000
}
