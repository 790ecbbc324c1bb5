package aggregator_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testwait"
)

// TestKeyLookupAppliesOverrides: keys/{key} reads a key at the limit the
// gateways enforce for it — under the fleet's overrides, the penalty
// ladder's reduced limit among them — and back at the rule's own once
// the override is gone. A blocklist entry leaves the lookup (and a reset)
// acting on the counters as before.
func TestKeyLookupAppliesOverrides(t *testing.T) {
	in, _ := startFleetAggregator(t)
	addr := in.srv.Addrs().API
	if code, _, b := op(t, addr, "PUT", "/admin/v1/rules", validRules); code != 200 {
		t.Fatalf("PUT rules: %d %s", code, b)
	}
	const key = "sk_lookup_client"
	limitOf := func() (int64, string, error) {
		code, _, b := op(t, addr, "GET", "/admin/v1/keys/"+key, "")
		if code != 200 {
			return 0, "", fmt.Errorf("GET keys: %d %s", code, b)
		}
		var st struct {
			Reason string `json:"reason"`
			Rules  []struct {
				Limit int64 `json:"limit"`
			} `json:"rules"`
		}
		if err := json.Unmarshal(b, &st); err != nil || len(st.Rules) != 1 {
			return 0, "", fmt.Errorf("GET keys: %s (%v)", b, err)
		}
		return st.Rules[0].Limit, st.Reason, nil
	}
	want := func(step string, limit int64) {
		t.Helper()
		testwait.Eventually(t, 5*time.Second, func() error {
			got, _, err := limitOf()
			if err != nil {
				return err
			}
			if got != limit {
				return fmt.Errorf("%s: limit %d, want %d", step, got, limit)
			}
			return nil
		})
	}
	want("no override", 10)
	for _, tc := range []struct {
		step, method, body string
		limit              int64
	}{
		{"an override's limit", "PUT", `{"limit":3}`, 3},
		{"a reduced limit (factor)", "PUT", `{"factor":0.5,"reason":"penalty ladder: reduced limit"}`, 5},
		{"override deleted", "DELETE", "", 10},
	} {
		if code, _, b := op(t, addr, tc.method, "/admin/v1/overrides/"+key, tc.body); code != 200 && code != 204 {
			t.Fatalf("%s: %s override: %d %s", tc.step, tc.method, code, b)
		}
		want(tc.step, tc.limit)
	}
	if code, _, b := op(t, addr, "PUT", "/admin/v1/blocklist/"+key, `{}`); code != 200 {
		t.Fatalf("PUT blocklist: %d %s", code, b)
	}
	code, _, b := op(t, addr, "POST", "/admin/v1/keys/"+key+"/reset", "")
	var r struct {
		Reset int `json:"reset"`
	}
	if code != 200 || json.Unmarshal(b, &r) != nil || r.Reset != 1 {
		t.Fatalf("reset of a blocked key: %d %s, want one rule reset", code, b)
	}
}
