package checkapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/textproto"
	"runtime/debug"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/apierror"
	"github.com/tollgate/tollgate/guard/httpguard"
)

// The check API on fasthttp. Under a check load net/http's per-request
// work (a Request, a Header map per side and its clone and sort, a context
// and a background read per request, deadlines reset several times per
// request) cost more gateway CPU than the decision itself. fasthttp reuses
// all of it per connection.
//
// Only the hot path is served natively: an authorized POST to exactly
// /v1/check, /v1/check/batch or /v1/report whose body decodes. Everything
// else — /v1/authz, unknown paths and methods, a missing or wrong token,
// an invalid body, a decision that could not be made — goes to the
// net/http handler through fasthttpadaptor, so every error answer and the
// forward-auth surface are the net/http handler's, byte for byte.

// ServerLimits are the limits of the check API's server beside Config's
// MaxBody, as net/http's Server fields of the same names.
type ServerLimits struct {
	ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	MaxHeaderBytes                                            int
}

// NewFastServer returns the check API's fasthttp server for cfg (as for
// New): headers within ReadHeaderTimeout of the request's first byte, then
// the body within ReadTimeout; a body above cfg.MaxBody is 413
// BODY_TOO_LARGE and a request it cannot read 400 INVALID_REQUEST, as JSON;
// no Server header; fasthttp's log lines go to cfg.Log at debug level.
func NewFastServer(cfg Config, l ServerLimits) *fasthttp.Server {
	h := newHandler(cfg)
	// fasthttpadaptor gives the net/http handler the RequestCtx as the
	// request's context, and fasthttp closes its Done at the start of a
	// shutdown: a drain would then decide /v1/authz and every other
	// request handed over degraded. net/http's Shutdown cancels nothing.
	detached := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(context.WithoutCancel(r.Context())))
	})
	f := &fastHandler{h: h, slow: fasthttpadaptor.NewFastHTTPHandler(detached)}
	bodyTimeout := l.ReadTimeout
	return &fasthttp.Server{
		Handler:      f.serve,
		ErrorHandler: f.readError,
		ReadTimeout:  l.ReadHeaderTimeout,
		HeaderReceived: func(*fasthttp.RequestHeader) fasthttp.RequestConfig {
			return fasthttp.RequestConfig{ReadTimeout: bodyTimeout}
		},
		WriteTimeout:                 l.WriteTimeout,
		IdleTimeout:                  l.IdleTimeout,
		ReadBufferSize:               l.MaxHeaderBytes,
		MaxRequestBodySize:           int(h.cfg.MaxBody),
		NoDefaultServerHeader:        true,
		NoDefaultContentType:         true,
		DisablePreParseMultipartForm: true,
		CloseOnShutdown:              true,
		Logger:                       fastLogger{h.cfg.Log},
	}
}

// plainError writes one of net/http's own plain-text answers.
func plainError(ctx *fasthttp.RequestCtx, status int, text string) {
	ctx.Response.ResetBody()
	ctx.SetStatusCode(status)
	ctx.Response.Header.SetContentType("text/plain; charset=utf-8")
	ctx.SetBodyString(text)
}

// headErrorPrefix starts fasthttp's errors about a request head (which
// wrap what went wrong); TestFastServerAnswersAsNetHTTP notices if a new
// fasthttp words them otherwise.
const headErrorPrefix = "error when reading request headers"

// bareNetError is true for a read error fasthttp passes on as it is: the
// peer went away, or a read timed out, with no request head in progress.
func bareNetError(err error) bool {
	switch err {
	case io.EOF, io.ErrUnexpectedEOF:
		return true
	}
	ne, ok := err.(net.Error)
	return ok && (ne.Timeout() || isReadOp(ne))
}

func isReadOp(err error) bool {
	oe, ok := err.(*net.OpError)
	return ok && oe.Op == "read"
}

// fastLogger sends fasthttp's messages (connection errors) to the debug
// level, as the gateway's net/http servers do with their ErrorLog.
type fastLogger struct{ log *slog.Logger }

func (l fastLogger) Printf(format string, args ...any) {
	l.log.Debug(fmt.Sprintf(format, args...))
}

type fastHandler struct {
	h    *handler
	slow fasthttp.RequestHandler
}

// Served natively: the request URI must be exactly one of these (a query,
// an absolute form or an unusual spelling goes to net/http).
const (
	pathCheck  = "/v1/check"
	pathBatch  = "/v1/check/batch"
	pathReport = "/v1/report"
)

