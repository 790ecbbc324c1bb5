package regionstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate/tollgate/guard/redisstore/regionstore"
	"github.com/tollgate/tollgate/internal/regions"
)

// TestSteadyTrafficBelowShare offers a region steady traffic below its
// share of a global fixed window, spread evenly, through the share ledger
// in Redis and through the gateways' region script: every request is
// admitted. Counting an admission within the skew bound of a boundary in
// both windows rejected about 4 % of them (45 % of L against a share of
// half of L, 1 s windows, the default 100 ms skew).
func TestSteadyTrafficBelowShare(t *testing.T) {
	const sec = 1_000_000
	client := startRedis(t)
	ctx := context.Background()
	cfg := regions.Config{}.WithDefaults()
	tests := []struct {
		name  string
		fleet regions.Fleet
		units int64
		rate  float64 // per second
	}{
		{"45 % of L, two regions", regions.EqualFleet("r1", "r2"), 50, 22.5},
		{"30 % of L, three regions", regions.EqualFleet("r1", "r2", "r3"), 50, 15},
	}
	for i, tt := range tests {
		for _, via := range []string{"store", "gate"} {
			t.Run(tt.name+" through the "+via, func(t *testing.T) {
				tag := fmt.Sprintf("%d-%s-%d", i, via, time.Now().UnixNano())
				store, err := regionstore.New(client, cfg, tt.fleet, "r1", regionstore.WithKeyPrefix("tg"+tag))
				if err != nil {
					t.Fatal(err)
				}
				gate := newGate(t, client, cfg, tt.fleet, time.Hour)
				name := fmt.Sprintf("tg{g:split-%s}split", tag)
				lim := regions.Limit{Kind: regions.FixedWindow, Units: tt.units, Window: sec}
				start := int64(1_763_000_000)*sec + 3_333
				n, rejected := int(tt.rate*20), 0
				for k := range n {
					now := start + int64(float64(k)*sec/tt.rate)
					var a regions.Admission
					if via == "store" {
						a, err = store.Admit(ctx, name, lim, 1, now)
					} else {
						a, _, err = gate.check(ctx, name, lim, 1, 0, now)
					}
					if err != nil {
						t.Fatal(err)
					}
					if !a.Allowed {
						rejected++
					}
				}
				if rejected > 0 {
					t.Fatalf("%d of %d rejected at %.1f per second against a share of %d per second",
						rejected, n, tt.rate, tt.fleet.Static(tt.units)[0])
				}
			})
		}
	}
}
