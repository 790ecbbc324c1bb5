package httpguard

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"sync"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/rules"
)

// ErrorHandler answers a request when the Checker returned an error, that
// is when no decision could be made at all. It either calls next (fail
// open) or writes a response itself.
type ErrorHandler func(w http.ResponseWriter, r *http.Request, next http.Handler, err error)

// FailOpen is the default ErrorHandler: it calls next without rate-limit
// headers, as a rule with on_failure: open would.
func FailOpen(w http.ResponseWriter, r *http.Request, next http.Handler, _ error) {
	next.ServeHTTP(w, r)
}

// Option configures Middleware.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	id      *Identity
	log     *slog.Logger
	onError ErrorHandler
	onClose func(*http.Request, *guard.Decision)
	surface string
}

// WithOnClose sets a function called each time the middleware answers
// Connection: close to a rejection (see [TrackConn]), with the request and
// its decision (default: none), for metrics and for throttling the
// client's address. It runs on the request's goroutine before the answer
// is written, must be quick, and must not keep d: decisions are pooled.
func WithOnClose(fn func(r *http.Request, d *guard.Decision)) Option {
	return optionFunc(func(c *config) { c.onClose = fn })
}

// WithSurface names the surface the middleware's decisions come from, in
// guard.Request.Surface (default "http"; the gateway's proxy says "proxy").
func WithSurface(name string) Option {
	return optionFunc(func(c *config) { c.surface = name })
}

// WithIdentity sets how requests are identified. Default: the zero
// Identity (keys from X-API-Key then Authorization: Bearer, the socket
// peer as client IP, no trusted proxies). id must not change afterwards.
func WithIdentity(id *Identity) Option {
	return optionFunc(func(c *config) {
		if id != nil {
			c.id = id
		}
	})
}

// WithLogger sets the logger for Checker errors (warn) and refused
// identities (debug). Default, and for nil: discard. API keys are never
// logged.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) {
		if l == nil {
			l = slog.New(slog.DiscardHandler)
		}
		c.log = l
	})
}

// WithErrorHandler sets what happens when the Checker cannot decide.
// Default, and for nil: FailOpen.
func WithErrorHandler(h ErrorHandler) Option {
	return optionFunc(func(c *config) {
		if h == nil {
			h = FailOpen
		}
		c.onError = h
	})
}

// Middleware returns net/http middleware that puts c in front of a
// handler. For each request it
//
//   - extracts the identity (WithIdentity); an invalid key or cost is
//     answered 400 INVALID_KEY or INVALID_REQUEST with WriteError;
//   - asks c.CheckInto with the request's context; on an error the
//     ErrorHandler runs (WithErrorHandler; default FailOpen);
//   - answers every decision that is not an admission itself with
//     WriteDecision (429, 403, 400 such as INVALID_PATH, 500
//     TOO_MANY_RULES), adding Connection: close to answers for keys at the
//     top of the penalty ladder and on the blocklist when the client is
//     connected directly (Identity.Direct) — at once, or on a connection
//     tracked with TrackConn at its closeAfter-th such answer — so that a
//     repeat offender pays a new handshake while clients behind a shared
//     proxy keep their connection (over HTTP/2 net/http turns the header
//     into a graceful GOAWAY; WithOnClose hears of each close). The
//     answers the guard makes from its controls alone, 429 PENALTY and 403
//     KEY_BLOCKED for a blocklisted key, are prebuilt per code, body
//     format and Retry-After and written as they are, allocating nothing;
//   - otherwise sets the rate-limit headers and calls the handler with a
//     ResponseWriter that sets them again right before the status is
//     written, so they replace same-named headers the handler set (or
//     deletes them when the decision has no headers), and with the request
//     path in normal form (guard.Decision.Path: "//v1/./x" arrives as
//     "/v1/x", in URL.Path, URL.RawPath and RequestURI), so that the
//     handler serves the resource the limiter counted. When the Checker
//     cannot decide, the path is normalised all the same (400 INVALID_PATH
//     when it cannot be) before the ErrorHandler runs.
//
// The ResponseWriter passed on implements http.Flusher, http.Hijacker and
// io.ReaderFrom by delegation, and Unwrap for http.ResponseController.
// Decisions are pooled: a Checker must not keep the *guard.Decision it
// fills. c must not be nil. The returned middleware is safe for concurrent use and starts no
// goroutines.
func Middleware(c guard.Checker, opts ...Option) func(http.Handler) http.Handler {
	cfg := config{
		id:      &Identity{},
		log:     slog.New(slog.DiscardHandler),
		onError: FailOpen,
		surface: "http",
	}
	for _, o := range opts {
		o.apply(&cfg)
	}
	pool := &sync.Pool{New: func() any {
		st := new(checkState)
		st.d.Deciding = -1
		return st
	}}
	ans := &answers{}
	return func(next http.Handler) http.Handler {
		return &handler{checker: c, cfg: cfg, pool: pool, answers: ans, next: next}
	}
}

// checkState is what one check needs, pooled across requests.
type checkState struct {
	req guard.Request
	d   guard.Decision
}

