// Package proxy is the gateway's public reverse proxy: every request is
// decided by the guard (httpguard.Middleware) before it is forwarded to the
// upstream, and answered by the gateway itself when it is not admitted.
//
// Forwarding is httputil.ReverseProxy with Rewrite: hop-by-hop headers are
// dropped, X-Forwarded-For is appended to (X-Forwarded-Host and -Proto
// set), bodies are streamed in both directions and responses flushed as they
// arrive (FlushInterval -1), so server-sent events and long downloads work.
// The rate-limit headers replace same-named upstream headers.
//
// Optionally a cost is charged after the response: the value of a
// configured upstream response header, reported asynchronously through a
// bounded queue ([Reporter]) so that the response is never held up.
package proxy

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/httpguard"
)

// CodeBadGateway is the error code of a request the upstream did not
// answer (502).
const CodeBadGateway = "UPSTREAM_UNAVAILABLE"

// Config configures the proxy.
type Config struct {
	// Upstream is where admitted requests go; required. Its path is
	// joined in front of each request's path.
	Upstream *url.URL
	// Checker decides; required.
	Checker guard.Checker
	// Identity reads the key, client IP, tenant, tier and cost (nil: the
	// zero Identity).
	Identity *httpguard.Identity
	// CostHeader names an upstream response header whose positive integer
	// value is charged to the request's rules after the response, through
	// Reporter (both needed; empty: none).
	CostHeader string
	Reporter   *Reporter
	// Transport sends requests upstream (nil: NewTransport()).
	Transport http.RoundTripper
	// OnClose is told of every connection the proxy answers with
	// Connection: close (httpguard.WithOnClose); nil: nobody. Track the
	// connections with httpguard.TrackConn (http.Server.ConnContext) so
	// that a client is closed only after several such answers.
	OnClose func(*http.Request, *guard.Decision)
	// Log receives upstream errors (nil: discard). API keys are never
	// logged.
	Log *slog.Logger
}

// NewTransport returns the upstream transport: http.DefaultTransport's
// settings with more idle connections per host, since every request goes
// to the one upstream.
func NewTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 1024
	t.MaxIdleConnsPerHost = 256
	t.IdleConnTimeout = 90 * time.Second
	t.DialContext = (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	return t
}

// New returns the proxy handler. It is safe for concurrent use and starts
// no goroutines.
func New(cfg Config) http.Handler {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Transport == nil {
		cfg.Transport = NewTransport()
	}
	target := cfg.Upstream
	log := cfg.Log
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			// Rewrite starts without the inbound X-Forwarded-*; append to
			// the client's list (X-Forwarded-For is appended to, not replaced).
			if xff, ok := pr.In.Header["X-Forwarded-For"]; ok {
				pr.Out.Header["X-Forwarded-For"] = append([]string(nil), xff...)
			}
			pr.SetXForwarded()
		},
		Transport:     cfg.Transport,
		FlushInterval: -1,
		ErrorLog:      slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // the client went away: nothing to answer
			}
			log.LogAttrs(r.Context(), slog.LevelWarn, "proxy: upstream request failed",
				slog.String("method", r.Method), slog.String("error", err.Error()))
			httpguard.WriteError(w, r, http.StatusBadGateway, CodeBadGateway, "The upstream did not answer.")
		},
	}
	var next http.Handler = rp
	if cfg.CostHeader != "" && cfg.Reporter != nil {
		c := &costs{header: http.CanonicalHeaderKey(cfg.CostHeader), id: cfg.Identity, reporter: cfg.Reporter, log: log}
		rp.ModifyResponse = c.modifyResponse
		next = c.wrap(rp)
	}
	return httpguard.Middleware(cfg.Checker,
		httpguard.WithIdentity(cfg.Identity),
		httpguard.WithLogger(log),
		httpguard.WithSurface("proxy"),
		httpguard.WithOnClose(cfg.OnClose),
	)(next)
}

// costs charges the cost an upstream names in its response.
type costs struct {
	header   string
	id       *httpguard.Identity
	reporter *Reporter
	log      *slog.Logger
}

type inboundKey struct{}

// wrap makes the inbound request reachable from ModifyResponse, which only
// sees the outbound one (with the same context).
func (c *costs) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), inboundKey{}, r)))
	})
}

func (c *costs) modifyResponse(resp *http.Response) error {
	v := resp.Header.Get(c.header)
	if v == "" || resp.Request == nil {
		return nil
	}
	in, _ := resp.Request.Context().Value(inboundKey{}).(*http.Request)
	if in == nil {
		return nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 1 {
		c.log.LogAttrs(in.Context(), slog.LevelWarn, "proxy: upstream cost header is not a positive integer",
			slog.String("header", c.header))
		return nil
	}
	var req guard.Request
	if err := c.id.Extract(in, &req); err != nil {
		return nil // refused by the middleware already; cannot happen here
	}
	req.Cost, req.Surface = n, "proxy"
	c.reporter.Enqueue(req)
	return nil
}

// Reporter charges costs after the fact, off the request path: Enqueue
// never blocks (a full queue drops the report and calls the dropped
// function), and the workers of Run call the report function.
type Reporter struct {
	report  func(context.Context, *guard.Request) error
	dropped func()
	timeout time.Duration
	workers int

	ctx     context.Context // of the report calls; cancelled to abandon
	abandon context.CancelFunc
	drained chan struct{} // closed when Run returns

	mu     sync.RWMutex
	closed bool
	queue  chan guard.Request
}

// NewReporter returns a Reporter with a queue of size reports and workers
// goroutines (started by Run) calling report with a per-call timeout, and
// dropped for each report the full queue refused (nil: none).
func NewReporter(report func(context.Context, *guard.Request) error, size, workers int, timeout time.Duration, dropped func()) *Reporter {
	if dropped == nil {
		dropped = func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Reporter{
		report: report, dropped: dropped, timeout: timeout, workers: max(workers, 1),
		ctx: ctx, abandon: cancel, drained: make(chan struct{}),
		queue: make(chan guard.Request, max(size, 1)),
	}
}

// Enqueue queues a report without blocking; it reports whether the report
// was queued (not after Close, nor when the queue is full).
func (r *Reporter) Enqueue(req guard.Request) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.closed {
		r.dropped()
		return false
	}
	select {
	case r.queue <- req:
		return true
	default:
		r.dropped()
		return false
	}
}

// Run runs the workers until Close, charging what is still queued, and
// returns when they are done. Call it once.
func (r *Reporter) Run() error {
	defer close(r.drained)
	var wg sync.WaitGroup
	for range r.workers {
		wg.Go(func() {
			for req := range r.queue {
				ctx, cancel := context.WithTimeout(r.ctx, r.timeout)
				_ = r.report(ctx, &req)
				cancel()
			}
		})
	}
	wg.Wait()
	return nil
}

// Close stops accepting reports and waits until Run has charged the queue
// or ctx is done, when the remaining reports are abandoned (their calls
// cancelled) and Close waits for Run to return. Run must have been called.
// Close is idempotent.
func (r *Reporter) Close(ctx context.Context) {
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		close(r.queue)
	}
	r.mu.Unlock()
	select {
	case <-r.drained:
	case <-ctx.Done():
		r.abandon()
		<-r.drained
	}
	r.abandon()
}
