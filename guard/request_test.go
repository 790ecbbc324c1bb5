package guard_test

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/keyid"
	"github.com/tollgate/tollgate/guard/memstore"
	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/internal/testnet"
)

// countStore counts store calls and decides with memstore.
type countStore struct {
	s     *memstore.Store
	calls atomic.Int64
}

func (c *countStore) Do(ctx context.Context, op guard.Op, now int64, cs []guard.Counter, res []guard.CounterResult) (int64, error) {
	c.calls.Add(1)
	return c.s.Do(ctx, op, now, cs, res)
}

// TestSpellingsAreOneEndpoint: every spelling of a blocked or limited
// endpoint is blocked or limited as the endpoint itself, and by_endpoint
// counters are shared across spellings.
func TestSpellingsAreOneEndpoint(t *testing.T) {
	t.Parallel()
	rs := mustRules(t, `
rules:
  - {id: v0-blocked, match: {endpoint: "^/v0/"}, block: true}
  - {id: search, match: {endpoint: "^/v1/search$"}, by_endpoint: true, capacity: 100, rate: 100/1h}
`)
	g := mustGuard(t, memstore.New(), rs)
	ctx := context.Background()
	for _, p := range []string{"/v0/x", "//v0/x", "/./v0/x", "/v1/../v0/x", "/%76%30/x", "/v0//x", "/a/b/../../v0/x/"} {
		d, err := g.Check(ctx, &guard.Request{Key: "k", Path: p})
		if err != nil {
			t.Fatal(err)
		}
		if d.Status != 403 || d.Code != guard.CodeEndpointBlocked || d.RefusingRule != "v0-blocked" {
			t.Errorf("%s: status %d code %s rule %q, want 403 ENDPOINT_BLOCKED by v0-blocked", p, d.Status, d.Code, d.RefusingRule)
		}
	}
	spellings := []string{"/v1/search", "//v1/search", "/v1/search/", "/v1/./search", "/v1/x/../search", "/v1/%73earch"}
	for i, p := range spellings {
		d, err := g.Check(ctx, &guard.Request{Key: "k", Path: p})
		if err != nil {
			t.Fatal(err)
		}
		r := d.DecidingRule()
		if r == nil || r.ID != "search" || r.Remaining != int64(100-1-i) || d.Endpoint != "/v1/search" {
			t.Fatalf("%s: endpoint %q deciding %+v: want one counter for every spelling", p, d.Endpoint, r)
		}
		wantPath := "/v1/search"
		if strings.HasSuffix(p, "/") {
			wantPath += "/"
		}
		if d.Path != wantPath {
			t.Errorf("%s: Path %q, want %q", p, d.Path, wantPath)
		}
	}
	for _, p := range []string{"/../v1/search", "/v1/%2Fsearch", "/v1/%5csearch", "/v1/%00"} {
		d, _ := g.Check(ctx, &guard.Request{Key: "k", Path: p})
		if d.Status != 400 || d.Code != guard.CodeInvalidPath || d.Path != "" {
			t.Errorf("%s: status %d code %s path %q, want 400 INVALID_PATH", p, d.Status, d.Code, d.Path)
		}
	}
}

