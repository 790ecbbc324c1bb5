package console

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/tollgate/tollgate/guard/apierror"
)

// CookieName is the session cookie's name.
const CookieName = "tollgate_session"

// CSRFHeader carries the session's CSRF token on every change made with
// the session cookie.
const CSRFHeader = "X-CSRF-Token"

// Codes: one-time sign-in codes (the link `make run` prints).
const (
	// CodeLifetime is how long a one-time code can be exchanged.
	CodeLifetime = time.Hour
	// maxCodes bounds the codes waiting for their exchange.
	maxCodes = 16
)

// Guard decides who a request is: the admin or the viewer bearer token,
// or a console session. It is safe for concurrent use.
type Guard struct {
	admin, viewer []byte
	// insecure: no admin token is configured and any bearer token other
	// than the viewer's is taken as the admin's.
	insecure bool
	sessions *Sessions
	now      func() time.Time

	mu    sync.Mutex
	codes map[string]code
}

type code struct {
	role    Role
	expires time.Time
}

// NewGuard returns a guard for the admin token (empty: insecure, any
// bearer token is the admin's) and the viewer token (empty: none).
// now nil is time.Now.
func NewGuard(admin, viewer string, now func() time.Time) *Guard {
	if now == nil {
		now = time.Now
	}
	return &Guard{admin: []byte(admin), viewer: []byte(viewer), insecure: admin == "", sessions: NewSessions(now),
		now: now, codes: make(map[string]code)}
}

// Sessions returns the guard's sessions.
func (g *Guard) Sessions() *Sessions { return g.sessions }

// Role returns what token may do, comparing it in constant time with
// each configured token.
func (g *Guard) Role(token string) Role {
	if token == "" {
		return RoleNone
	}
	t := []byte(token)
	isViewer := len(g.viewer) > 0 && subtle.ConstantTimeCompare(t, g.viewer) == 1
	isAdmin := len(g.admin) > 0 && subtle.ConstantTimeCompare(t, g.admin) == 1
	switch {
	case isViewer:
		return RoleViewer
	case isAdmin, g.insecure:
		return RoleAdmin
	}
	return RoleNone
}

// NewCode returns a single-use code that signs a browser in with role
// within CodeLifetime. It is not a token: exchanged once, it is gone.
func (g *Guard) NewCode(role Role) string {
	c := randomToken()
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	for k, v := range g.codes {
		if !now.Before(v.expires) {
			delete(g.codes, k)
		}
	}
	for k := range g.codes {
		if len(g.codes) < maxCodes {
			break
		}
		delete(g.codes, k)
	}
	g.codes[c] = code{role: role, expires: now.Add(CodeLifetime)}
	return c
}

