package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate/tollgate/loadtest/internal/chaos/history"
)

// rlsDomain is the Envoy RLS domain of the soak's requests; its rules
// name no domain, so they apply to every domain.
const rlsDomain = "chaos"

// client sends the soak's requests through the three surfaces of a
// gateway and turns each answer into what the history keeps.
type client struct {
	http     *http.Client
	deadline time.Duration

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn // guarded by mu; by address
}

func newClient(deadline time.Duration) *client {
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: deadline, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	return &client{
		http: &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		}},
		deadline: deadline,
		conns:    map[string]*grpc.ClientConn{},
	}
}

func (c *client) close() {
	c.http.CloseIdleConnections()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cc := range c.conns {
		_ = cc.Close()
	}
}

// do sends one request and returns what its client saw. cost 0 is a peek
// (check API only).
func (c *client) do(ctx context.Context, g *gateway, surface string, k *history.Key, endpoint string, cost int64) history.Answer {
	a := history.Answer{Gateway: g.index, Surface: surface, Key: k.Name, Endpoint: endpoint, Cost: cost}
	ctx, cancel := context.WithTimeout(ctx, c.deadline)
	defer cancel()
	a.Sent = now()
	switch surface {
	case history.SurfaceProxy:
		c.proxy(ctx, g, k, endpoint, &a)
	case history.SurfaceCheck:
		c.check(ctx, g, k, endpoint, cost, &a)
	case history.SurfaceRLS:
		c.rls(ctx, g, k, endpoint, &a)
	}
	a.Recv = now()
	return a
}

// httpDo sends req, noting whether it was written, and reads the answer.
func (c *client) httpDo(req *http.Request, a *history.Answer) (*http.Response, []byte) {
	var wrote bool
	var mu sync.Mutex
	trace := &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { mu.Lock(); wrote = true; mu.Unlock() }}
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
	resp, err := c.http.Do(req)
	mu.Lock()
	a.Written = wrote
	mu.Unlock()
	if err != nil {
		a.Err = shortErr(err)
		return nil, nil
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 8<<10))
	if err != nil {
		a.Written = true
		a.Err = "read body: " + shortErr(err)
		return nil, nil
	}
	a.Status = resp.StatusCode
	return resp, body
}

func (c *client) proxy(ctx context.Context, g *gateway, k *history.Key, endpoint string, a *history.Answer) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+g.proxy+endpoint, nil)
	if err != nil {
		a.Err = err.Error()
		return
	}
	req.Header.Set("X-API-Key", k.Raw)
	resp, body := c.httpDo(req, a)
	if resp == nil {
		return
	}
	headers(resp.Header.Get, a)
	if a.Status == 429 || a.Status == 403 || a.Status == 400 {
		var e struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if json.Unmarshal(body, &e) == nil {
			a.Code = e.Error.Code
		}
	}
}

// checkBody is a POST /v1/check body; Cost is always sent (0: a peek).
type checkBody struct {
	APIKey   string `json:"api_key"`
	Endpoint string `json:"endpoint"`
	Method   string `json:"method"`
	Cost     int64  `json:"cost"`
}

// checkAnswer is what the harness reads of a check API decision.
type checkAnswer struct {
	Allowed    bool   `json:"allowed"`
	Status     int    `json:"status"`
	Limit      int64  `json:"limit"`
	RetryAfter int64  `json:"retry_after"`
	Rule       string `json:"rule"`
	Degraded   bool   `json:"degraded"`
	Error      *struct {
		Code string `json:"code"`
	} `json:"error"`
}

func (c *client) check(ctx context.Context, g *gateway, k *history.Key, endpoint string, cost int64, a *history.Answer) {
	b, _ := json.Marshal(checkBody{APIKey: k.Raw, Endpoint: endpoint, Method: http.MethodGet, Cost: cost})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+g.api+"/v1/check", bytes.NewReader(b))
	if err != nil {
		a.Err = err.Error()
		return
	}
	req.Header.Set("Content-Type", "application/json")
	resp, body := c.httpDo(req, a)
	if resp == nil {
		return
	}
	var d checkAnswer
	if err := json.Unmarshal(body, &d); err != nil {
		if a.Status < 500 {
			a.Err = "decision: " + shortErr(err)
		}
		return
	}
	a.Degraded, a.Rule, a.RetryAfter, a.Limit = d.Degraded, d.Rule, d.RetryAfter, d.Limit
	if d.Error != nil {
		a.Code = d.Error.Code
	}
}

func (c *client) rlsConn(addr string) (rlsv3.RateLimitServiceClient, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cc := c.conns[addr]
	if cc == nil {
		var err error
		if cc, err = grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
			return nil, err
		}
		c.conns[addr] = cc
	}
	return rlsv3.NewRateLimitServiceClient(cc), nil
}

func (c *client) rls(ctx context.Context, g *gateway, k *history.Key, endpoint string, a *history.Answer) {
	cl, err := c.rlsConn(g.grpcAdr)
	if err != nil {
		a.Err = err.Error()
		return
	}
	d := &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
		{Key: "api_key", Value: k.Raw}, {Key: "path", Value: endpoint},
	}}
	if a.Cost == 0 {
		d.HitsAddend = wrapperspb.UInt64(0)
	}
	resp, err := cl.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: rlsDomain, Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
	if err != nil {
		st, _ := status.FromError(err)
		// A refused connection never carried the call; anything else
		// may have.
		a.Written = !(st.Code() == codes.Unavailable && strings.Contains(st.Message(), "connection refused"))
		a.Err = shortErr(err)
		return
	}
	a.Written = true
	switch resp.GetOverallCode() {
	case rlsv3.RateLimitResponse_OK:
		a.Status = 200
	case rlsv3.RateLimitResponse_OVER_LIMIT:
		a.Status = 429
	default:
		a.Status = 500
	}
	hs := map[string]string{}
	for _, h := range resp.GetResponseHeadersToAdd() {
		hs[http.CanonicalHeaderKey(h.GetKey())] = h.GetValue()
	}
	headers(func(name string) string { return hs[http.CanonicalHeaderKey(name)] }, a)
}

// headers reads the rate-limit headers into a.
func headers(get func(string) string, a *history.Answer) {
	a.Degraded = strings.EqualFold(get("X-RateLimit-Policy"), "degraded")
	a.Rule = get("X-RateLimit-Resource")
	if v, err := strconv.ParseInt(get("Retry-After"), 10, 64); err == nil {
		a.RetryAfter = v
	}
	if v, err := strconv.ParseInt(get("X-RateLimit-Limit"), 10, 64); err == nil {
		a.Limit = v
	}
}

// shortErr keeps an error's text short and free of addresses that change
// from run to run, so that the history and the report group them.
func shortErr(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline exceeded"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	}
	s := err.Error()
	if st, ok := status.FromError(err); ok {
		s = st.Code().String() + ": " + st.Message()
	}
	for _, known := range []string{"connection refused", "connection reset", "EOF", "broken pipe", "deadline exceeded"} {
		if strings.Contains(s, known) {
			return known
		}
	}
	if len(s) > 120 {
		s = s[:120]
	}
	return s
}
