// Package checkapi is the gateway's check API, for gateways
// written in other languages: POST /v1/check, POST /v1/check/batch and
// POST /v1/report, optionally behind a bearer token; and /v1/authz, the
// forward-auth form of a check for proxies that ask an authorization
// service before forwarding (nginx auth_request, Traefik ForwardAuth, Caddy
// forward_auth), which reads the client's request from the forwarded
// headers and answers as the proxy should.
//
// Bodies are decoded strictly (unknown fields, trailing data and wrong
// types are 400 INVALID_REQUEST) and bounded in size (413 BODY_TOO_LARGE).
// A check answers with the decision's HTTP status, the rate-limit headers and
// the decision as JSON, with the error object when it is not an
// admission. A batch is always 200 with one decision per item, decided in
// order, each with its own status.
package checkapi

import (
	"bytes"
	"cmp"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"

	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/apierror"
	"github.com/tollgate/tollgate/guard/httpguard"
)

// reasonInvalidRequest is the `reason` of a batch item whose body is
// invalid (guard never sees it).
const reasonInvalidRequest = "invalid_request"

// Config configures the handler.
type Config struct {
	// Decider decides; required.
	Decider guard.Checker
	// Token, when set, is the bearer token every request must carry;
	// otherwise 401 UNAUTHORIZED. /v1/authz, where Authorization is the
	// client's, takes it in X-Tollgate-Token instead, or trusts a caller
	// among Identity's TrustedProxies.
	Token string
	// Identity reads the client's key, IP, tenant, tier and cost from a
	// /v1/authz request, as the proxy does (nil: the zero Identity).
	Identity *httpguard.Identity
	// MaxBatch is the most items of a batch (default 100).
	MaxBatch int
	// MaxBody is the largest body in bytes (default 64 KiB).
	MaxBody int64
	// Log receives errors of the Decider (nil: discard). API keys are never
	// logged.
	Log *slog.Logger
}

// New returns the check API handler. It is safe for concurrent use and
// starts no goroutines.
func New(cfg Config) http.Handler { return newHandler(cfg) }

func newHandler(cfg Config) *handler {
	configs.DefaultPositive(&cfg.MaxBatch, 100)
	configs.DefaultPositive(&cfg.MaxBody, 64<<10)
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	h := &handler{cfg: cfg}
	if cfg.Token != "" {
		h.token = []byte(cfg.Token)
	}
	return h
}

