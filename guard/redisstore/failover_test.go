package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/guard"
)

// TestSentinelFailoverFollowedOnBothPaths: after SENTINEL FAILOVER the sentinels
// name the new primary at once, while the old one stays a writable
// primary for several seconds until the sentinels reconfigure it. The
// go-redis path (its failover client closes connections to any other
// address when it learns of +switch-master) writes to the new primary
// within about a second; the lean path, which does not see
// +switch-master, dials again every second (wire.maxAge) and follows
// within about two (before that fix: 11 s of writes to the old primary,
// which its resync then discarded).
func TestSentinelFailoverFollowedOnBothPaths(t *testing.T) {
	t.Parallel()
	for _, lean := range []bool{false, true} {
		t.Run(fmt.Sprintf("lean=%v", lean), func(t *testing.T) {
			st := redistest.StartSentinelTB(t)
			opts := st.FailoverOptions()
			if !lean {
				opts.OnConnect = func(context.Context, *redis.Conn) error { return nil } // keeps go-redis
			}
			client := redis.NewFailoverClient(opts)
			t.Cleanup(func() { client.Close() })
			store := New(client, WithTimeout(time.Second), WithBatch(8, 2))
			t.Cleanup(func() { store.Close() })
			if (store.wire != nil) != lean {
				t.Fatal("wrong path")
			}
			res := make([]guard.CounterResult, 1)
			if _, err := store.Do(context.Background(), guard.OpCheck, 0, oneCounter("tg{f}"), res); err != nil {
				t.Fatal(err)
			}
			oldP, newP := st.Primary().Client(), st.Replica().Client()
			defer oldP.Close()
			defer newP.Close()
			sc := redis.NewClient(&redis.Options{Addr: st.SentinelAddrs()[0]})
			defer sc.Close()
			if err := sc.Do(context.Background(), "SENTINEL", "FAILOVER", st.MasterName()).Err(); err != nil {
				t.Fatal(err)
			}
			var promoted time.Time
			lost := 0
			pace := time.NewTicker(20 * time.Millisecond) // a steady trickle of checks
			defer pace.Stop()
			for i := 0; i < 600; i++ {
				name := fmt.Sprintf("tg{f%d}", i)
				_, err := store.Do(context.Background(), guard.OpCheck, 0, oneCounter(name), res)
				role, _ := newP.Do(context.Background(), "ROLE").Slice()
				if len(role) > 0 && role[0] == "master" && promoted.IsZero() {
					promoted = time.Now()
				}
				if err == nil && !promoted.IsZero() {
					if n, _ := newP.Exists(context.Background(), name).Result(); n == 1 {
						t.Logf("first write on the new primary %v after its promotion; %d admitted calls written elsewhere meanwhile", time.Since(promoted), lost)
						if time.Since(promoted) > 5*time.Second {
							t.Errorf("kept writing to the old primary for %v after the new one was promoted (%d decisions lost)", time.Since(promoted), lost)
						}
						return
					}
					lost++
				}
				<-pace.C
			}
			t.Fatal("never reached the new primary")
		})
	}
}