func (f *fastHandler) serve(ctx *fasthttp.RequestCtx) {
	// fasthttp does not recover a handler's panic (it would take the
	// gateway down); net/http logs it and drops the connection, and so
	// does this.
	defer func() {
		if p := recover(); p != nil {
			f.h.cfg.Log.Error("checkapi: panic serving a request", slog.Any("panic", p),
				slog.String("stack", string(debug.Stack())))
			ctx.Response.Reset()
			ctx.SetStatusCode(http.StatusInternalServerError)
			ctx.SetConnectionClose()
		}
	}()
	if !ctx.IsPost() || (f.h.token != nil && !f.authorized(ctx)) {
		f.slow(ctx)
		return
	}
	var ok bool
	switch string(ctx.RequestURI()) {
	case pathCheck:
		ok = f.check(ctx)
	case pathBatch:
		ok = f.batch(ctx)
	case pathReport:
		ok = f.report(ctx)
	}
	if !ok {
		f.slow(ctx)
	}
}

// authorized checks the bearer token in constant time, as handler.authorized.
func (f *fastHandler) authorized(ctx *fasthttp.RequestCtx) bool {
	return validBearer(ctx.Request.Header.Peek("Authorization"), f.h.token)
}

func equalFoldASCII(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range b {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}

// requestPool holds the requests of single checks (a guard.Checker keeps
// neither request nor decision).
var requestPool = sync.Pool{New: func() any { return new(guard.Request) }}

// canonicalNames maps the names httpguard.HeaderPairs returns to the
// spelling net/http writes (textproto's canonical form); others are
// canonicalised on the way.
var canonicalNames = func() map[string][]byte {
	m := make(map[string][]byte)
	for _, name := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Used", "X-RateLimit-Reset",
		"X-RateLimit-Resource", "RateLimit-Policy", "RateLimit", "X-RateLimit-Policy", "Retry-After"} {
		m[name] = []byte(textproto.CanonicalMIMEHeaderKey(name))
	}
	return m
}()

func canonicalName(name string) []byte {
	if b, ok := canonicalNames[name]; ok {
		return b
	}
	return []byte(textproto.CanonicalMIMEHeaderKey(name))
}

