package checkapi

import (
	"bytes"
	"context"
	"crypto/subtle"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/apierror"
	"github.com/tollgate/tollgate/guard/httpguard"
	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/internal/httprec"
)

// Headers of the forward-auth endpoint, /v1/authz.
const (
	// HeaderToken carries api_token from the calling proxy: Authorization
	// belongs to the client whose request is being decided.
	HeaderToken = "X-Tollgate-Token"
	// HeaderAuthzMode, set to AuthzModeNginx by the calling proxy, asks for
	// answers nginx's auth_request can pass on (see AuthzModeNginx).
	HeaderAuthzMode = "X-Tollgate-Authz-Mode"
	// HeaderStatus is the real status of an answer in nginx mode.
	HeaderStatus = "X-Tollgate-Status"
	// HeaderBody is the body of an answer in nginx mode, on one line.
	HeaderBody = "X-Tollgate-Body"
)

// AuthzModeNginx is the HeaderAuthzMode value of nginx's auth_request.
// nginx passes only 2xx (allow), 401 and 403 from its auth subrequest;
// any other status becomes a 500 and an error-log line, and the
// subrequest's body is dropped. So in this mode every answer that is not
// an admission is sent as 401 with the real status in X-Tollgate-Status
// and the JSON body in X-Tollgate-Body, next to the rate-limit headers;
// configs/nginx/tollgate.conf maps it back with error_page 401 and
// `return <status> $body`. The body is always application/json there
// (nginx cannot choose the content type per answer).
const AuthzModeNginx = "nginx"

// Headers the proxy forwards the client's method and URI in, first
// present wins: Traefik and Caddy send X-Forwarded-*, nginx what its
// configuration sets (X-Original-* by custom).
var (
	methodHeaders = [...]string{"X-Forwarded-Method", "X-Original-Method"}
	uriHeaders    = [...]string{"X-Forwarded-Uri", "X-Original-Uri"}
)

// authz serves /v1/authz, the forward-auth form of a check: the request
// to decide is the client's request as the proxy forwards it. Its key,
// client IP, tenant, tier and cost are read by the proxy's own identity
// code (Config.Identity) from the forwarded headers, with the method and
// URI from X-Forwarded-Method / X-Original-Method and X-Forwarded-Uri /
// X-Original-URI; the URI's query is not part of the endpoint but a
// `query:` key source reads it. The answer is the proxy's: 200 with the
// rate-limit headers, or the decision's status with headers and body. A check
// that cannot be decided at all is admitted without headers (fail open, as
// the proxy does).
func (h *handler) authz(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get(HeaderAuthzMode) == AuthzModeNginx {
		nw := &nginxWriter{Recorder: httprec.Recorder{H: w.Header()}, w: w}
		defer nw.flush()
		w = nw
		// nginx serves the body with one content type: JSON.
		r = withoutAccept(r)
	}
	if h.token != nil && !h.proxyAuthorized(r) {
		httpguard.WriteError(w, r, http.StatusUnauthorized, apierror.Unauthorized,
			"The calling proxy must send "+HeaderToken+": <api_token> or be one of identity.trusted_proxies.")
		return
	}
	fwd, code, msg := forwarded(r)
	if fwd == nil {
		httpguard.WriteError(w, r, http.StatusBadRequest, code, msg)
		return
	}
	var req guard.Request
	if err := h.cfg.Identity.Extract(fwd, &req); err != nil {
		httpguard.WriteIdentityError(w, r, err)
		return
	}
	d := new(guard.Decision)
	req.Surface = "authz"
	if err := h.cfg.Decider.CheckInto(r.Context(), &req, d); err != nil {
		h.authzFailOpen(w, r, req.Path, err)
		return
	}
	if d.Status == 0 || d.Status == http.StatusOK {
		httpguard.SetHeaders(w.Header(), d)
		w.WriteHeader(http.StatusOK)
		return
	}
	httpguard.WriteDecision(w, r, d)
}

