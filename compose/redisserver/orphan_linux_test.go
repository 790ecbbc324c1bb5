package redisserver_test

import (
	"testing"

	"github.com/tollgate/tollgate/compose/redisserver"
	"github.com/tollgate/tollgate/internal/spawn/spawntest"
)

// helperEnv makes the test binary act as a process that starts a server,
// prints its pid and waits for its stdin to close.
const helperEnv = "TOLLGATE_REDISSERVER_ORPHAN_HELPER"

func TestOrphanHelperProcess(t *testing.T) {
	spawntest.Helper(t, helperEnv, func(t *testing.T) int {
		s, err := redisserver.Start(t.Context())
		if err != nil {
			t.Fatalf("start: %v", err)
		}
		t.Cleanup(func() { _ = s.Stop() })
		return s.Pid()
	})
}

func TestNoOrphanWhenParentDies(t *testing.T) {
	t.Parallel()
	took := spawntest.NoOrphan(t, helperEnv, "TestOrphanHelperProcess")
	t.Logf("redis-server gone %v after its parent was SIGKILLed", took)
}