// redeem returns the role of a live code and forgets it.
func (g *Guard) redeem(c string) Role {
	if c == "" {
		return RoleNone
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	var found *code
	var key string
	for k, v := range g.codes { // constant time per code: no early answer on a prefix
		if subtle.ConstantTimeCompare([]byte(k), []byte(c)) == 1 {
			v := v
			found, key = &v, k
		}
	}
	if found == nil {
		return RoleNone
	}
	delete(g.codes, key)
	if !g.now().Before(found.expires) {
		return RoleNone
	}
	return found.role
}

// unauthorized is the operator API's 401.
func unauthorized(w http.ResponseWriter) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="tollgate"`)
	apierror.Write(w, http.StatusUnauthorized, apierror.Unauthorized, "a valid operator token is required: Authorization: Bearer <TOLLGATE_ADMIN_TOKEN>")
}

// bearer returns the request's bearer token, and whether it has an
// Authorization header at all.
func bearer(r *http.Request) (string, bool) {
	v, ok := r.Header["Authorization"]
	if !ok {
		return "", false
	}
	const scheme = "bearer "
	if len(v) == 1 && len(v[0]) > len(scheme) && strings.EqualFold(v[0][:len(scheme)], scheme) {
		return strings.TrimSpace(v[0][len(scheme):]), true
	}
	return "", true
}

// safe reports whether the request reads only (GET, HEAD), so needs no
// CSRF token.
func safe(r *http.Request) bool { return r.Method == http.MethodGet || r.Method == http.MethodHead }

// changes reports whether the request changes something: every method but
// GET and HEAD, except validating a ruleset.
func changes(r *http.Request) bool {
	return !safe(r) && r.URL.Path != "/admin/v1/rules/validate"
}

// SameOrigin reports whether the request comes from a page of this
// server: its Origin (else its Referer) names the request's own host, and
// Sec-Fetch-Site, when the browser sends it, says same-origin.
func SameOrigin(r *http.Request) bool {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" {
		return false
	}
	src := r.Header.Get("Origin")
	if src == "" {
		src = r.Header.Get("Referer")
	}
	if src == "" || src == "null" {
		return false
	}
	u, err := url.Parse(src)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return false
	}
	return strings.EqualFold(u.Host, r.Host)
}

// Wrap requires a caller on next: a bearer token (admin or viewer), or,
// without an Authorization header, a console session cookie. A request
// with neither is 401 and changes nothing. A viewer's change is 403
// FORBIDDEN; so is a change made with a session cookie that does not come
// from this server's pages (SameOrigin) or lacks the session's CSRF token.
// Bearer-token requests need no CSRF token: a browser attaches an
// Authorization header to a cross-site request only after a CORS
// preflight, which is never granted.
func (g *Guard) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var role Role
		if tok, ok := bearer(r); ok {
			role = g.Role(tok)
		} else if c, err := r.Cookie(CookieName); err == nil {
			sess, ok := g.sessions.Get(c.Value)
			if ok && !safe(r) && (!SameOrigin(r) || !sess.CSRFMatches(r.Header.Get(CSRFHeader))) {
				apierror.Write(w, http.StatusForbidden, apierror.Forbidden,
					"a change made with the console's session must come from the console's own pages and carry its "+CSRFHeader+"; nothing changed")
				return
			}
			role = sess.Role
		}
		switch {
		case role == RoleNone:
			unauthorized(w)
			return
		case role == RoleViewer && changes(r):
			apierror.Write(w, http.StatusForbidden, apierror.Forbidden,
				"the viewer token reads only; changes need the admin token (TOLLGATE_ADMIN_TOKEN); nothing changed")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// sessionJSON is what the session routes answer.
type sessionJSON struct {
	Role      string `json:"role"`
	CSRFToken string `json:"csrf_token"`
	ExpiresAt string `json:"expires_at"`
}

func writeSession(w http.ResponseWriter, status int, sess Session) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(sessionJSON{Role: sess.Role.String(), CSRFToken: sess.CSRF,
		ExpiresAt: sess.Expires.UTC().Format(time.RFC3339)})
}

// secure reports whether the browser reached the server over TLS: its
// own, or a proxy's in front of it.
func secure(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

// signIn is POST /console/session {"token"} or {"code"}: a session
// cookie (HttpOnly, SameSite=Strict, Secure over TLS) and the session's
// CSRF token.
func (g *Guard) signIn(w http.ResponseWriter, r *http.Request) {
	if !SameOrigin(r) {
		apierror.Write(w, http.StatusForbidden, apierror.Forbidden, "sign in from the console's own page")
		return
	}
	var body struct {
		Token string `json:"token"`
		Code  string `json:"code"`
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			apierror.Write(w, http.StatusRequestEntityTooLarge, apierror.BodyTooLarge, "a sign-in body is at most 4 KiB")
			return
		}
		apierror.Write(w, http.StatusBadRequest, apierror.InvalidRequest, `body: {"token":"…"} or {"code":"…"}`)
		return
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		apierror.Write(w, http.StatusBadRequest, apierror.InvalidRequest, `body: one JSON object, {"token":"…"} or {"code":"…"}`)
		return
	}
	var role Role
	switch {
	case body.Token != "" && body.Code != "":
		apierror.Write(w, http.StatusBadRequest, apierror.InvalidRequest, "token or code, not both")
		return
	case body.Code != "":
		role = g.redeem(body.Code)
		if role == RoleNone {
			apierror.Write(w, http.StatusUnauthorized, apierror.Unauthorized, "the sign-in link was used already or has expired: sign in with the token")
			return
		}
	default:
		role = g.Role(body.Token)
		if role == RoleNone {
			apierror.Write(w, http.StatusUnauthorized, apierror.Unauthorized, "not the admin token (TOLLGATE_ADMIN_TOKEN) nor the viewer token (TOLLGATE_VIEWER_TOKEN)")
			return
		}
	}
	if c, err := r.Cookie(CookieName); err == nil {
		g.sessions.Delete(c.Value) // a new sign-in replaces the old session
	}
	cookie, sess := g.sessions.Create(role)
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: cookie, Path: "/", Expires: sess.Expires,
		MaxAge: int(sess.Expires.Sub(g.now()).Seconds()), HttpOnly: true, Secure: secure(r), SameSite: http.SameSiteStrictMode})
	writeSession(w, http.StatusOK, sess)
}

// session is GET /console/session: the signed-in session's role and CSRF
// token (a page reload learns it again), or 401.
func (g *Guard) session(w http.ResponseWriter, r *http.Request) {
	if _, sess, ok := g.cookieSession(w, r); ok {
		writeSession(w, http.StatusOK, sess)
	}
}

// cookieSession returns the request's session cookie and its session, or
// answers 401 and false.
func (g *Guard) cookieSession(w http.ResponseWriter, r *http.Request) (*http.Cookie, Session, bool) {
	c, err := r.Cookie(CookieName)
	if err != nil {
		unauthorized(w)
		return nil, Session{}, false
	}
	sess, ok := g.sessions.Get(c.Value)
	if !ok {
		unauthorized(w)
		return nil, Session{}, false
	}
	return c, sess, true
}

// signOut is DELETE /console/session: the session ends and the cookie is
// cleared. It needs the same-origin and CSRF checks of any change.
func (g *Guard) signOut(w http.ResponseWriter, r *http.Request) {
	c, sess, ok := g.cookieSession(w, r)
	if !ok {
		return
	}
	if !SameOrigin(r) || !sess.CSRFMatches(r.Header.Get(CSRFHeader)) {
		apierror.Write(w, http.StatusForbidden, apierror.Forbidden, "sign out from the console's own page, with its "+CSRFHeader)
		return
	}
	g.sessions.Delete(c.Value)
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, Secure: secure(r),
		SameSite: http.SameSiteStrictMode})
	w.WriteHeader(http.StatusNoContent)
}
