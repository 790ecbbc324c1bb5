package redisserver_test

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

	"github.com/tollgate/tollgate/compose/redisserver"
	"github.com/tollgate/tollgate/internal/testwait"
)

// helperEnv makes the test binary act as a process that starts a server,
// prints its pid and waits for its stdin to close.
const helperEnv = "TOLLGATE_REDISSERVER_ORPHAN_HELPER"

func TestOrphanHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		t.Skip("helper process for TestNoOrphanWhenParentDies")
	}
	s, err := redisserver.Start(t.Context())
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	defer s.Stop()
	fmt.Printf("pid %d\n", s.Pid())
	_, _ = io.Copy(io.Discard, os.Stdin)
}

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
	if err != nil || !processAlive(pid) {
		t.Fatalf("helper printed %q; alive %v", line, processAlive(pid))
	}

	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	took := testwait.Eventually(t, 5*time.Second, func() error {
		if processAlive(pid) {
			return fmt.Errorf("redis-server %d outlived the process that started it", pid)
		}
		return nil
	})
	t.Logf("redis-server gone %v after its parent was SIGKILLed", took)
}
