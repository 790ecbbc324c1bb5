package chaos

import (
	"strings"
	"testing"

	"github.com/tollgate/tollgate/guard/rules"
)

// The harness's rules must be what the gateways load; the checker models
// them from the same list, never from guard.
func TestRulesYAMLLoads(t *testing.T) {
	for _, ops := range []int64{opsLimit, 6, finalOpsRule} {
		y := rulesYAML(soakRules(), soakKeys(), ops)
		rs, err := rules.Load([]byte(y))
		if err != nil {
			t.Fatalf("ops %d: %v\n%s", ops, err, y)
		}
		if got, want := len(rs.Rules()), len(soakRules()); got != want {
			t.Fatalf("%d rules loaded, want %d", got, want)
		}
	}
	// Each endpoint applies exactly the rules the checker is told of,
	// over HTTP and over RLS.
	rs, _ := rules.Load([]byte(rulesYAML(soakRules(), soakKeys(), opsLimit)))
	want := map[string][]string{}
	for _, r := range soakRules() {
		for _, e := range r.Endpoints {
			want[e] = append(want[e], r.ID)
		}
	}
	for ep, ids := range want {
		for _, domain := range []string{"", rlsDomain} {
			var got []string
			for _, r := range rs.Match(&rules.Request{Key: "sk_chaos_acme_hot1", Tenant: "acme", Tier: "pro", Endpoint: ep, Method: "GET", Domain: domain}, nil) {
				got = append(got, r.ID)
			}
			if strings.Join(got, ",") != strings.Join(ids, ",") {
				t.Errorf("%s (domain %q) matches %v, want %v", ep, domain, got, ids)
			}
		}
	}
	y := rulesYAML(soakRules(), soakKeys(), 13)
	if !strings.Contains(y, "capacity: 13\n    refill_rate: 2.6\n") {
		t.Fatalf("ops rule at 13 not scaled:\n%s", y)
	}
}

func TestEveryEndpointOfTheLoadHasItsRules(t *testing.T) {
	eps := map[string]bool{}
	for _, r := range soakRules() {
		for _, e := range r.Endpoints {
			eps[e] = true
		}
	}
	for _, list := range [][]weighted{hot1Endpoints, hot2Endpoints} {
		sum := 0.0
		for _, w := range list {
			sum += w.weight
			if !eps[w.endpoint] {
				t.Errorf("%s has no rule", w.endpoint)
			}
		}
		if sum < 0.999 || sum > 1.001 {
			t.Errorf("weights sum to %g", sum)
		}
	}
	for _, e := range politeEndpoints {
		if !eps[e] {
			t.Errorf("polite endpoint %s has no rule", e)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c.Duration, c.Gateways, c.Aggregators, c.Rate, c.RedisMode = time0, 2, 1, 0, "standalone"
	err := c.Validate()
	for _, want := range []string{"-duration", "-gateways", "-aggregators", "-rate", "-redis"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to name %s", err, want)
		}
	}
}

const time0 = 0