// TestNoIPSharesNoCounter: requests without a client IP match no rule
// counted per IP, so they never share one counter.
func TestNoIPSharesNoCounter(t *testing.T) {
	t.Parallel()
	rs := mustRules(t, `
rules:
  - {id: per-ip, scope: ip, capacity: 1, rate: 1/1h}
  - {id: anon, match: {anonymous: true}, capacity: 1, rate: 1/1h}
`)
	g := mustGuard(t, memstore.New(), rs)
	ctx := context.Background()
	for i := range 3 {
		for _, req := range []*guard.Request{{Path: "/"}, {Key: "k", Path: "/"}} {
			d, err := g.Check(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if !d.Allowed || d.Reason != guard.ReasonNoRule {
				t.Fatalf("request %d %+v without IP: %+v, want no rule", i, req, d)
			}
		}
	}
	ip := netip.MustParseAddr("192.0.2.7")
	if d, _ := g.Check(ctx, &guard.Request{IP: ip, Path: "/"}); !d.Allowed || len(d.Rules) != 2 {
		t.Fatalf("anonymous with IP: %+v", d)
	}
	if d, _ := g.Check(ctx, &guard.Request{IP: ip, Path: "/"}); d.Allowed {
		t.Fatalf("anonymous with IP, second: %+v", d)
	}
}

// TestTooManyRules: a request matching more rules than WithMaxRules is
// answered 500 TOO_MANY_RULES without a store call; a ruleset where every
// request of a kind matches more is refused.
func TestTooManyRules(t *testing.T) {
	t.Parallel()
	rs := mustRules(t, "rules:\n  - {id: all, capacity: 10, rate: 10/1m}\n"+
		strings.Join(testnet.Numbered("  - {id: e%d, match: {endpoint: '^/many'}, capacity: 10, rate: 10/1m}\n", 4), ""))
	store := &countStore{s: memstore.New()}
	var hooked atomic.Int64
	g := mustGuard(t, store, rs, guard.WithMaxRules(4), guard.WithOnTooManyRules(func(n int) { hooked.Add(int64(n)) }))
	ctx := context.Background()
	d, err := g.Check(ctx, &guard.Request{Key: "k", Path: "/few"})
	if err != nil || !d.Allowed || store.calls.Load() != 1 {
		t.Fatalf("one rule: %+v %v, %d calls", d, err, store.calls.Load())
	}
	d, err = g.Check(ctx, &guard.Request{Key: "k", Path: "/many"})
	if err != nil || d.Allowed || d.Status != 500 || d.Code != guard.CodeTooManyRules || d.Reason != guard.ReasonTooManyRules {
		t.Fatalf("five rules: %+v %v", d, err)
	}
	if store.calls.Load() != 1 || hooked.Load() != 5 {
		t.Errorf("store calls %d (want 1), hook got %d (want 5)", store.calls.Load(), hooked.Load())
	}
	ds := []*guard.Decision{nil, nil}
	if err := g.CheckMany(ctx, []*guard.Request{{Key: "k", Path: "/few"}, {Key: "k", Path: "/many"}}, ds); err != nil {
		t.Fatal(err)
	}
	if ds[0].Status != 500 || ds[1].Code != guard.CodeTooManyRules || store.calls.Load() != 1 {
		t.Errorf("CheckMany: %+v %+v, %d store calls", ds[0], ds[1], store.calls.Load())
	}

	// Five rules with an empty match: every request matches them all.
	wide := mustRules(t, "rules:\n"+strings.Join(testnet.Numbered("  - {id: r%d, capacity: 10, rate: 10/1m}\n", 5), ""))
	var ve *rules.ValidationError
	if _, err := guard.New(memstore.New(), secret, wide, guard.WithMaxRules(4)); !errors.As(err, &ve) || ve.Rule != "r4" {
		t.Errorf("New with 5 unconditional rules, max 4: %v", err)
	}
	if err := g.CheckRules(wide); err == nil {
		t.Error("CheckRules accepted 5 unconditional rules, max 4")
	}
	if err := g.CheckRules(rs); err != nil {
		t.Errorf("CheckRules: %v", err)
	}
	if g.MaxRules() != 4 || mustGuard(t, memstore.New(), nil).MaxRules() != guard.DefaultMaxRules {
		t.Error("MaxRules")
	}
}

// TestRefusingRule: what refuses a request before the counters is named.
func TestRefusingRule(t *testing.T) {
	t.Parallel()
	rs := mustRules(t, `
rules:
  - {id: small, capacity: 3, rate: 3/1m}
`)
	g := mustGuard(t, memstore.New(), rs, guard.WithMaxCost(50))
	ctx := context.Background()
	d, _ := g.Check(ctx, &guard.Request{Key: "k", Path: "/", Cost: 4})
	if d.Code != guard.CodeCostExceedsLimit || d.RefusingRule != "small" || d.RefusingLimit != 3 || d.Cost != 4 {
		t.Errorf("cost above the rule's limit: %+v", d)
	}
	d, _ = g.Check(ctx, &guard.Request{Key: "k", Path: "/", Cost: 51})
	if d.Code != guard.CodeCostExceedsLimit || d.RefusingRule != "" || d.RefusingLimit != 50 || d.Cost != 51 {
		t.Errorf("cost above max cost: %+v", d)
	}
}

// TestNewRefusesShortSecrets: the library and the gateway share one
// minimum (keyid.MinSecretLen).
func TestNewRefusesShortSecrets(t *testing.T) {
	t.Parallel()
	if _, err := guard.New(memstore.New(), nil, nil); !errors.Is(err, keyid.ErrNoSecret) {
		t.Errorf("empty secret: %v", err)
	}
	if _, err := guard.New(memstore.New(), make([]byte, keyid.MinSecretLen-1), nil); !errors.Is(err, keyid.ErrShortSecret) {
		t.Errorf("short secret: %v", err)
	}
}

func TestValidKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		key  string
		want bool
	}{
		{"", true},
		{"sk_prod_1", true},
		{"clé", true},
		{"ключ_日本", true},
		{"\u00a0nbsp", true}, // not a control character
		{"\ufffd", true},     // a valid encoding of U+FFFD
		{strings.Repeat("k", guard.MaxKeyLen), true},
		{strings.Repeat("k", guard.MaxKeyLen+1), false},
		{strings.Repeat("é", guard.MaxKeyLen/2+1), false}, // bytes, not runes
		{"a b", false},
		{"a\tb", false},
		{"a\x00", false},
		{"a\x1f", false},
		{"a\x7f", false},
		{"a\u0080", false},
		{"a\u0085", false},
		{"a\u009f", false},
		{"a\xff", false},
		{"a\xc3", false},
		{"\xed\xa0\x80", false}, // a surrogate, as WTF-8
	}
	for _, tt := range tests {
		if got := guard.ValidKey(tt.key); got != tt.want {
			t.Errorf("ValidKey(%q) = %v, want %v", tt.key, got, tt.want)
		}
	}
}

// FuzzValidKey compares ValidKey with its definition.
func FuzzValidKey(f *testing.F) {
	for _, s := range []string{"", "sk_1", "clé", "a b", "a\u0085", "a\xff", "\u00a0", strings.Repeat("k", 257)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		want := len(key) <= guard.MaxKeyLen && utf8.ValidString(key) &&
			!strings.ContainsFunc(key, func(r rune) bool { return unicode.IsControl(r) || r == ' ' })
		if got := guard.ValidKey(key); got != want {
			t.Fatalf("ValidKey(%q) = %v, want %v", key, got, want)
		}
	})
}
