package aggregator_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testwait"
)

// TestOverview: GET /admin/v1/overview sums the decisions of the last
// minutes and ranks keys and tenants by rejections, from the decision
// stream; it refuses bad parameters and answers the viewer as well.
func TestOverview(t *testing.T) {
	brokers := startKafka(t)
	cfg := testConfig(brokers, "a", t.TempDir())
	cfg.ViewerToken = viewerToken
	in := runAggregator(t, cfg)
	addr := in.srv.Addrs().API
	gw := newGateway(t, brokers, "gw-1", 1)
	now := time.Now()
	for range 3 {
		gw.emit(t, "acme", "kid-z-noisy", false, now)
	}
	gw.emit(t, "acme", "kid-z-noisy", true, now)
	gw.emit(t, "acme", "kid-calm", true, now)
	gw.emit(t, "abc", "kid-other", false, now)
	gw.emit(t, "acme", "kid-old", false, now.Add(-2*time.Hour)) // outside the span

	type body struct {
		Minutes int
		Ready   bool
		Health  struct{ Status string }
		Traffic struct {
			Allowed, Rejected  int64
			DecisionsPerSecond float64 `json:"decisions_per_second"`
			RejectionRate      float64 `json:"rejection_rate"`
		}
		TopKeys []struct {
			Tenant            string
			KeyID             string `json:"key_id"`
			Allowed, Rejected int64
		} `json:"top_keys"`
		TopTenants []struct {
			Tenant            string
			Allowed, Rejected int64
		} `json:"top_tenants"`
		Levels map[string]int `json:"penalty_levels"`
	}
	var got body
	testwait.Eventually(t, 60*time.Second, func() error {
		code, _, b := op(t, addr, "GET", "/admin/v1/overview?minutes=10", "")
		if code != 200 {
			return fmt.Errorf("%d %s", code, b)
		}
		got = body{}
		if err := json.Unmarshal(b, &got); err != nil {
			return err
		}
		if got.Traffic.Allowed != 2 || got.Traffic.Rejected != 4 {
			return fmt.Errorf("traffic %+v, want 2 allowed 4 rejected", got.Traffic)
		}
		return nil
	})
	if got.Minutes != 10 || got.Traffic.RejectionRate < 0.66 || got.Traffic.RejectionRate > 0.67 || got.Traffic.DecisionsPerSecond <= 0 {
		t.Errorf("overview %+v", got)
	}
	if len(got.TopKeys) != 2 || got.TopKeys[0].KeyID != "kid-z-noisy" || got.TopKeys[0].Rejected != 3 || got.TopKeys[0].Allowed != 1 ||
		got.TopKeys[1].KeyID != "kid-other" {
		t.Errorf("top keys %+v", got.TopKeys)
	}
	if len(got.TopTenants) != 2 || got.TopTenants[0].Tenant != "acme" || got.TopTenants[0].Rejected != 3 || got.TopTenants[0].Allowed != 2 {
		t.Errorf("top tenants %+v", got.TopTenants)
	}
	if len(got.Levels) != 3 || got.Health.Status == "" {
		t.Errorf("levels %v, health %+v", got.Levels, got.Health)
	}
	if code, _, b := op(t, addr, "GET", "/admin/v1/overview?minutes=10&limit=1", ""); code != 200 || strings.Contains(string(b), "kid-other") {
		t.Errorf("limit=1: %d %s", code, b)
	}
	for _, q := range []string{"minutes=0", "minutes=61", "limit=x", "limit=101"} {
		if code, _, b := op(t, addr, "GET", "/admin/v1/overview?"+q, ""); code != 400 || errorCode(b) != "INVALID_REQUEST" {
			t.Errorf("%s: %d %s, want 400 INVALID_REQUEST", q, code, b)
		}
	}
	if code, _, _ := op(t, addr, "GET", "/admin/v1/overview", "", "Authorization", "Bearer "+viewerToken); code != 200 {
		t.Errorf("viewer: %d", code)
	}
}
