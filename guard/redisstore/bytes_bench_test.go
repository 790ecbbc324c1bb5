package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/redisstore"
	"github.com/tollgate/tollgate/guard/rules"
)

// bytesCounters is how many counters of each algorithm
// BenchmarkBytesPerCounter creates; bytesShortCounters under -short.
const (
	bytesCounters      = 100_000
	bytesShortCounters = 10_000
	bytesSamples       = 200
	bytesCallers       = 64
)

// BenchmarkBytesPerCounter measures what one counter costs in Redis, per
// algorithm: it creates bytesCounters fresh counters through the store's
// real scripts (one check of cost 1 each, named as the guard names a
// key-scope counter of a key without tenant: 29 bytes) on an empty
// redis-server, then reports
//
//   - B/counter: the growth of INFO used_memory divided by the number of
//     counters (the whole cost: the value, the key in the keyspace and the
//     expires tables, allocator rounding);
//   - usage-B/counter: the mean MEMORY USAGE (SAMPLES 0) of bytesSamples
//     counters spread over the range (the key and value only).
//
// The work is done once per sub-benchmark whatever b.N is; run it with
// -benchtime=1x. The script cache is loaded before the first baseline. It checks that every counter was fresh and that each one
// made exactly one key.
func BenchmarkBytesPerCounter(b *testing.B) {
	client := startRedis(b)
	store := redisstore.New(client, redisstore.WithTimeout(5*time.Second))
	b.Cleanup(func() { store.Close() })
	ctx := context.Background()
	n := bytesCounters
	if testing.Short() {
		n = bytesShortCounters
	}
	logRedisSettings(b, client)
	hour := int64(3_600_000_000)
	p := rules.Params{Limit: 100, Window: hour, Precision: 1, FullNum: hour, FullDen: 1}
	// Load every script first, so that the script cache is in the
	// baseline rather than in the first algorithm's figure.
	for _, alg := range algorithms {
		createCounters(b, store, alg, p, 1)
		if err := client.Do(ctx, "FLUSHALL", "SYNC").Err(); err != nil {
			b.Fatal(err)
		}
	}
	for _, alg := range algorithms {
		b.Run(string(alg), func(b *testing.B) {
			if err := client.Do(ctx, "FLUSHALL", "SYNC").Err(); err != nil {
				b.Fatal(err)
			}
			before := usedMemory(b, client)
			names := createCounters(b, store, alg, p, n)
			after := usedMemory(b, client)
			if keys := client.DBSize(ctx).Val(); keys != int64(n) {
				b.Fatalf("%d keys for %d counters", keys, n)
			}
			var usage int64
			for i := 0; i < bytesSamples; i++ {
				name := names[i*(n/bytesSamples)]
				size, err := client.MemoryUsage(ctx, name, 0).Result()
				if err != nil {
					b.Fatalf("MEMORY USAGE %s: %v", name, err)
				}
				usage += size
			}
			enc := client.ObjectEncoding(ctx, names[0]).Val()
			typ := client.Type(ctx, names[0]).Val()
			b.Logf("%s: %d counters, used_memory %d -> %d, %s/%s", alg, n, before, after, typ, enc)
			b.ReportMetric(float64(after-before)/float64(n), "B/counter")
			b.ReportMetric(float64(usage)/bytesSamples, "usage-B/counter")
		})
	}
}

// createCounters charges n fresh counters of alg once each, from
// bytesCallers goroutines so that the store batches them, and returns
// their names.
func createCounters(b *testing.B, store *redisstore.Store, alg rules.Algorithm, p rules.Params, n int) []string {
	b.Helper()
	names := make([]string, n)
	stamp := time.Now().UnixNano()
	for i := range names {
		// A 22-character key_id in the hash tag, a 3-character rule tag.
		names[i] = "tg{" + fmt.Sprintf("%06d%016x", i, stamp)[:22] + "}aaC"
	}
	var wg sync.WaitGroup
	errs := make(chan error, bytesCallers)
	for w := range bytesCallers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := make([]guard.CounterResult, 1)
			for i := w; i < n; i += bytesCallers {
				c := []guard.Counter{{Name: names[i], Algorithm: alg, Params: p, Cost: 1}}
				if _, err := store.Do(context.Background(), guard.OpCheck, 0, c, res); err != nil {
					errs <- fmt.Errorf("counter %d: %w", i, err)
					return
				}
				if !res[0].Allowed || res[0].Remaining != p.Limit-1 {
					errs <- fmt.Errorf("counter %d: %+v, want a fresh counter admitted", i, res[0])
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return names
}

// usedMemory returns INFO memory's used_memory.
func usedMemory(b *testing.B, client redis.UniversalClient) int64 {
	b.Helper()
	info, err := client.Info(context.Background(), "memory").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				b.Fatalf("used_memory %q: %v", v, err)
			}
			return n
		}
	}
	b.Fatal("INFO memory has no used_memory")
	return 0
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
