package gateway

import "testing"

// TestRedisMonitorPassive: the Redis monitor skips its PING exactly when
// calls were answered since its last check and none failed: readings of
// the store's outcomes in turn, and whether each check pings.
func TestRedisMonitorPassive(t *testing.T) {
	t.Parallel()
	type reading struct {
		answered, failed uint64
		ping             bool
	}
	for _, tc := range []struct {
		name     string
		readings []reading
	}{
		{"idle: every check pings", []reading{{0, 0, true}, {0, 0, true}, {0, 0, true}}},
		{"deciding: no PING", []reading{{5, 0, false}, {9, 0, false}, {200, 0, false}}},
		{"traffic stops: the next check pings", []reading{{5, 0, false}, {5, 0, true}, {5, 0, true}, {6, 0, false}}},
		{"a failure among answers pings", []reading{{5, 0, false}, {9, 1, true}, {12, 1, false}}},
		{"only failures ping", []reading{{0, 3, true}, {0, 7, true}, {4, 7, false}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var m redisMonitor
			m.passive(0, 0) // at start
			for i, r := range tc.readings {
				if ping := !m.passive(r.answered, r.failed); ping != r.ping {
					t.Fatalf("check %d (%d answered, %d failed): ping %v, want %v", i, r.answered, r.failed, ping, r.ping)
				}
			}
		})
	}
}