type handler struct {
	cfg   Config
	token []byte
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/v1/authz" {
		// Any method, and the proxy's own way of proving itself.
		h.authz(w, r)
		return
	}
	if h.token != nil && !h.authorized(r) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="tollgate"`)
		httpguard.WriteError(w, r, http.StatusUnauthorized, apierror.Unauthorized, "A valid bearer token is required (Authorization: Bearer <api_token>).")
		return
	}
	var serve func(http.ResponseWriter, *http.Request, []byte)
	switch r.URL.Path {
	case "/v1/check":
		serve = h.check
	case "/v1/check/batch":
		serve = h.batch
	case "/v1/report":
		serve = h.report
	default:
		httpguard.WriteError(w, r, http.StatusNotFound, apierror.NotFound, "No such endpoint; the check API serves POST /v1/check, /v1/check/batch and /v1/report, and /v1/authz.")
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		httpguard.WriteError(w, r, http.StatusMethodNotAllowed, apierror.MethodNotAllowed, "Use POST.")
		return
	}
	buf := bufPool.Get().(*bytes.Buffer)
	defer func() {
		if buf.Cap() <= maxPooledBody {
			buf.Reset()
			bufPool.Put(buf)
		}
	}()
	buf.Reset()
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, h.cfg.MaxBody))
	body := buf.Bytes()
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			httpguard.WriteError(w, r, http.StatusRequestEntityTooLarge, apierror.BodyTooLarge,
				fmt.Sprintf("The body is larger than %d bytes.", h.cfg.MaxBody))
			return
		}
		httpguard.WriteError(w, r, http.StatusBadRequest, apierror.InvalidRequest, "The body could not be read.")
		return
	}
	serve(w, r, body)
}

// bufPool holds request body buffers: a body is read, decoded (the
// request's strings are copies) and dropped within one request.
var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxPooledBody is the largest buffer kept for reuse (a batch may be
// large; a check body is small).
const maxPooledBody = 4 << 10

// outPool holds the buffers single checks encode their answers in.
var outPool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// decisionPool holds the decisions of single checks, their Rules reused.
var decisionPool = sync.Pool{New: func() any { return new(guard.Decision) }}

// authorized checks the bearer token in constant time.
func (h *handler) authorized(r *http.Request) bool {
	return validBearer([]byte(r.Header.Get("Authorization")), h.token)
}

// validBearer reports whether an Authorization value carries token as a
// bearer token (the scheme in any case, spaces after it ignored),
// comparing in constant time.
func validBearer(v, token []byte) bool {
	const scheme = "bearer "
	if len(v) <= len(scheme) || !equalFoldASCII(v[:len(scheme)], scheme) {
		return false
	}
	t := v[len(scheme):]
	for len(t) > 0 && t[0] == ' ' {
		t = t[1:]
	}
	return subtle.ConstantTimeCompare(t, token) == 1
}

func (h *handler) check(w http.ResponseWriter, r *http.Request, body []byte) {
	req, peek, err := decodeCheck(body)
	if err != nil {
		httpguard.WriteError(w, r, http.StatusBadRequest, apierror.InvalidRequest, err.Error())
		return
	}
	pd := decisionPool.Get().(*guard.Decision)
	defer releaseDecision(pd)
	req.Surface = "check"
	d, err := h.decideInto(r.Context(), &req, peek, pd)
	if err != nil {
		h.unavailable(w, r, err)
		return
	}
	httpguard.SetHeaders(w.Header(), d)
	status, out := encodeDecision(d)
	writeJSON(w, status, *out)
	releaseBody(out)
}

// releaseDecision returns a pooled Decision, keeping its Rules' array.
func releaseDecision(pd *guard.Decision) {
	rules := pd.Rules[:0]
	clear(pd.Rules)
	*pd = guard.Decision{Rules: rules}
	decisionPool.Put(pd)
}

// encodeDecision writes d's JSON answer into a pooled buffer (give it
// back with releaseBody) and returns the answer's status.
func encodeDecision(d *guard.Decision) (int, *[]byte) {
	status := cmp.Or(d.Status, http.StatusOK)
	out := outPool.Get().(*[]byte)
	*out = appendDecision((*out)[:0], d, status)
	return status, out
}

// releaseBody returns an answer's buffer to the pool unless it grew large.
func releaseBody(out *[]byte) {
	if cap(*out) <= maxPooledBody {
		outPool.Put(out)
	}
}

func (h *handler) batch(w http.ResponseWriter, r *http.Request, body []byte) {
	out, ok := h.batchBody(r.Context(), body)
	if !ok {
		_, err := decodeBatch(body, h.cfg.MaxBatch)
		if errors.Is(err, errTooLarge) {
			httpguard.WriteError(w, r, http.StatusBadRequest, apierror.BatchTooLarge,
				fmt.Sprintf("A batch holds at most %d checks.", h.cfg.MaxBatch))
			return
		}
		httpguard.WriteError(w, r, http.StatusBadRequest, apierror.InvalidRequest, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// batchBody decides a batch body and returns the answer; false when the
// body is not a valid batch (nothing was decided).
func (h *handler) batchBody(ctx context.Context, body []byte) ([]byte, bool) {
	items, err := decodeBatch(body, h.cfg.MaxBatch)
	if err != nil {
		return nil, false
	}
	out := make([]byte, 0, 64+200*len(items))
	out = append(out, '[')
	var d guard.Decision
	for i, raw := range items {
		if i > 0 {
			out = append(out, ',')
		}
		req, peek, err := decodeCheck(raw)
		if err != nil {
			out = appendItemError(out, http.StatusBadRequest, apierror.InvalidRequest, reasonInvalidRequest, err.Error())
			continue
		}
		req.Surface = "batch"
		dd, err := h.decideInto(ctx, &req, peek, &d)
		if err != nil {
			h.cfg.Log.LogAttrs(ctx, slog.LevelWarn, "checkapi: no decision", slog.String("error", err.Error()))
			out = appendItemError(out, http.StatusServiceUnavailable, apierror.Unavailable, "error", "No decision could be made.")
			continue
		}
		status := cmp.Or(dd.Status, http.StatusOK)
		out = appendDecision(out, dd, status)
	}
	return append(out, ']'), true
}

func (h *handler) report(w http.ResponseWriter, r *http.Request, body []byte) {
	req, peek, err := decodeCheck(body)
	if err != nil {
		httpguard.WriteError(w, r, http.StatusBadRequest, apierror.InvalidRequest, err.Error())
		return
	}
	if peek { // cost 0: nothing to charge
		w.WriteHeader(http.StatusNoContent)
		return
	}
	req.Surface = "report"
	d, err := h.cfg.Decider.Report(r.Context(), &req)
	if err != nil {
		h.unavailable(w, r, err)
		return
	}
	if d.Status == http.StatusBadRequest || d.Status == http.StatusInternalServerError {
		// Invalid key or path, a cost above max_cost, too many rules.
		writeJSON(w, d.Status, appendDecision(nil, d, d.Status))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// decideInto decides req, into d for a check; a peek returns a new
// decision.
func (h *handler) decideInto(ctx context.Context, req *guard.Request, peek bool, d *guard.Decision) (*guard.Decision, error) {
	if peek {
		return h.cfg.Decider.Peek(ctx, req)
	}
	return d, h.cfg.Decider.CheckInto(ctx, req, d)
}

func (h *handler) unavailable(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() == nil {
		h.cfg.Log.LogAttrs(r.Context(), slog.LevelWarn, "checkapi: no decision", slog.String("error", err.Error()))
	}
	w.Header().Set("Retry-After", "1")
	httpguard.WriteError(w, r, http.StatusServiceUnavailable, apierror.Unavailable, "No decision could be made; retry shortly.")
}

// writeJSON writes body and a final newline, as curl users expect.
func writeJSON(w http.ResponseWriter, status int, body []byte) {
	body = append(body, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// appendItemError appends a batch item that got no decision from the
// guard: appendDecision's layout, with no rule, reason and the error
// object.
func appendItemError(b []byte, status int, code, reason, msg string) []byte {
	b = appendDecisionHead(b, &guard.Decision{Reason: guard.Reason(reason), Deciding: -1}, status)
	b = append(b, `,"error":{`...)
	b = apierror.AppendFields(b, code, msg, apierror.EscapeHTML)
	return append(b, "}}"...)
}
