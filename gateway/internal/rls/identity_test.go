package rls_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate/tollgate/gateway/internal/rls"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/memstore"
)

// codeRecorder keeps the codes of the decisions a Server observed.
type codeRecorder struct {
	mu    sync.Mutex
	codes []string
}

// Decided implements guard.Observer.
func (r *codeRecorder) Decided(_ context.Context, _ guard.Op, _ *guard.Request, d *guard.Decision, _ error, _ time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if d != nil {
		r.codes = append(r.codes, d.Code)
	}
}

func (r *codeRecorder) last() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.codes) == 0 {
		return ""
	}
	return r.codes[len(r.codes)-1]
}

// TestKeysPathsAndIPs: Envoy descriptors are judged like HTTP requests:
// keys by guard.ValidKey, paths normalised (every spelling of a blocked
// endpoint blocked), and without remote_address no per-IP rule applies.
func TestKeysPathsAndIPs(t *testing.T) {
	t.Parallel()
	rec := &codeRecorder{}
	g := newGuard(t, memstore.New(), `
rules:
  - {id: v0-gone, match: {endpoint: "^/v0/"}, block: true}
  - {id: per-key, match: {anonymous: false}, capacity: 100, rate: 100/1h}
  - {id: per-ip, scope: ip, capacity: 1, rate: 1/1h}
`, guard.WithObserver(rec))
	c := serve(t, rls.New(g))
	tests := []struct {
		name string
		kv   []string
		want string // the decision's code; "" admitted
	}{
		{"C1 control in key", []string{"api_key", "sk_\u0085", "remote_address", "10.0.0.1"}, guard.CodeInvalidKey},
		{"control in key", []string{"api_key", "sk_\x01", "remote_address", "10.0.0.2"}, guard.CodeInvalidKey},
		{"space in key", []string{"api_key", "sk a", "remote_address", "10.0.0.3"}, guard.CodeInvalidKey},
		{"UTF-8 key", []string{"api_key", "sk_é", "remote_address", "10.0.0.4"}, ""},
		{"blocked path", []string{"api_key", "sk_a", "path", "/v0/x"}, guard.CodeEndpointBlocked},
		{"blocked path, doubled slash", []string{"api_key", "sk_a", "path", "//v0/x"}, guard.CodeEndpointBlocked},
		{"blocked path, dot segment", []string{"api_key", "sk_a", "path", "/./v0/x"}, guard.CodeEndpointBlocked},
		{"blocked path, dot-dot", []string{"api_key", "sk_a", "path", "/v1/../v0/x"}, guard.CodeEndpointBlocked},
		{"encoded slash", []string{"api_key", "sk_a", "path", "/v1%2Fx"}, guard.CodeInvalidPath},
		{"above the root", []string{"api_key", "sk_a", "path", "/../x"}, guard.CodeInvalidPath},
	}
	for _, tt := range tests {
		resp := call(t, c, request("d", desc(tt.kv...)))
		want := OK
		if tt.want != "" {
			want = OverLimit
		}
		if resp.OverallCode != want || rec.last() != tt.want {
			t.Errorf("%s: %v, decision code %q; want %v, %q", tt.name, resp.OverallCode, rec.last(), want, tt.want)
		}
		// The client sees the code: the proxy's error body.
		if got := errorCode(t, resp); got != tt.want {
			t.Errorf("%s: error body code %q, want %q", tt.name, got, tt.want)
		}
	}
	// Anonymous descriptors without remote_address: the per-IP rule (limit
	// 1) does not apply, so they never share one counter.
	for i := range 3 {
		resp := call(t, c, request("d", desc("path", "/x")))
		if resp.OverallCode != OK || resp.Statuses[0].CurrentLimit != nil {
			t.Fatalf("anonymous without IP, call %d: %v", i, resp)
		}
	}
	// Keyed descriptors without remote_address: the key's rule only.
	resp := call(t, c, request("d", desc("api_key", "sk_no_ip")))
	if resp.OverallCode != OK || resp.Statuses[0].CurrentLimit.GetName() != "per-key" {
		t.Fatalf("keyed without IP: %v", resp)
	}
}

// TestTooManyRulesIsInternal: a descriptor matching more rules than the
// guard allows fails the call with Internal (HTTP's 500), not OVER_LIMIT.
func TestTooManyRulesIsInternal(t *testing.T) {
	t.Parallel()
	g := newGuard(t, memstore.New(), `
rules:
  - {id: a, match: {endpoint: "^/many"}, capacity: 9, rate: 9/1h}
  - {id: b, match: {endpoint: "^/many"}, capacity: 9, rate: 9/1h}
`)
	many, err := guard.New(memstore.New(), []byte("rls-test-secret-0123456789"), g.Rules(), guard.WithMaxRules(1))
	if err != nil {
		t.Fatal(err)
	}
	c := serve(t, rls.New(many))
	_, err = c.ShouldRateLimit(t.Context(), request("d", desc("api_key", "k", "path", "/many")))
	if status.Code(err) != codes.Internal {
		t.Fatalf("err %v, want Internal", err)
	}
	if resp := call(t, c, request("d", desc("api_key", "k", "path", "/few"))); resp.OverallCode != OK {
		t.Fatalf("one rule: %v", resp)
	}
}
