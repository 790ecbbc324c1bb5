package gateway_test

import (
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/gateway"
)

// TestGatewayRegionShare: two regions, each a redis-server and a gateway
// told its region (TOLLGATE_REGION). A global rule of 5 an hour split
// by weights 0.6 and 0.4 gives the regions 3 and 2, in their headers and
// their admissions, so a client rotating between them gets 5 in all; a
// regional rule gives each region the whole limit.
func TestGatewayRegionShare(t *testing.T) {
	t.Parallel()
	const rules = `regions: [{name: eu, weight: 0.6}, {name: us, weight: 0.4}]
rules:
  - {id: global, match: {endpoint: "^/g"}, algorithm: fixed_window, limit: 5, window: 1h, regions: global}
  - {id: regional, match: {endpoint: "^/r"}, algorithm: fixed_window, limit: 5, window: 1h}
`
	eu := newEnv(t, envOptions{rules: rules, config: func(c *gateway.Config) { c.Region = "eu" }})
	us := newEnv(t, envOptions{rules: rules, config: func(c *gateway.Config) { c.Region = "us" }})
	for _, tt := range []struct {
		path      string
		euLimit   int64
		usLimit   int64
		wantTotal int
	}{
		{"/g", 3, 2, 5},
		{"/r", 5, 5, 10},
	} {
		admitted := 0
		for i := 0; i < 20; i++ {
			e, want := eu, tt.euLimit
			if i%2 == 1 {
				e, want = us, tt.usLimit
			}
			resp, _ := e.proxyGet(tt.path, "sk_rotating_client")
			if got := headerInt(t, resp.Header, "X-RateLimit-Limit"); got != want {
				t.Fatalf("%s request %d: X-RateLimit-Limit %d, want the region's share %d", tt.path, i, got, want)
			}
			switch resp.StatusCode {
			case http.StatusOK:
				admitted++
			case http.StatusTooManyRequests:
			default:
				t.Fatalf("%s request %d: status %d", tt.path, i, resp.StatusCode)
			}
		}
		if admitted != tt.wantTotal {
			t.Errorf("%s: %d admitted across both regions, want %d", tt.path, admitted, tt.wantTotal)
		}
	}
}
