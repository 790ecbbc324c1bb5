package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/internal/guardtest"
	"github.com/tollgate/tollgate/guard/redisstore"
	"github.com/tollgate/tollgate/guard/rules"
)

// TestSentinel decides through a Sentinel-managed primary found by its
// master name, as TOLLGATE_REDIS_MODE=sentinel configures it.
func TestSentinel(t *testing.T) {
	st := redistest.StartSentinelTB(t)
	client := guardtest.RedisClient(t, redisstore.Config{
		Mode: redisstore.ModeSentinel, Addrs: st.SentinelAddrs(), MasterName: st.MasterName(), Timeout: time.Second,
	})
	store := redisstore.New(client, redisstore.WithTimeout(time.Second))
	t.Cleanup(func() { store.Close() })
	rs, err := rules.Load([]byte("rules:\n  - id: r\n    match: {}\n    algorithm: fixed_window\n    limit: 3\n    window: 1h\n"))
	if err != nil {
		t.Fatal(err)
	}
	g, _ := guard.New(store, []byte("test-secret-0123456789"), rs)
	var statuses []int
	for range 4 {
		d, err := g.Check(context.Background(), &guard.Request{Key: "k", Path: "/"})
		if err != nil {
			t.Fatal(err)
		}
		statuses = append(statuses, d.Status)
	}
	if want := []int{200, 200, 200, 429}; !equalInts(statuses, want) {
		t.Fatalf("statuses %v, want %v", statuses, want)
	}
	// The counter lives on the primary the sentinels name.
	pc := st.Primary().Client()
	defer pc.Close()
	n, err := pc.DBSize(context.Background()).Result()
	if err != nil || n != 1 {
		t.Fatalf("primary holds %d keys (%v), want 1", n, err)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