// bytesOf returns s's bytes without a copy, for fasthttp calls that copy
// what they are given and never write to it.
func bytesOf(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

// pairsPool holds the header pairs of single checks.
var pairsPool = sync.Pool{New: func() any { p := make([][2]string, 0, 12); return &p }}

// check serves a single check; false hands the request to net/http, which
// answers it (nothing has been decided or written).
func (f *fastHandler) check(ctx *fasthttp.RequestCtx) bool {
	req := requestPool.Get().(*guard.Request)
	defer func() {
		*req = guard.Request{}
		requestPool.Put(req)
	}()
	var peek bool
	var err error
	*req, peek, err = decodeCheck(ctx.PostBody())
	if err != nil {
		return false
	}
	pd := decisionPool.Get().(*guard.Decision)
	defer releaseDecision(pd)
	req.Surface = "check"
	// Not ctx: fasthttp closes its Done at the start of a shutdown, and a
	// drain lets in-flight decisions finish.
	d, err := f.h.decideInto(context.Background(), req, peek, pd)
	if err != nil {
		f.unavailable(ctx, err)
		return true
	}
	pairs := pairsPool.Get().(*[][2]string)
	*pairs = httpguard.HeaderPairs(d, (*pairs)[:0])
	rh := &ctx.Response.Header
	for _, p := range *pairs {
		// SetCanonical copies both; the name is net/http's spelling,
		// so the two servers write the same bytes.
		rh.SetCanonical(canonicalName(p[0]), bytesOf(p[1]))
	}
	clear(*pairs)
	pairsPool.Put(pairs)
	status, out := encodeDecision(d)
	fastJSON(ctx, status, *out)
	releaseBody(out)
	return true
}

func (f *fastHandler) batch(ctx *fasthttp.RequestCtx) bool {
	out, ok := f.h.batchBody(context.Background(), ctx.PostBody())
	if !ok {
		return false
	}
	fastJSON(ctx, http.StatusOK, out)
	return true
}

func (f *fastHandler) report(ctx *fasthttp.RequestCtx) bool {
	req, peek, err := decodeCheck(ctx.PostBody())
	if err != nil {
		return false
	}
	if peek {
		ctx.SetStatusCode(http.StatusNoContent)
		return true
	}
	req.Surface = "report"
	d, err := f.h.cfg.Decider.Report(context.Background(), &req)
	if err != nil {
		f.unavailable(ctx, err)
		return true
	}
	if d.Status == http.StatusBadRequest || d.Status == http.StatusInternalServerError {
		fastJSON(ctx, d.Status, appendDecision(nil, d, d.Status))
		return true
	}
	ctx.SetStatusCode(http.StatusNoContent)
	return true
}

// unavailable answers 503 as handler.unavailable does, through the net/http
// writer (rare: Redis and the fallback both failed, or shutdown).
func (f *fastHandler) unavailable(ctx *fasthttp.RequestCtx, err error) {
	f.h.cfg.Log.Warn("checkapi: no decision", "error", err.Error())
	ctx.Response.Header.Set("Retry-After", "1")
	var r http.Request
	if fasthttpadaptor.ConvertRequest(ctx, &r, true) != nil {
		r = http.Request{Header: http.Header{}}
	}
	w := &fastWriter{ctx: ctx, h: http.Header{}}
	httpguard.WriteError(w, &r, http.StatusServiceUnavailable, apierror.Unavailable, "No decision could be made; retry shortly.")
}

// fastJSON writes body and a final newline, as writeJSON.
func fastJSON(ctx *fasthttp.RequestCtx, status int, body []byte) {
	ctx.SetStatusCode(status)
	ctx.Response.Header.SetContentTypeBytes(contentTypeJSON)
	ctx.Response.Header.SetCanonical(nameNoSniff, valueNoSniff)
	ctx.Response.ResetBody()
	ctx.Response.AppendBody(body)
	ctx.Response.AppendBody(newline)
}

var (
	newline         = []byte{'\n'}
	contentTypeJSON = []byte("application/json")
	nameNoSniff     = []byte("X-Content-Type-Options")
	valueNoSniff    = []byte("nosniff")
)

// fastWriter is an http.ResponseWriter over a fasthttp response, for the
// rare answers written by net/http-shaped code.
type fastWriter struct {
	ctx   *fasthttp.RequestCtx
	h     http.Header
	wrote bool
}

func (w *fastWriter) Header() http.Header { return w.h }

func (w *fastWriter) WriteHeader(status int) {
	if w.wrote {
		return
	}
	w.wrote = true
	for k, vs := range w.h {
		for i, v := range vs {
			if i == 0 {
				w.ctx.Response.Header.Set(k, v)
			} else {
				w.ctx.Response.Header.Add(k, v)
			}
		}
	}
	w.ctx.SetStatusCode(status)
}

func (w *fastWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	w.ctx.Response.AppendBody(p)
	return len(p), nil
}

// readError answers a request the server could not read, as net/http
// does where fasthttp lets it tell the cases apart:
//   - the connection closed or a read timed out before anything of a
//     request arrived (a client's spare connection idle past
//     read_header_timeout, say): closed without an answer. fasthttp
//     reports a body that stopped arriving (past read_timeout) or was cut
//     short the same way, so that is closed without an answer too, where
//     net/http would have answered 400 INVALID_REQUEST;
//   - a header block above max_header_bytes: 431, and any other bad or
//     incomplete request head: 400, in net/http's plain text;
//   - a body above max_body_bytes: 413 BODY_TOO_LARGE, as net/http's
//     MaxBytesReader makes it; any other unreadable body (broken
//     chunks): 400 INVALID_REQUEST with the handler's message.
//
// fasthttp closes the connection after an answer (and says so in a
// Connection: close header).
func (f *fastHandler) readError(ctx *fasthttp.RequestCtx, err error) {
	if _, ok := errors.AsType[*fasthttp.ErrSmallBuffer](err); ok {
		plainError(ctx, http.StatusRequestHeaderFieldsTooLarge, "431 Request Header Fields Too Large")
		return
	}
	if bareNetError(err) {
		// Closing here makes fasthttp's write of an answer fail.
		_ = ctx.Conn().Close()
		return
	}
	if strings.HasPrefix(err.Error(), headErrorPrefix) {
		plainError(ctx, http.StatusBadRequest, "400 Bad Request")
		return
	}
	var r http.Request
	r.Header = http.Header{}
	if v := ctx.Request.Header.Peek("Accept"); len(v) > 0 {
		r.Header.Set("Accept", string(v))
	}
	w := &fastWriter{ctx: ctx, h: http.Header{}}
	if errors.Is(err, fasthttp.ErrBodyTooLarge) {
		httpguard.WriteError(w, &r, http.StatusRequestEntityTooLarge, apierror.BodyTooLarge,
			fmt.Sprintf("The body is larger than %d bytes.", f.h.cfg.MaxBody))
	} else {
		httpguard.WriteError(w, &r, http.StatusBadRequest, apierror.InvalidRequest, "The body could not be read.")
	}
}
