// Package counterbytes measures what one rate-limit counter costs in Redis:
// it creates fresh counters through a redisstore.Store's real scripts on a
// server of its own (the measure flushes it) and reads the growth of INFO
// used_memory and MEMORY USAGE of a sample of them. The benchmark of
// guard/redisstore and loadtest's key-count sweep both measure with it.
package counterbytes

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/redisstore"
	"github.com/tollgate/tollgate/guard/rules"
)

// ErrFresh is returned (wrapped) when a counter the measure creates was
// not fresh: the server was not empty, or names collided.
var ErrFresh = errors.New("counterbytes: counter was not fresh")

// Callers is how many goroutines create counters at once, so that the
// store batches them into pipelines.
const Callers = 64

// Result is what one measure found.
type Result struct {
	Algorithm rules.Algorithm
	// Counters is how many counters were created.
	Counters int
	// UsedBefore and UsedAfter are INFO used_memory around the creation.
	UsedBefore, UsedAfter int64
	// PerCounter is (UsedAfter − UsedBefore) / Counters: the whole cost
	// of a counter (value, keyspace and expires entries, their share of
	// the tables, allocator rounding).
	PerCounter float64
	// Usage is the mean MEMORY USAGE (SAMPLES 0) of the sampled counters:
	// the key and its value only; 0 when none was sampled.
	Usage float64
	// Type and Encoding are Redis's TYPE and OBJECT ENCODING of a counter.
	Type, Encoding string
}

// Params is a limit no single check of cost 1 exhausts: 100 per 1 000
// hours. A counter lives until it would be full again, so one unit refills
// only after ten hours: no counter expires while millions more are
// created (at 100 per hour one would, after 36 s).
func Params() rules.Params {
	window := int64(1_000 * 3_600_000_000)
	return rules.Params{Limit: 100, Window: window, Precision: 1, FullNum: window, FullDen: 1}
}

// Name returns the name of counter i of a run stamped stamp: as the
// guard names a key-scope counter of a key without tenant (a 22-character
// key_id in the hash tag, a 3-character rule tag; 29 bytes).
func Name(i int, stamp int64) string {
	return "tg{" + fmt.Sprintf("%06d%016x", i, stamp)[:22] + "}aaC"
}

// LoadScripts runs every algorithm's script once and flushes the server,
// so that the script cache is in the baseline of every later measure.
func LoadScripts(ctx context.Context, client redis.UniversalClient, store *redisstore.Store, algs []rules.Algorithm) error {
	for _, alg := range algs {
		if err := Create(ctx, store, alg, Params(), 1, time.Now().UnixNano()); err != nil {
			return err
		}
		if err := client.Do(ctx, "FLUSHALL", "SYNC").Err(); err != nil {
			return fmt.Errorf("counterbytes: flushall: %w", err)
		}
	}
	return nil
}

// Measure flushes the server, creates n fresh counters of alg with one
// check of cost 1 each, checks that each made one key, and reads their
// cost; samples counters spread over the range are read with MEMORY
// USAGE. Call LoadScripts first.
func Measure(ctx context.Context, client redis.UniversalClient, store *redisstore.Store, alg rules.Algorithm, n, samples int) (Result, error) {
	r := Result{Algorithm: alg, Counters: n}
	if n < 1 {
		return r, fmt.Errorf("counterbytes: measure %s: %d counters, want at least 1", alg, n)
	}
	if err := client.Do(ctx, "FLUSHALL", "SYNC").Err(); err != nil {
		return r, fmt.Errorf("counterbytes: flushall: %w", err)
	}
	var err error
	if r.UsedBefore, err = UsedMemory(ctx, client); err != nil {
		return r, err
	}
	stamp := time.Now().UnixNano()
	if err := Create(ctx, store, alg, Params(), n, stamp); err != nil {
		return r, err
	}
	if r.UsedAfter, err = UsedMemory(ctx, client); err != nil {
		return r, err
	}
	keys, err := client.DBSize(ctx).Result()
	if err != nil {
		return r, fmt.Errorf("counterbytes: dbsize: %w", err)
	}
	if keys != int64(n) {
		return r, fmt.Errorf("counterbytes: %d keys for %d counters of %s", keys, n, alg)
	}
	r.PerCounter = float64(r.UsedAfter-r.UsedBefore) / float64(n)
	samples = min(samples, n)
	var usage int64
	for i := range samples {
		name := Name(i*(n/samples), stamp)
		size, err := client.MemoryUsage(ctx, name, 0).Result()
		if err != nil {
			return r, fmt.Errorf("counterbytes: memory usage %s: %w", name, err)
		}
		usage += size
	}
	if samples > 0 {
		r.Usage = float64(usage) / float64(samples)
	}
	first := Name(0, stamp)
	r.Type = client.Type(ctx, first).Val()
	r.Encoding = client.ObjectEncoding(ctx, first).Val()
	return r, nil
}

// Create charges n fresh counters of alg (named Name(i, stamp)) once
// each from Callers goroutines, and checks that each was fresh.
func Create(ctx context.Context, store *redisstore.Store, alg rules.Algorithm, p rules.Params, n int, stamp int64) error {
	var wg sync.WaitGroup
	errs := make(chan error, Callers)
	for w := range Callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := make([]guard.CounterResult, 1)
			for i := w; i < n; i += Callers {
				c := []guard.Counter{{Name: Name(i, stamp), Algorithm: alg, Params: p, Cost: 1}}
				if _, err := store.Do(ctx, guard.OpCheck, 0, c, res); err != nil {
					errs <- fmt.Errorf("counterbytes: create counter %d of %s: %w", i, alg, err)
					return
				}
				if !res[0].Allowed || res[0].Remaining != p.Limit-1 {
					errs <- fmt.Errorf("%w: counter %d of %s: %+v", ErrFresh, i, alg, res[0])
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	return errors.Join(all...)
}

// UsedMemory returns INFO memory's used_memory.
func UsedMemory(ctx context.Context, client redis.UniversalClient) (int64, error) {
	info, err := client.Info(ctx, "memory").Result()
	if err != nil {
		return 0, fmt.Errorf("counterbytes: info memory: %w", err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("counterbytes: used_memory %q: %w", v, err)
			}
			return n, nil
		}
	}
	return 0, errors.New("counterbytes: INFO memory has no used_memory")
}
