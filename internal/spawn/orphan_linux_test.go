package spawn_test

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/spawn"
	"github.com/tollgate/tollgate/internal/testwait"
)

// helperEnv makes the test binary act as a process that spawns a long
// sleep, prints its pid and waits for its stdin to close.
const helperEnv = "TOLLGATE_SPAWN_ORPHAN_HELPER"

func TestOrphanHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		t.Skip("helper process for TestNoOrphanWhenParentDies")
	}
	p, err := spawn.Start(exec.Command("sleep", "300"))
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	defer func() {
		_ = p.Cmd.Process.Kill()
		<-p.Done()
	}()
	fmt.Printf("pid %d\n", p.Cmd.Process.Pid)
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// TestNoOrphanWhenParentDies: a child outlives its spawning goroutine's
// caller, but not the process that spawned it (SIGKILLed here).
func TestNoOrphanWhenParentDies(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^TestOrphanHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("helper printed %q: %v", line, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "pid ")))
	if err != nil || !alive(pid) {
		t.Fatalf("helper printed %q; alive %v", line, alive(pid))
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	testwait.Eventually(t, 5*time.Second, func() error {
		if alive(pid) {
			return fmt.Errorf("child %d outlived the process that spawned it", pid)
		}
		return nil
	})
}

// alive reports whether pid names a live process that is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i < 0 || i+2 >= len(b) || b[i+2] != 'Z'
}
