package aggregator_test

import (
	"bytes"
	"testing"

	"github.com/tollgate/tollgate/aggregator"
)

// TestKeyStateAtTheRegionsShare: the operator API reads a rule marked
// regions: global at its own region's share of the limit, as that region's
// gateways enforce it, and a regional rule whole.
func TestKeyStateAtTheRegionsShare(t *testing.T) {
	const ruleset = `
regions:
  - name: eu
    weight: 0.6
  - name: us
    weight: 0.4
rules:
  - id: global
    match: {endpoint: "^/g"}
    algorithm: token_bucket
    capacity: 10
    rate: 10/1m
    regions: global
  - id: regional
    algorithm: token_bucket
    capacity: 10
    rate: 10/1m
`
	in, _ := startFleetAggregatorOn(t, startKafka(t), func(c *aggregator.Config) { c.Region = "us" })
	addr := in.srv.Addrs().API
	if code, _, b := op(t, addr, "PUT", "/admin/v1/rules", ruleset); code != 200 {
		t.Fatalf("PUT rules: %d %s", code, b)
	}
	for _, tc := range []struct{ endpoint, want string }{
		{"/g", `"remaining": 4`},
		{"/other", `"remaining": 10`},
	} {
		code, _, b := op(t, addr, "GET", "/admin/v1/keys/sk_region_client?endpoint="+tc.endpoint, "")
		if code != 200 || !bytes.Contains(b, []byte(tc.want)) {
			t.Errorf("GET keys at %s in region us: %d %s, want %s", tc.endpoint, code, b, tc.want)
		}
	}
}
