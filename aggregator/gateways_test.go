package aggregator_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/tollgate/tollgate/aggregator"
	"github.com/tollgate/tollgate/internal/testwait"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// gatewaysAnswer is GET /admin/v1/gateways' answer as these tests read it.
type gatewaysAnswer struct {
	RulesVersion int64 `json:"rules_version"`
	Count        int
	Current      int
	Corrupt      int `json:"corrupt_entries"`
	Gateways     []struct {
		ID           string
		Region       string
		RulesVersion int64  `json:"rules_version"`
		RulesSource  string `json:"rules_source"`
		Current      bool
		LastSeen     string  `json:"last_seen"`
		AgeSeconds   float64 `json:"age_seconds"`
		Stale        bool
	}
}

// TestGatewaysEndpoint: GET /admin/v1/gateways lists the presence
// bucket's entries with whether each runs the active rules version,
// skipping and counting the entries that do not decode or sit under
// another gateway's key; the viewer reads it, a request without a token
// is 401; the overview carries the same list.
func TestGatewaysEndpoint(t *testing.T) {
	in, js := startFleetAggregatorOn(t, startKafka(t), func(c *aggregator.Config) { c.ViewerToken = viewerToken })
	addr := in.srv.Addrs().API
	if code, _, b := op(t, addr, "PUT", "/admin/v1/rules", validRules); code != 200 {
		t.Fatalf("PUT rules: %d %s", code, b)
	}
	kv, err := js.KeyValue(t.Context(), tollgatev1.BucketGateways)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	for key, value := range map[string]string{
		"gw-a":     fmt.Sprintf(`{"gateway_id":"gw-a","region":"eu","rules_version":1,"rules_source":"nats","started_at":%q,"time":%q}`, now.Format(time.RFC3339), now.Format(time.RFC3339)),
		"gw-b":     `{"gateway_id":"gw-b","region":"us","rules_version":0,"rules_source":"file"}`,
		"gw-junk":  "\x00\xffnot json",
		"gw-moved": `{"gateway_id":"gw-c","rules_version":1}`,
	} {
		if _, err := kv.Put(t.Context(), key, []byte(value)); err != nil {
			t.Fatal(err)
		}
	}

	var got gatewaysAnswer
	code, _, b := op(t, addr, "GET", "/admin/v1/gateways", "")
	if code != 200 || json.Unmarshal(b, &got) != nil {
		t.Fatalf("GET gateways: %d %s", code, b)
	}
	if got.RulesVersion != 1 || got.Count != 2 || got.Current != 1 || got.Corrupt != 2 || len(got.Gateways) != 2 {
		t.Fatalf("answer %s: want version 1, 2 gateways (1 current), 2 corrupt", b)
	}
	a, bb := got.Gateways[0], got.Gateways[1]
	if a.ID != "gw-a" || a.Region != "eu" || !a.Current || a.RulesSource != "nats" || a.Stale || a.AgeSeconds > 10 || a.LastSeen == "" {
		t.Errorf("gw-a %+v", a)
	}
	if bb.ID != "gw-b" || bb.Current || bb.RulesVersion != 0 {
		t.Errorf("gw-b %+v: want behind", bb)
	}

	if code, _, _ := op(t, addr, "GET", "/admin/v1/gateways", "", "Authorization", "Bearer "+viewerToken); code != 200 {
		t.Errorf("viewer: %d, want 200", code)
	}
	resp, err := http.Get("http://" + addr + "/admin/v1/gateways")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("without a token: %d, want 401", resp.StatusCode)
	}

	testwait.Eventually(t, 20*time.Second, func() error {
		var ov struct {
			Gateways *gatewaysAnswer
		}
		code, _, b := op(t, addr, "GET", "/admin/v1/overview", "")
		if code != 200 {
			return fmt.Errorf("overview: %d %s", code, b)
		}
		if err := json.Unmarshal(b, &ov); err != nil {
			return err
		}
		if ov.Gateways == nil || ov.Gateways.Count != 2 || ov.Gateways.Current != 1 || len(ov.Gateways.Gateways) != 2 {
			return fmt.Errorf("overview's gateways %+v", ov.Gateways)
		}
		return nil
	})
}
