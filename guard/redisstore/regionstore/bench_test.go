package regionstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/internal/guardtest"
	"github.com/tollgate/tollgate/guard/redisstore/regionstore"
	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/internal/regions"
)

// BenchmarkAdmit is one admission of a global counter through the share
// ledger in Redis, per kind, the counter holding one loan given and one
// received (one round trip each; ns/op includes it). redis-µs/op is the
// script's own time in Redis (INFO commandstats).
//
//	go test -run '^$' -bench BenchmarkAdmit -benchtime 2s ./guard/redisstore/regionstore/
func BenchmarkAdmit(b *testing.B) {
	client, cfg, _, store := benchStore(b)
	ctx := context.Background()
	runs := 0
	for _, lim := range []regions.Limit{
		{Kind: regions.FixedWindow, Units: 1_000_000, Window: 60_000_000},
		{Kind: regions.SlidingWindow, Units: 1_000_000, Window: 60_000_000},
		{Kind: regions.Bucket, Units: 1_000_000, Window: 60_000_000},
	} {
		b.Run(lim.Kind.String(), func(b *testing.B) {
			runs++ // the benchmark function runs once per b.N tried
			name := fmt.Sprintf("tg{g:bench-%s-%d}bench", lim.Kind, runs)
			now := time.Now().UnixMicro()
			lendBoth(b, store, cfg, name, lim, now, 1)
			if err := client.ConfigResetStat(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := range b.N {
				if _, err := store.Admit(ctx, name, lim, 1, now+int64(i)); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			reportScriptTime(b, client)
		})
	}
}

// benchStore is a store of region r1 of three equal regions, on a Redis
// server of the benchmark's own, with the default configuration.
func benchStore(b *testing.B) (redis.UniversalClient, regions.Config, regions.Fleet, *regionstore.Store) {
	b.Helper()
	client := guardtest.Client(b, redistest.StartTB(b).Addr())
	cfg := regions.Config{}.WithDefaults()
	fleet := regions.EqualFleet("r1", "r2", "r3")
	store, err := regionstore.New(client, cfg, fleet, "r1")
	if err != nil {
		b.Fatal(err)
	}
	return client, cfg, fleet, store
}

// lendBoth has counter hold one loan given (r1 to r2) and one received
// (r3 to r1), 1 000 units each, from the slot of now for slots slots.
func lendBoth(b *testing.B, store *regionstore.Store, cfg regions.Config, counter string, lim regions.Limit, now, slots int64) {
	b.Helper()
	ctx := context.Background()
	slot := now / cfg.Period
	if lim.Kind == regions.FixedWindow {
		slot = now / lim.Window
	}
	id := func(n uint64) regions.LoanID { return regions.LoanID{Epoch: regions.NewEpoch(1, 0), Seq: n} }
	give := &regions.Order{Epoch: regions.NewEpoch(1, 0), Loan: regions.Loan{ID: id(1), Counter: counter, Limit: lim,
		From: "r1", To: "r2", Units: 1000, First: slot, Last: slot + slots}}
	if _, _, err := store.Give(ctx, give, 0, now); err != nil {
		b.Fatal(err)
	}
	in := &regions.Transfer{Loan: regions.Loan{ID: id(2), Counter: counter, Limit: lim,
		From: "r3", To: "r1", Units: 1000, First: slot, Last: slot + slots}}
	if _, _, err := store.Receive(ctx, in, now); err != nil {
		b.Fatal(err)
	}
}

// reportScriptTime reports the scripts' own time in Redis per call since
// the last CONFIG RESETSTAT, as redis-µs/op.
func reportScriptTime(b *testing.B, client redis.UniversalClient) {
	b.Helper()
	info, err := client.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	if us, ok := usecPerCall(info, "evalsha"); ok {
		b.ReportMetric(us, "redis-µs/op")
	}
}

// usecPerCall reads a command's usec_per_call from INFO commandstats.
func usecPerCall(info, cmd string) (float64, bool) {
	for line := range strings.Lines(info) {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":")
		if !ok {
			continue
		}
		for field := range strings.SplitSeq(rest, ",") {
			if v, ok := strings.CutPrefix(field, "usec_per_call="); ok {
				f, err := strconv.ParseFloat(v, 64)
				return f, err == nil
			}
		}
	}
	return 0, false
}

// BenchmarkGateCheck is the gateway's decision of a global counter (one
// guard check, cost 1, through the guard's region script, with Redis
// TIME), per kind, the counter holding one loan given and one received;
// "regional" is the same check of a regional counter (the guard's usual
// script) for comparison. redis-µs/op is the script's own time in Redis
// (INFO commandstats).
//
//	go test -run '^$' -bench BenchmarkGateCheck -benchtime 2s ./guard/redisstore/regionstore/
func BenchmarkGateCheck(b *testing.B) {
	client, cfg, fleet, store := benchStore(b)
	ctx := context.Background()
	g := newGate(b, client, cfg, fleet, time.Second)
	runs := 0
	for _, lim := range []regions.Limit{
		{Kind: regions.FixedWindow, Units: 1_000_000, Window: 60_000_000},
		{Kind: regions.SlidingWindow, Units: 1_000_000, Window: 60_000_000},
		{Kind: regions.Bucket, Units: 1_000_000, Window: 60_000_000},
		{}, // regional
	} {
		name := lim.Kind.String()
		if lim.Units == 0 {
			name = "regional"
		}
		b.Run(name, func(b *testing.B) {
			runs++
			counter := fmt.Sprintf("tg{g:gate-%s-%d}bench", name, runs)
			var c guard.Counter
			if lim.Units == 0 {
				c = guard.Counter{Name: counter, Algorithm: rules.FixedWindow, Params: rules.Params{Limit: 1_000_000, Window: 60_000_000}, Cost: 1}
			} else {
				c = g.counter(counter, lim, 1, 0)
				lendBoth(b, store, cfg, counter, lim, time.Now().UnixMicro(), 100)
			}
			cs := []guard.Counter{c}
			res := make([]guard.CounterResult, 1)
			if err := client.ConfigResetStat(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for range b.N {
				if _, err := g.store.Do(ctx, guard.OpCheck, 0, cs, res); err != nil {
					b.Fatal(err)
				}
				if !res[0].Allowed {
					b.Fatal("rejected")
				}
			}
			b.StopTimer()
			reportScriptTime(b, client)
		})
	}
}
