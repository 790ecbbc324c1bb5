package spawn_test

import (
	"os/exec"
	"testing"

	"github.com/tollgate/tollgate/internal/spawn"
	"github.com/tollgate/tollgate/internal/spawn/spawntest"
)

// helperEnv makes the test binary act as a process that spawns a long
// sleep, prints its pid and waits for its stdin to close.
const helperEnv = "TOLLGATE_SPAWN_ORPHAN_HELPER"

func TestOrphanHelperProcess(t *testing.T) {
	spawntest.Helper(t, helperEnv, func(t *testing.T) int {
		p, err := spawn.Start(exec.Command("sleep", "300"))
		if err != nil {
			t.Fatalf("start: %v", err)
		}
		t.Cleanup(func() {
			_ = p.Cmd.Process.Kill()
			<-p.Done()
		})
		return p.Cmd.Process.Pid
	})
}

// TestNoOrphanWhenParentDies: a child outlives its spawning goroutine's
// caller, but not the process that spawned it (SIGKILLed here).
func TestNoOrphanWhenParentDies(t *testing.T) {
	t.Parallel()
	spawntest.NoOrphan(t, helperEnv, "TestOrphanHelperProcess")
}
