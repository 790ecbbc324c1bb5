package checkapi

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/rules"
)

// failing is a Decider that can never decide.
type failing struct{}

var errNoDecision = errors.New("store down and no fallback")

func (failing) CheckMany(context.Context, []*guard.Request, []*guard.Decision) error {
	return errNoDecision
}
func (failing) Rules() *rules.Ruleset { return nil }

func (failing) CheckInto(context.Context, *guard.Request, *guard.Decision) error {
	return errNoDecision
}
func (failing) Peek(context.Context, *guard.Request) (*guard.Decision, error) {
	return nil, errNoDecision
}
func (failing) Report(context.Context, *guard.Request) (*guard.Decision, error) {
	return nil, errNoDecision
}

// TestAuthzFailsOpen: a check that cannot be decided is admitted without
// rate-limit headers, as the proxy's default error handler does, unless
// its path is invalid; in nginx mode too.
func TestAuthzFailsOpen(t *testing.T) {
	t.Parallel()
	h := New(Config{Decider: failing{}})
	for _, tt := range []struct {
		uri, mode  string
		status     int
		tollStatus string
	}{
		{"/v1/x", "", http.StatusOK, ""},
		{"/v1/x", AuthzModeNginx, http.StatusOK, ""},
		{"/v1/%2e%2e/%2e%2e/x", "", http.StatusBadRequest, ""},
		{"/v1/%2e%2e/%2e%2e/x", AuthzModeNginx, http.StatusUnauthorized, "400"},
	} {
		r := httptest.NewRequest(http.MethodGet, "/v1/authz", nil)
		r.Header.Set("X-Forwarded-Uri", tt.uri)
		r.Header.Set(HeaderAuthzMode, tt.mode)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != tt.status || w.Header().Get(HeaderStatus) != tt.tollStatus || w.Header().Get("X-RateLimit-Limit") != "" {
			t.Errorf("%s mode %q: %d %v %s", tt.uri, tt.mode, w.Code, w.Header(), w.Body)
		}
	}
}
