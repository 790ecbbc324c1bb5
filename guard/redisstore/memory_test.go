package redisstore_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/internal/guardtest"
	"github.com/tollgate/tollgate/guard/redisstore"
	"github.com/tollgate/tollgate/guard/rules"
)

// stateRules has one key-scope rule per algorithm, all matching every
// request. Refill and windows are an hour, so a counter's time to full
// (tens of seconds and more) dwarfs the store's 1 s TTL margin and the TTL
// check below means something.
const stateRules = `
rules:
  - {id: tb, match: {}, algorithm: token_bucket, capacity: 100, rate: 100/1h}
  - {id: gcra, match: {}, algorithm: gcra, limit: 100, window: 1h, burst: 100}
  - {id: fw, match: {}, algorithm: fixed_window, limit: 100, window: 1h}
  - {id: swc, match: {}, algorithm: sliding_window_counter, limit: 100, window: 1h}
  - {id: swl, match: {}, algorithm: sliding_window_log, limit: 100, window: 1h}
`

// stateBudget is the documented bound on MEMORY USAGE per counter, for the
// algorithms that have one.
var stateBudget = map[string]int64{"tb": 120, "gcra": 88}

// recordStore passes calls to a Store and keeps the last call's time,
// counters and results. It names counters as the Store does.
type recordStore struct {
	*redisstore.Store

	mu       sync.Mutex
	now      int64
	counters []guard.Counter
	res      []guard.CounterResult
}

func (r *recordStore) Do(ctx context.Context, op guard.Op, now int64, counters []guard.Counter, res []guard.CounterResult) (int64, error) {
	t, err := r.Store.Do(ctx, op, now, counters, res)
	r.mu.Lock()
	r.now, r.counters, r.res = t, slices.Clone(counters), slices.Clone(res)
	r.mu.Unlock()
	return t, err
}

// TestStatePerKey measures the state per key: through a real Guard,
// for a key without tenant (its counters are named tg{<key_id>}<tag>), the
// MEMORY USAGE of each algorithm's counter after one check and after five,
// asserting the token bucket and GCRA budgets. It also requires that the
// guard wrote exactly the counters the naming predicts, and that every key
// it wrote expires (PTTL > 0) no earlier than the counter is full again
// (a shorter TTL forgets debt).
func TestStatePerKey(t *testing.T) {
	ctx := context.Background()
	client := guardtest.Client(t, redistest.StartTB(t).Addr())
	store := redisstore.New(client, redisstore.WithTimeout(2*time.Second))
	t.Cleanup(func() { store.Close() })
	rec := &recordStore{Store: store}
	rs, err := rules.Load([]byte(stateRules))
	if err != nil {
		t.Fatal(err)
	}
	g, err := guard.New(rec, []byte("state-secret-0123456789"), rs)
	if err != nil {
		t.Fatal(err)
	}
	req := &guard.Request{Key: "sk_live_9f3c2a7e51b84d06a1c3", Path: "/v1/items", Method: "GET"}

	// The names the guard gives a key-scope counter of a key whose tenant
	// is itself: prefix, key_id as hash tag, rule tag.
	kid := g.KeyID(req.Key)
	names := map[string]string{} // rule id -> key
	for _, r := range rs.Rules() {
		names[r.ID] = "tg{" + kid + "}" + r.Tag
	}

	for check := 1; check <= 5; check++ {
		d, err := g.Check(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed || d.Degraded {
			t.Fatalf("check %d: allowed=%v degraded=%v reason=%s", check, d.Allowed, d.Degraded, d.Reason)
		}
		if check != 1 && check != 5 {
			continue
		}
		checkKeyspace(t, client, names)
		checkTTLs(t, client, rec)
		for _, r := range rs.Rules() {
			key := names[r.ID]
			size, err := client.MemoryUsage(ctx, key, 0).Result()
			if err != nil {
				t.Fatalf("MEMORY USAGE %s: %v", key, err)
			}
			enc, _ := client.ObjectEncoding(ctx, key).Result()
			typ, _ := client.Type(ctx, key).Result()
			t.Logf("after %d check(s): %-22s %4d bytes (%s, %s; name %d bytes)", check, r.Algorithm, size, typ, enc, len(key))
			if budget, ok := stateBudget[r.ID]; ok && size > budget {
				t.Errorf("after %d check(s): %s counter %s uses %d bytes, the bound is %d", check, r.Algorithm, key, size, budget)
			}
		}
	}
}

// scanKeys returns every key in the database, sorted.
func scanKeys(t *testing.T, client redis.UniversalClient) []string {
	t.Helper()
	var keys []string
	iter := client.Scan(context.Background(), 0, "*", 100).Iterator()
	for iter.Next(context.Background()) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatalf("SCAN: %v", err)
	}
	slices.Sort(keys)
	return keys
}

// checkKeyspace requires the database to hold exactly the predicted keys.
func checkKeyspace(t *testing.T, client redis.UniversalClient, names map[string]string) {
	t.Helper()
	var want []string
	for _, k := range names {
		want = append(want, k)
	}
	slices.Sort(want)
	if got := scanKeys(t, client); !slices.Equal(got, want) {
		t.Fatalf("keys in Redis:\n%q\nwant the guard's names:\n%q", got, want)
	}
}

// checkTTLs requires every key to expire, and the counters of the last call
// to live at least until they are full again: Redis time before PTTL plus
// PTTL is a lower bound of the key's expiry.
func checkTTLs(t *testing.T, client redis.UniversalClient, rec *recordStore) {
	t.Helper()
	ctx := context.Background()
	full := map[string]int64{} // key -> Unix µs at which it is full again
	rec.mu.Lock()
	for i, c := range rec.counters {
		full[c.Name] = rec.now + rec.res[i].ResetAfter
	}
	rec.mu.Unlock()
	for _, key := range scanKeys(t, client) {
		before, err := client.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		ttl, err := client.PTTL(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl <= 0 {
			t.Errorf("key %s has no TTL (PTTL %v)", key, ttl)
			continue
		}
		f, ok := full[key]
		if !ok {
			t.Errorf("key %s was not written by the last check", key)
			continue
		}
		expiry := before.UnixMilli() + ttl.Milliseconds()
		need := (f + 999) / 1000
		if expiry < need {
			t.Errorf("key %s expires at %d ms, before it is full again at %d ms (%.1f s short)",
				key, expiry, need, float64(need-expiry)/1000)
		}
		if f <= rec.now {
			t.Errorf("key %s: counter reported full now (reset after %d µs) yet was kept", key, f-rec.now)
		}
	}
}
