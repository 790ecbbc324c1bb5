// Package console is the aggregator's operator console: the web pages at
// /console/ (embedded, served with a strict Content-Security-Policy), the
// sign-in that turns the admin or viewer token into a session cookie, and
// the checks every change made with that cookie passes (same origin, the
// session's CSRF token). Everything the pages show comes from the operator
// API, which the aggregator serves to a session as to a bearer token.
package console

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"sync"
	"time"
)

// Role is what a caller may do.
type Role uint8

// The roles.
const (
	// RoleNone: not signed in.
	RoleNone Role = iota
	// RoleViewer reads only: the viewer token.
	RoleViewer
	// RoleAdmin reads and changes: the admin token.
	RoleAdmin
)

// String returns "viewer", "admin" or "none".
func (r Role) String() string {
	switch r {
	case RoleViewer:
		return "viewer"
	case RoleAdmin:
		return "admin"
	}
	return "none"
}

// Session bounds.
const (
	// MaxSessions is the most sessions kept at once; signing in beyond it
	// ends the session that would expire first.
	MaxSessions = 256
	// SessionLifetime is how long a session lasts from its sign-in,
	// whatever its use.
	SessionLifetime = 8 * time.Hour
)

// Session is a signed-in browser.
type Session struct {
	Role Role
	// CSRF is the token every change made with the session's cookie
	// carries in X-CSRF-Token.
	CSRF    string
	Expires time.Time
}

// Sessions holds the signed-in sessions, in memory: bounded in number
// and lifetime, lost on restart (sign in again). Cookies are looked up by
// their SHA-256, so the map never holds a usable cookie. It is safe for
// concurrent use.
type Sessions struct {
	now func() time.Time
	max int
	ttl time.Duration

	mu sync.Mutex
	m  map[[sha256.Size]byte]Session
}

// NewSessions returns an empty store with the package's bounds; now nil
// is time.Now.
func NewSessions(now func() time.Time) *Sessions {
	if now == nil {
		now = time.Now
	}
	return &Sessions{now: now, max: MaxSessions, ttl: SessionLifetime, m: make(map[[sha256.Size]byte]Session)}
}

// randomToken returns 32 random bytes, base64url.
func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand's contract)
	return base64.RawURLEncoding.EncodeToString(b)
}

// Create starts a session for role and returns its cookie value and the
// session.
func (s *Sessions) Create(role Role) (cookie string, sess Session) {
	cookie = randomToken()
	now := s.now()
	sess = Session{Role: role, CSRF: randomToken(), Expires: now.Add(s.ttl)}
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, old := range s.m {
		if !now.Before(old.Expires) {
			delete(s.m, id)
		}
	}
	for len(s.m) >= s.max {
		var first [sha256.Size]byte
		var at time.Time
		for id, old := range s.m {
			if at.IsZero() || old.Expires.Before(at) {
				first, at = id, old.Expires
			}
		}
		delete(s.m, first)
	}
	s.m[sha256.Sum256([]byte(cookie))] = sess
	return cookie, sess
}

// Get returns the live session of cookie.
func (s *Sessions) Get(cookie string) (Session, bool) {
	if cookie == "" {
		return Session{}, false
	}
	id := sha256.Sum256([]byte(cookie))
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, ok := s.m[id]
	if !ok {
		return Session{}, false
	}
	if !s.now().Before(sess.Expires) {
		delete(s.m, id)
		return Session{}, false
	}
	return sess, true
}

// Delete ends the session of cookie.
func (s *Sessions) Delete(cookie string) {
	id := sha256.Sum256([]byte(cookie))
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, id)
}

// Len returns how many sessions are kept (expired ones included until
// the next sign-in removes them).
func (s *Sessions) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

// CSRFMatches reports whether presented is the session's CSRF token, in
// constant time.
func (sess Session) CSRFMatches(presented string) bool {
	return presented != "" && subtle.ConstantTimeCompare([]byte(presented), []byte(sess.CSRF)) == 1
}
