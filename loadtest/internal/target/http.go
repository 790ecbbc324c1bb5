// Package target sends load-test requests to Tollgate's three interfaces
// (docs/gateway.md): the proxy ([Proxy]: any HTTP request, key in X-API-Key), the
// check API ([Check]: POST /v1/check) and the Envoy rate-limit service
// ([RLS]: gRPC ShouldRateLimit). Each implements gen.Target and is safe for
// concurrent use; Close releases its connections.
//
// HTTP answers are classed as 2xx, 400, 403, 403 PENALTY, 429, 429 PENALTY,
// other 4xx, 5xx and other (1xx, 3xx); every class but 5xx is a decision. gRPC answers are classed by
// their overall code: OK and OVER_LIMIT are decisions, UNKNOWN is not.
package target

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/tollgate/tollgate/guard/apierror"
	"github.com/tollgate/tollgate/loadtest/internal/gen"
	"github.com/tollgate/tollgate/loadtest/internal/report"
)

// HTTP outcome indexes, in the order of HTTPOutcomes.
const (
	HTTP2xx = iota
	HTTP400
	HTTP403
	HTTP403Penalty
	HTTP429
	HTTP429Penalty
	HTTP4xx
	HTTP5xx
	HTTPOther
)

// HTTPOutcomes are the classes of HTTP answers. A 403 or 429 is the penalty
// ladder's when its body says so (ClassifyAnswer): "429 PENALTY" (level 2,
// cooldown) and "403 PENALTY" (level 3: the key is blocked); "429" is a
// rule's limit and "403" any other block.
var HTTPOutcomes = []report.Outcome{
	HTTP2xx:        {Name: "2xx", Decision: true},
	HTTP400:        {Name: "400", Decision: true},
	HTTP403:        {Name: "403", Decision: true},
	HTTP403Penalty: {Name: "403 PENALTY", Decision: true, Penalty: true},
	HTTP429:        {Name: "429", Decision: true},
	HTTP429Penalty: {Name: "429 PENALTY", Decision: true, Penalty: true},
	HTTP4xx:        {Name: "4xx", Decision: true},
	HTTP5xx:        {Name: "5xx", Decision: false},
	HTTPOther:      {Name: "other", Decision: true},
}

// ClassifyHTTP returns the HTTPOutcomes index of a status code alone: a
// 403 or 429 is "403" or "429" (ClassifyAnswer tells the penalty ladder's
// apart).
func ClassifyHTTP(code int) int {
	switch {
	case code >= 200 && code < 300:
		return HTTP2xx
	case code == http.StatusBadRequest:
		return HTTP400
	case code == http.StatusForbidden:
		return HTTP403
	case code == http.StatusTooManyRequests:
		return HTTP429
	case code >= 400 && code < 500:
		return HTTP4xx
	case code >= 500 && code < 600:
		return HTTP5xx
	default:
		return HTTPOther
	}
}

// Markers of the penalty ladder's answers in a Tollgate error body (the
// proxy's, the check API's, problem+json alike): a 429's error code
// PENALTY; a 403 whose details carry the ladder's level.
var (
	penaltyCode  = []byte(`"code":"` + apierror.Penalty + `"`)
	penaltyLevel = []byte(`"penalty_level":`)
)

// PeekBytes is how much of a 403 or 429 body ClassifyAnswer needs: the
// gateway's error bodies, reason and details included, fit well within it.
const PeekBytes = 2048

// ClassifyAnswer returns the HTTPOutcomes index of an answer with status
// code and body (its first PeekBytes are enough): a 429 whose error code
// is PENALTY is "429 PENALTY", a 403 whose details carry a penalty_level
// is "403 PENALTY", anything else as ClassifyHTTP.
func ClassifyAnswer(code int, body []byte) int {
	switch o := ClassifyHTTP(code); o {
	case HTTP429:
		if bytes.Contains(body, penaltyCode) {
			return HTTP429Penalty
		}
		return o
	case HTTP403:
		if bytes.Contains(body, penaltyLevel) {
			return HTTP403Penalty
		}
		return o
	default:
		return o
	}
}

// HTTPConfig configures [NewProxy] and [NewCheck].
type HTTPConfig struct {
	// URL is the proxy's base URL (each request's path is appended to it)
	// or the check endpoint's full URL.
	URL string
	// Method is the proxy's request method, or the method the check body
	// names.
	Method string
	// Body is sent with every proxy request (nil: none).
	Body []byte
	// Token, when set, is sent to the check API as a bearer token.
	Token string
	// Cost is the check body's cost.
	Cost int
	// Conns is how many idle connections per host are kept: at least the
	// run's concurrency, so that no request opens a new connection once the
	// pool is warm.
	Conns int
}

