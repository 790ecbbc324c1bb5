package rls

import (
	"context"
	"log/slog"
	"math"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tollgate/tollgate/guard"
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
	reqs, peek, err := s.limits.convert(req)
	if err != nil {
		s.log.Debug("rls: malformed call", "error", err)
		return nil, status.Error(codes.InvalidArgument, "tollgate: "+err.Error())
	}
	if s.g == nil {
		return nil, status.Error(codes.Unavailable, "tollgate: no guard")
	}
	// Per-descriptor side effects (metrics, decision events) are the
	// guard's observers: they see every descriptor decided.
	ds, err := s.decide(ctx, reqs, peek)
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, status.FromContextError(ctxErr).Err()
		}
		s.log.Warn("rls: no decision", "domain", req.Domain, "error", err)
		return nil, status.Error(codes.Unavailable, "tollgate: no rate-limit decision could be made")
	}
	for _, d := range ds {
		if d != nil && d.Code == guard.CodeTooManyRules {
			// HTTP's 500: a fault of the rules, not of the client, so not
			// OVER_LIMIT; Envoy's failure_mode_deny decides. The guard
			// logs it (rate-limited) and the metrics count it.
			return nil, status.Error(codes.Internal, "tollgate: "+guard.CodeTooManyRules+": a descriptor matches more rules than max_rules_per_request")
		}
	}
	return s.answer(reqs, ds), nil
}

// decide decides the call's requests: peeks first, one by one, then, if
// none of them would be rejected, the others together with CheckMany.
// ds[i] is nil for a request not decided.
func (s *Server) decide(ctx context.Context, reqs []guard.Request, peek []bool) ([]*guard.Decision, error) {
	ds := make([]*guard.Decision, len(reqs))
	var (
		check  []*guard.Request
		checkD []*guard.Decision
	)
	for i := range reqs {
		if !peek[i] {
			ds[i] = new(guard.Decision)
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
				if !peek[j] || j > i {
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

// answer builds the response for decisions ds of reqs.
func (s *Server) answer(reqs []guard.Request, ds []*guard.Decision) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(ds)),
	}
	rs := s.g.Rules()
	for i, d := range ds {
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_UNKNOWN}
		resp.Statuses[i] = st
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
		st.CurrentLimit = currentLimit(rr.ID, rr.Limit, num, den, own)
		st.LimitRemaining = uint32(min(max(rr.Remaining, 0), math.MaxUint32))
		st.DurationUntilReset = untilReset(rr.Reset, d.Time)
	}
	if k := guard.CallDeciding(ds); k >= 0 {
		var buf [12][2]string
		pairs := httpguard.HeaderPairs(ds[k], buf[:0])
		resp.ResponseHeadersToAdd = make([]*corev3.HeaderValue, len(pairs))
		for j, p := range pairs {
			resp.ResponseHeadersToAdd[j] = &corev3.HeaderValue{Key: p[0], Value: p[1]}
		}
	}
	return resp
}

// maxResetUS bounds duration_until_reset (a century) so that no clock
// oddity overflows time.Duration.
const maxResetUS = 100 * 365 * 86400 * 1_000_000

// untilReset returns the time from the decision time now (Unix µs) to
// reset (Unix seconds, rounded up), at least 0.
func untilReset(reset, now int64) *durationpb.Duration {
	us := int64(0)
	if reset > 0 && reset < math.MaxInt64/1_000_000 {
		us = min(max(reset*1_000_000-now, 0), maxResetUS)
	}
	return durationpb.New(time.Duration(us) * time.Microsecond)
}