type handler struct {
	checker guard.Checker
	cfg     config
	pool    *sync.Pool
	answers *answers
	next    http.Handler
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	st := h.pool.Get().(*checkState)
	ctx := r.Context()

	if err := h.cfg.id.Extract(r, &st.req); err != nil {
		h.release(st)
		code, _ := identityRefusal(err)
		h.cfg.log.LogAttrs(ctx, slog.LevelDebug, "httpguard: request refused",
			slog.String("code", code), slog.String("error", err.Error()))
		WriteIdentityError(w, r, err)
		return
	}

	d := &st.d
	st.req.Surface = h.cfg.surface
	if err := h.checker.CheckInto(ctx, &st.req, d); err != nil {
		path := st.req.Path
		h.release(st)
		if ctx.Err() == nil || !errors.Is(err, context.Canceled) {
			h.cfg.log.LogAttrs(ctx, slog.LevelWarn, "httpguard: no decision",
				slog.String("method", r.Method), slog.String("error", err.Error()))
		}
		// Without a decision the path is still normalised, so that even a
		// request let through on an error never reaches the handler under
		// a spelling the limiter would have refused or read differently.
		clean, ok := rules.CleanPath(path)
		if !ok {
			WriteError(w, r, http.StatusBadRequest, guard.CodeInvalidPath, invalidPathMessage)
			return
		}
		h.cfg.onError(w, withPath(r, path, clean), h.next, err)
		return
	}

	if decisionStatus(d) != http.StatusOK {
		if (d.CloseConnection || d.Reason == guard.ReasonBlocklisted) && h.cfg.id.Direct(r) && closeNow(ctx) {
			w.Header()["Connection"] = valueClose
			if h.cfg.onClose != nil {
				h.cfg.onClose(r, d)
			}
		}
		if a := h.answers.get(r, d); a != nil {
			a.write(w)
		} else {
			WriteDecision(w, r, d)
		}
		h.release(st)
		return
	}

	// The rendered headers and the normal path are all the rest needs:
	// the pooled state goes back before the handler runs, however long it
	// streams.
	rw := &responseWriter{ResponseWriter: w, hv: renderHeaders(d)}
	r = withPath(r, st.req.Path, d.Path)
	h.release(st)
	rw.apply()
	h.next.ServeHTTP(rw, r)
	if !rw.wrote && !rw.hijacked {
		// The handler wrote nothing: net/http sends 200 with the header
		// map as it is now, so restore ours over whatever it set.
		rw.apply()
	}
}

// withPath returns r as the handler should see it: with clean, the normal
// form of its escaped path sent (the limiter and the upstream see
// the same resource), in URL.Path, URL.RawPath and RequestURI. It returns r
// itself when sent is already normal or clean is empty (a Checker that
// does not normalise), so the common case costs nothing.
func withPath(r *http.Request, sent, clean string) *http.Request {
	if clean == "" || clean == sent || r.URL == nil {
		return r
	}
	u := *r.URL
	u.RawPath = clean
	if p, err := url.PathUnescape(clean); err == nil {
		u.Path = p
	}
	if u.EscapedPath() == u.Path {
		u.RawPath = ""
	}
	r2 := r.WithContext(r.Context()) // a shallow copy: the caller's r is not changed
	r2.URL = &u
	if r.RequestURI != "" {
		r2.RequestURI = u.RequestURI()
	}
	return r2
}

// release clears st of the request's data (the raw key among it) and
// returns it to the pool, keeping the Rules slice's storage.
func (h *handler) release(st *checkState) {
	st.req = guard.Request{}
	rules := st.d.Rules[:0]
	clear(st.d.Rules)
	st.d = guard.Decision{Rules: rules, Deciding: -1}
	h.pool.Put(st)
}

// responseWriter sets the decision's headers right before the response
// header is written.
type responseWriter struct {
	http.ResponseWriter
	hv       headerValues
	backing  [numFields]string
	wrote    bool
	hijacked bool
}

func (w *responseWriter) apply() { w.hv.apply(w.ResponseWriter.Header(), &w.backing) }

// before runs before anything that writes the response header.
func (w *responseWriter) before() {
	if !w.wrote {
		w.apply()
		w.wrote = true
	}
}

func (w *responseWriter) WriteHeader(code int) {
	if code >= 200 || code == http.StatusSwitchingProtocols {
		w.before()
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *responseWriter) Write(p []byte) (int, error) {
	w.before()
	return w.ResponseWriter.Write(p)
}

// ReadFrom keeps sendfile and friends working through the wrapper.
func (w *responseWriter) ReadFrom(src io.Reader) (int64, error) {
	w.before()
	if rf, ok := w.ResponseWriter.(io.ReaderFrom); ok {
		return rf.ReadFrom(src)
	}
	return io.Copy(w.ResponseWriter, src)
}

// Flush implements http.Flusher; it does nothing when the underlying
// writer cannot flush.
func (w *responseWriter) Flush() { _ = w.FlushError() }

// FlushError is what http.ResponseController.Flush calls.
func (w *responseWriter) FlushError() error {
	w.before()
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Hijack implements http.Hijacker, returning http.ErrNotSupported where
// the underlying writer cannot hijack (HTTP/2).
func (w *responseWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil {
		w.hijacked = true
	}
	return conn, brw, err
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *responseWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
