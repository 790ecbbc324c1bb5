package target

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate/tollgate/loadtest/internal/gen"
	"github.com/tollgate/tollgate/loadtest/internal/report"
)

// RLS outcome indexes, in the order of RLSOutcomes.
const (
	RLSOK = iota
	RLSOverLimit
	RLSOverLimitPenalty
	RLSUnknown
)

// RLSOutcomes are the classes of ShouldRateLimit answers, by overall code;
// an OVER_LIMIT of the penalty ladder is "OVER_LIMIT PENALTY" (see
// ClassifyRLS).
var RLSOutcomes = []report.Outcome{
	RLSOK:               {Name: "OK", Decision: true},
	RLSOverLimit:        {Name: "OVER_LIMIT", Decision: true},
	RLSOverLimitPenalty: {Name: "OVER_LIMIT PENALTY", Decision: true, Penalty: true},
	RLSUnknown:          {Name: "UNKNOWN", Decision: false},
}

// ClassifyRLS returns the RLSOutcomes index of an answer. An OVER_LIMIT is
// the penalty ladder's when the gateway says so: the 403 of its top
// carries the proxy's error body in raw_body, with a penalty_level; its
// 429 PENALTY, bodiless as every 429 over RLS, carries a Retry-After but
// none of the rate-limit headers a rule's rejection carries.
func ClassifyRLS(resp *rlsv3.RateLimitResponse) int {
	switch resp.GetOverallCode() {
	case rlsv3.RateLimitResponse_OK:
		return RLSOK
	case rlsv3.RateLimitResponse_OVER_LIMIT:
	default:
		return RLSUnknown
	}
	if body := resp.GetRawBody(); len(body) > 0 {
		if bytes.Contains(body, penaltyLevel) {
			return RLSOverLimitPenalty
		}
		return RLSOverLimit
	}
	retry, limit := false, false
	for _, h := range resp.GetResponseHeadersToAdd() {
		switch {
		case strings.EqualFold(h.GetKey(), "Retry-After"):
			retry = true
		case strings.EqualFold(h.GetKey(), "X-RateLimit-Limit"):
			limit = true
		}
	}
	if retry && !limit {
		return RLSOverLimitPenalty
	}
	return RLSOverLimit
}

// Descriptor entry keys RLS sends, as the gateway reads them.
const (
	EntryAPIKey = "api_key"
	EntryPath   = "path"
)

// RLSConfig configures [NewRLS].
type RLSConfig struct {
	// Addrs are the service's host:ports, dialled without TLS; requests
	// go to them in turn.
	Addrs []string
	// Domain is every request's domain.
	Domain string
	// Cost is the hits of each request. 1 is sent as Envoy sends it by
	// default (hits_addend unset); 0 is sent as a descriptor hits_addend of
	// 0, a peek; any other value as the request's hits_addend.
	Cost int
	// Conns is the number of gRPC connections per address, used
	// round-robin; at least 1. One HTTP/2 connection carries many
	// concurrent calls.
	Conns int
}

// RLS calls envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit
// with one descriptor of entries api_key and path.
type RLS struct {
	conns   []*grpc.ClientConn
	clients []rlsv3.RateLimitServiceClient
	next    atomic.Uint64
	domain  string
	cost    int
}

var _ gen.Target = (*RLS)(nil)

// rlsWindow is the load client's HTTP/2 stream and connection window.
const rlsWindow = 1 << 20

// NewRLS returns an RLS target. Connections are made lazily, by the first
// calls; an unreachable address shows up as errors then.
func NewRLS(cfg RLSConfig) (*RLS, error) {
	if cfg.Cost < 0 || uint64(cfg.Cost) > 1<<32-1 {
		return nil, fmt.Errorf("target: rls cost %d out of range [0, 2^32)", cfg.Cost)
	}
	r := &RLS{domain: cfg.Domain, cost: cfg.Cost}
	if len(cfg.Addrs) == 0 {
		return nil, errors.New("target: rls: no address")
	}
	for range max(cfg.Conns, 1) {
		for _, addr := range cfg.Addrs {
			cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
				// Fixed HTTP/2 windows, as Envoy's own gRPC client (the rate-limit
				// service's client in production) has: with grpc-go's default
				// dynamic windows the client sends a bandwidth-estimation PING
				// whenever an answer arrives and none is outstanding (0.54 per
				// call to a service answering one call at a time), work no
				// Envoy does and that both sides of a comparison answer.
				grpc.WithInitialWindowSize(rlsWindow), grpc.WithInitialConnWindowSize(rlsWindow))
			if err != nil {
				_ = r.Close()
				return nil, fmt.Errorf("target: rls client for %s: %w", addr, err)
			}
			r.conns = append(r.conns, cc)
			r.clients = append(r.clients, rlsv3.NewRateLimitServiceClient(cc))
		}
	}
	return r, nil
}

// Outcomes returns RLSOutcomes.
func (r *RLS) Outcomes() []report.Outcome { return RLSOutcomes }

// Request returns the ShouldRateLimit request Do sends for req.
func (r *RLS) Request(req gen.Request) *rlsv3.RateLimitRequest {
	d := &ratelimitv3.RateLimitDescriptor{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
			{Key: EntryAPIKey, Value: req.Key},
			{Key: EntryPath, Value: req.Path},
		},
	}
	m := &rlsv3.RateLimitRequest{Domain: r.domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{d}}
	switch r.cost {
	case 0:
		d.HitsAddend = wrapperspb.UInt64(0)
	case 1:
	default:
		m.HitsAddend = uint32(r.cost)
	}
	return m
}

// Do calls ShouldRateLimit for req.
func (r *RLS) Do(ctx context.Context, req gen.Request) (int, error) {
	c := r.clients[r.next.Add(1)%uint64(len(r.clients))]
	resp, err := c.ShouldRateLimit(ctx, r.Request(req))
	if err != nil {
		return 0, err
	}
	return ClassifyRLS(resp), nil
}

// Close closes every connection.
func (r *RLS) Close() error {
	var errs []error
	for _, cc := range r.conns {
		if err := cc.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
