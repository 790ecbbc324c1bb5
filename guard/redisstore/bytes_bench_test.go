package redisstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/guard/internal/guardtest"
	"github.com/tollgate/tollgate/guard/redisstore"
	"github.com/tollgate/tollgate/guard/redisstore/counterbytes"
)

// bytesCounters is how many counters of each algorithm
// BenchmarkBytesPerCounter creates; bytesShortCounters under -short.
const (
	bytesCounters      = 100_000
	bytesShortCounters = 10_000
	bytesSamples       = 200
)

// BenchmarkBytesPerCounter measures what one counter costs in Redis, per
// algorithm, with package counterbytes: it creates bytesCounters fresh
// counters through the store's real scripts (one check of cost 1 each,
// named as the guard names a key-scope counter of a key without tenant:
// 29 bytes) on an empty redis-server, then reports
//
//   - B/counter: the growth of INFO used_memory divided by the number of
//     counters (the whole cost: the value, the key in the keyspace and the
//     expires tables, allocator rounding);
//   - usage-B/counter: the mean MEMORY USAGE (SAMPLES 0) of bytesSamples
//     counters spread over the range (the key and value only).
//
// The work is done once per sub-benchmark whatever b.N is; run it with
// -benchtime=1x. The script cache is loaded before the first baseline. It
// checks that every counter was fresh and that each one made exactly one
// key. loadtest sweep -what redis measures the same at other counts.
func BenchmarkBytesPerCounter(b *testing.B) {
	client := guardtest.Client(b, redistest.StartTB(b).Addr())
	store := redisstore.New(client, redisstore.WithTimeout(5*time.Second))
	b.Cleanup(func() { store.Close() })
	ctx := context.Background()
	n := bytesCounters
	if testing.Short() {
		n = bytesShortCounters
	}
	logRedisSettings(b, client)
	if err := counterbytes.LoadScripts(ctx, client, store, algorithms); err != nil {
		b.Fatal(err)
	}
	for _, alg := range algorithms {
		b.Run(string(alg), func(b *testing.B) {
			r, err := counterbytes.Measure(ctx, client, store, alg, n, bytesSamples)
			if err != nil {
				b.Fatal(err)
			}
			b.Logf("%s: %d counters, used_memory %d -> %d, %s/%s", alg, n, r.UsedBefore, r.UsedAfter, r.Type, r.Encoding)
			b.ReportMetric(r.PerCounter, "B/counter")
			b.ReportMetric(r.Usage, "usage-B/counter")
		})
	}
}

// logRedisSettings logs the server version and the encoding thresholds
// that decide how many bytes a counter takes.
func logRedisSettings(b *testing.B, client redis.UniversalClient) {
	b.Helper()
	ctx := context.Background()
	info := client.Info(ctx, "server").Val()
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			b.Logf("redis_version %s", v)
		}
	}
	for _, k := range []string{"hash-max-listpack-*", "zset-max-listpack-*", "maxmemory-policy"} {
		b.Logf("%v", client.ConfigGet(ctx, k).Val())
	}
}
