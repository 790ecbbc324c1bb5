package pipeline_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate/tollgate/gateway"
	"github.com/tollgate/tollgate/internal/fleetkv"
	"github.com/tollgate/tollgate/internal/testwait"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// presence reads the fleet's presence bucket, by gateway_id.
func (f *fleet) presence(kv *fleetkv.KV) (map[string]*tollgatev1.GatewayEntry, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	seen, _, err := kv.Gateways(ctx)
	out := map[string]*tollgatev1.GatewayEntry{}
	for _, g := range seen {
		out[g.Entry.GatewayID] = g.Entry
	}
	return out, err
}

// TestFleetPresence: a gateway's entry in tollgate_gateways appears
// within 2 s of its start with the rules version it runs, follows a rules
// change within 2 s, and is gone once the gateway has stopped gracefully.
func TestFleetPresence(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 0)
	nc, err := fleetkv.Connect(f.ns.ClientURL(), fleetkv.Options{Name: "presence-reader"})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	kv, err := fleetkv.Open(t.Context(), nc)
	if err != nil {
		t.Fatal(err)
	}
	want := func(id string, version int64) error {
		gs, err := f.presence(kv)
		if err != nil {
			return err
		}
		g := gs[id]
		if g == nil || g.RulesVersion != version || g.RulesSource != tollgatev1.RulesFromNATS {
			return fmt.Errorf("entries %+v, want %s on version %d from nats", gs, id, version)
		}
		return nil
	}

	f.gwConfig = func(c *gateway.Config) { c.Region = "eu-west" }
	gw := f.startGateway("gw-presence")
	d := testwait.Eventually(t, 2*time.Second, func() error { return want("gw-presence", 1) })
	t.Logf("entry after %v", d)
	gs, _ := f.presence(kv)
	if e := gs["gw-presence"]; e.Region != "eu-west" || e.StartedAt.IsZero() || e.Time.IsZero() || e.RulesHash == "" {
		t.Errorf("entry %+v: region, started_at, time or rules_hash missing", e)
	}

	v := f.putRules(fleetRules(7))
	d = testwait.Eventually(t, 2*time.Second, func() error { return want("gw-presence", v) })
	t.Logf("rules version %d in the entry after %v", v, d)
	// The operator API lists it as on the active version.
	code, b := f.op("GET", "/admin/v1/gateways", "")
	var list struct {
		RulesVersion int64 `json:"rules_version"`
		Current      int
		Gateways     []struct {
			ID           string
			Region       string
			RulesVersion int64 `json:"rules_version"`
			Current      bool
		}
	}
	if code != 200 || json.Unmarshal(b, &list) != nil || list.RulesVersion != v || list.Current != 1 || len(list.Gateways) != 1 ||
		list.Gateways[0].ID != "gw-presence" || !list.Gateways[0].Current || list.Gateways[0].Region != "eu-west" {
		t.Errorf("GET /admin/v1/gateways: %d %s, want gw-presence current on version %d", code, b, v)
	}

	gw.stop(t)
	if gs, err := f.presence(kv); err != nil || len(gs) != 0 {
		t.Fatalf("after a graceful stop: %+v (%v), want no entry", gs, err)
	}
}
