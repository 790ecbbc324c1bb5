package rules

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/testnet"
)

func TestMatchBound(t *testing.T) {
	t.Parallel()
	rule := func(id, match string) string {
		return fmt.Sprintf("  - {id: %s, match: {%s}, capacity: 5, rate: 5/1m}\n", id, match)
	}
	tests := []struct {
		name  string
		rules string
		want  int
		kind  string
	}{
		{"none", "", 0, ""},
		{"empty matches", rule("a", "") + rule("b", "") + rule("c", ""), 3, "every anonymous request"},
		{"tier", rule("a", "") + rule("f1", "tier: free") + rule("f2", "tier: free") + rule("p", "tier: pro"),
			3, `every request with a key of tier "free"`},
		{"keyed and anonymous apart", rule("k1", "anonymous: false") + rule("k2", "anonymous: false") + rule("a1", "anonymous: true"),
			2, "every request with a key"},
		{"methods and domain", rule("a", "") + rule("g", "methods: [GET]") + rule("gp", "methods: [GET, POST]") + rule("d", "domain: edge") + rule("p", "methods: [POST]"),
			4, `every anonymous request with method GET in Envoy domain "edge"`},
		{"endpoint and key selectors are not counted", rule("a", "") + rule("e", "endpoint: '^/'") + rule("k", "api_key: '*'") + rule("t", "tenant: acme"),
			1, "every anonymous request"},
		{"a replaced rule is not counted", rule("a", "") + rule("b", "") +
			"  - {id: c, match: {api_key: 'sk_vip_*'}, capacity: 5, rate: 5/1m, replaces: [b]}\n", 1, "every anonymous request"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rs := mustLoad(t, "rules:\n"+tt.rules)
			n, kind, matched := rs.MatchBound()
			if n != tt.want || kind != tt.kind || len(matched) != n {
				t.Errorf("MatchBound = %d, %q, %d rules; want %d, %q", n, kind, len(matched), tt.want, tt.kind)
			}
		})
	}
}

func TestCheckMatchLimit(t *testing.T) {
	t.Parallel()
	rs := mustLoad(t, "rules:\n"+strings.Join(testnet.Numbered("  - {id: r%d, match: {tier: free}, capacity: 5, rate: 5/1m}\n", 4), ""))
	if err := rs.CheckMatchLimit(4); err != nil {
		t.Errorf("4 rules, limit 4: %v", err)
	}
	if err := rs.CheckMatchLimit(0); err != nil {
		t.Errorf("no limit: %v", err)
	}
	err := rs.CheckMatchLimit(3)
	var ve *ValidationError
	if !errors.As(err, &ve) || ve.Rule != "r3" || ve.Field != "match" ||
		!strings.Contains(ve.Msg, `tier "free" matches at least 4 rules, more than the 3`) {
		t.Errorf("limit 3: %v", err)
	}
}