// authzFailOpen answers a check the Decider could not decide: admitted
// without rate-limit headers, as the proxy's default error handler
// (httpguard.FailOpen) does, unless the path is invalid.
func (h *handler) authzFailOpen(w http.ResponseWriter, r *http.Request, path string, err error) {
	if r.Context().Err() == nil || !errors.Is(err, context.Canceled) {
		h.cfg.Log.LogAttrs(r.Context(), slog.LevelWarn, "checkapi: authz without a decision: admitted",
			slog.String("error", err.Error()))
	}
	if _, ok := rules.CleanPath(path); !ok {
		httpguard.WriteDecision(w, r, &guard.Decision{Status: http.StatusBadRequest, Code: apierror.InvalidPath,
			Reason: guard.ReasonInvalidPath, Deciding: -1})
		return
	}
	w.WriteHeader(http.StatusOK)
}

// proxyAuthorized reports whether the caller of /v1/authz is the proxy:
// it sends api_token in X-Tollgate-Token (compared in constant time), or
// its address is a trusted proxy.
func (h *handler) proxyAuthorized(r *http.Request) bool {
	if v := r.Header.Get(HeaderToken); v != "" && subtle.ConstantTimeCompare([]byte(v), h.token) == 1 {
		return true
	}
	return h.cfg.Identity.Trusted(r)
}

// forwarded returns the client's request as the proxy describes it: r's
// headers, peer and context with the forwarded method (r's own when none
// is forwarded) and URI, parsed as net/http parses a request line, so that
// the identity code and the guard see what the proxy surface would. When
// it cannot, it returns nil and the 400 error code and message: no URI
// forwarded, a URI that does not parse (INVALID_PATH), a method that is
// not an HTTP token.
func forwarded(r *http.Request) (fwd *http.Request, code, msg string) {
	uri := firstHeader(r.Header, uriHeaders[:])
	if uri == "" {
		return nil, apierror.InvalidRequest, "The forwarded request's URI is missing: send X-Forwarded-Uri or X-Original-URI."
	}
	u, err := url.ParseRequestURI(uri)
	if err != nil {
		return nil, apierror.InvalidPath, "The request path is invalid: the forwarded URI cannot be parsed."
	}
	method := firstHeader(r.Header, methodHeaders[:])
	if len(method) > maxMethodLen || !token(method) {
		return nil, apierror.InvalidRequest, "The forwarded method is not an HTTP method token."
	}
	fwd = r.WithContext(r.Context()) // a shallow copy: r is not changed
	fwd.URL = u
	fwd.RequestURI = uri
	if method != "" {
		fwd.Method = method
	}
	return fwd, "", ""
}

func firstHeader(h http.Header, names []string) string {
	for _, n := range names {
		if v := h.Get(n); v != "" {
			return v
		}
	}
	return ""
}

// withoutAccept returns r without its Accept header, so that the writers
// choose JSON.
func withoutAccept(r *http.Request) *http.Request {
	if _, ok := r.Header["Accept"]; !ok {
		return r
	}
	r2 := r.WithContext(r.Context())
	r2.Header = r.Header.Clone()
	r2.Header.Del("Accept")
	return r2
}

// nginxWriter turns an answer into its nginx mode form (AuthzModeNginx):
// a 2xx goes out as it is; anything else goes out as 401 with the status
// in X-Tollgate-Status and the body, on one line, in X-Tollgate-Body.
// The handler writes through it as usual; flush sends the answer.
type nginxWriter struct {
	httprec.Recorder // H is w's header
	w                http.ResponseWriter
}

func (n *nginxWriter) flush() {
	status, body := n.Code(), n.Body.Bytes()
	h := n.w.Header()
	if status/100 != 2 {
		h.Set(HeaderStatus, strconv.Itoa(status))
		// The bodies are JSON on one line; a newline would end the
		// header, so any is replaced (net/http would do so too).
		h.Set(HeaderBody, string(bytes.ReplaceAll(bytes.TrimSpace(body), []byte("\n"), []byte(" "))))
		status = http.StatusUnauthorized
	}
	h.Set("Content-Length", strconv.Itoa(len(body)))
	n.w.WriteHeader(status)
	_, _ = n.w.Write(body)
}
