package regionstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/guard/internal/guardtest"
	"github.com/tollgate/tollgate/guard/redisstore/regionstore"
	"github.com/tollgate/tollgate/internal/regions"
	"github.com/tollgate/tollgate/internal/regions/regionsim"
)

// counted is the Redis store with counts of what the simulation asked it.
type counted struct {
	*regionstore.Store
	admits, applied *int64
}

func (c counted) Admit(ctx context.Context, counter string, lim regions.Limit, cost, now int64) (regions.Admission, error) {
	*c.admits++
	return c.Store.Admit(ctx, counter, lim, cost, now)
}

func (c counted) Receive(ctx context.Context, t *regions.Transfer, now int64) (bool, string, error) {
	ok, why, err := c.Store.Receive(ctx, t, now)
	if ok {
		*c.applied++
	}
	return ok, why, err
}

// TestRegionsimWithRedis runs the chaos simulation with one region's
// shares in a real Redis (the others in memory): the fleet's invariant is
// checked after every step as in the simulation's own runs, with every
// kind of limit, loss, duplication, reordering, partitions, crashes and
// skewed clocks; and again with limits cut and restored (overrides and
// penalties) while units are lent.
func TestRegionsimWithRedis(t *testing.T) {
	tests := []struct {
		name  string
		seed  uint64
		chaos regionsim.Chaos
	}{
		{"chaos", 3, regionsim.Chaos{Duration: 2 * time.Minute, Hot: 6, Cold: 20}},
		{"limit changes", 5, regionsim.Chaos{Duration: time.Minute, Hot: 6, LimitChanges: 20}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := guardtest.Client(t, redistest.StartTB(t).Addr()) // the runs name their counters alike
			var admits, applied int64
			s, err := regionsim.New(regionsim.Options{
				Seed: tt.seed, Regions: 3,
				Net: regionsim.Net{
					MinDelay: 20 * time.Millisecond, MaxDelay: 150 * time.Millisecond, Jitter: 40 * time.Millisecond,
					Loss: 0.1, Dup: 0.05, Stale: 0.02, StaleMax: 20 * time.Second,
				},
				Ledger: func(cfg regions.Config, fleet regions.Fleet, region string) (regionsim.Ledger, error) {
					if region != "r2" {
						return nil, nil
					}
					st, err := regionstore.New(client, cfg, fleet, region, regionstore.WithExpiryMargin(time.Hour))
					if err != nil {
						return nil, err
					}
					return counted{st, &admits, &applied}, nil
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Chaos(tt.chaos); err != nil {
				t.Fatal(err)
			}
			if err := s.RunFor(tt.chaos.Duration); err != nil {
				t.Fatal(err)
			}
			st := s.Stats()
			if admits == 0 || applied == 0 || st.Checks == 0 {
				t.Fatalf("the region in Redis admitted %d times and applied %d loans; %d checks: the run tested nothing", admits, applied, st.Checks)
			}
			t.Logf("steps=%d requests=%d admitted=%d checks=%d transfers=%d applied=%d mismatches=%d (in Redis: %d admissions, %d loans applied)",
				st.Steps, st.Requests, st.Admitted, st.Checks, st.Transfers, st.Applied, st.Mismatches, admits, applied)
		})
	}
}

var _ regionsim.Ledger = (*regionstore.Store)(nil)