// newClient returns an HTTP client tuned for load: one transport, keep-alive,
// conns idle connections per host, no compression, no redirects.
func newClient(conns int) *http.Client {
	conns = max(conns, 1)
	tr := &http.Transport{
		Proxy: nil, // never route load through $HTTP_PROXY
		DialContext: (&net.Dialer{
			Timeout:   5 * time.Second,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		MaxIdleConns:          conns,
		MaxIdleConnsPerHost:   conns,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   5 * time.Second,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
	}
	return &http.Client{
		Transport: tr,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// peekBufs hold the start of 403 and 429 bodies while they are classified.
var peekBufs = sync.Pool{New: func() any { b := make([]byte, PeekBytes); return &b }}

// Finish reads the answer resp — the start of a 403 or 429 body, to tell
// the penalty ladder's apart (ClassifyAnswer) — drains and closes its
// body, so that its connection goes back to the pool, and returns its
// HTTPOutcomes index.
func Finish(resp *http.Response) (int, error) {
	o := ClassifyHTTP(resp.StatusCode)
	var err error
	if o == HTTP403 || o == HTTP429 {
		bp := peekBufs.Get().(*[]byte)
		n, rerr := io.ReadFull(resp.Body, *bp)
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			rerr = nil
		}
		o, err = ClassifyAnswer(resp.StatusCode, (*bp)[:n]), rerr
		peekBufs.Put(bp)
	}
	if err == nil {
		_, err = io.Copy(io.Discard, resp.Body)
	}
	if cerr := resp.Body.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("read body: %w", err)
	}
	return o, nil
}

// httpClient is what the HTTP targets share: the client, sending a
// request and classifying its answer, and Close.
type httpClient struct{ client *http.Client }

// send sends hr and returns its HTTPOutcomes index (Finish).
func (h httpClient) send(hr *http.Request) (int, error) {
	resp, err := h.client.Do(hr)
	if err != nil {
		return 0, err
	}
	return Finish(resp)
}

// Close closes idle connections.
func (h httpClient) Close() error {
	h.client.CloseIdleConnections()
	return nil
}

// Proxy sends requests through the gateway's proxy: Method to URL + path,
// with the key in X-API-Key.
type Proxy struct {
	httpClient
	base   string
	method string
	body   []byte
}

var _ gen.Target = (*Proxy)(nil)

// NewProxy returns a Proxy target for cfg (URL, Method, Body, Conns).
func NewProxy(cfg HTTPConfig) *Proxy {
	return &Proxy{
		httpClient: httpClient{newClient(cfg.Conns)},
		base:       strings.TrimSuffix(cfg.URL, "/"),
		method:     cfg.Method,
		body:       cfg.Body,
	}
}

// Outcomes returns HTTPOutcomes.
func (p *Proxy) Outcomes() []report.Outcome { return HTTPOutcomes }

// Do sends one request to the URL's base followed by req.Path (the URL
// itself when Path is empty).
func (p *Proxy) Do(ctx context.Context, req gen.Request) (int, error) {
	u := p.base + req.Path
	if req.Path == "" {
		u = p.base
	}
	var body io.Reader
	if p.body != nil {
		body = bytes.NewReader(p.body)
	}
	hr, err := http.NewRequestWithContext(ctx, p.method, u, body)
	if err != nil {
		return 0, err
	}
	hr.Header.Set("X-API-Key", req.Key)
	return p.send(hr)
}

// Check sends POST /v1/check requests to the gateway's check API.
type Check struct {
	httpClient
	url    string
	auth   string // Authorization header value, or ""
	method string
	cost   int
}

var _ gen.Target = (*Check)(nil)

// NewCheck returns a Check target for cfg (URL, Method, Token, Cost, Conns).
func NewCheck(cfg HTTPConfig) *Check {
	c := &Check{httpClient: httpClient{newClient(cfg.Conns)}, url: cfg.URL, method: cfg.Method, cost: cfg.Cost}
	if cfg.Token != "" {
		c.auth = "Bearer " + cfg.Token
	}
	return c
}

// CheckBody is the JSON body Check sends.
type CheckBody struct {
	APIKey   string `json:"api_key"`
	Endpoint string `json:"endpoint"`
	Method   string `json:"method"`
	Cost     int    `json:"cost"`
}

// Outcomes returns HTTPOutcomes.
func (c *Check) Outcomes() []report.Outcome { return HTTPOutcomes }

// Do asks the check API for a decision on req.Key at req.Path.
func (c *Check) Do(ctx context.Context, req gen.Request) (int, error) {
	body, err := json.Marshal(CheckBody{APIKey: req.Key, Endpoint: req.Path, Method: c.method, Cost: c.cost})
	if err != nil {
		return 0, fmt.Errorf("encode check body: %w", err)
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	hr.Header.Set("Content-Type", "application/json")
	if c.auth != "" {
		hr.Header.Set("Authorization", c.auth)
	}
	return c.send(hr)
}
