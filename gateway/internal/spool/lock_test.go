//go:build linux || darwin || dragonfly || freebsd || netbsd || openbsd

package spool_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/gateway/internal/spool"
	"github.com/tollgate/tollgate/internal/spawn/spawntest"
)

// lockHelperEnv makes the test binary act as another gateway process: it
// opens the spool in the directory the variable names, prints "locked
// <pid>" and holds the spool until its stdin closes.
const lockHelperEnv = "TOLLGATE_SPOOL_LOCK_HELPER"

func TestLockHelperProcess(t *testing.T) {
	d := os.Getenv(lockHelperEnv)
	if d == "" {
		t.Skip("helper process for TestLockedByAnotherProcess")
	}
	s, err := spool.Open(spool.OSFS{}, d, spool.Options{})
	if err != nil {
		fmt.Printf("error %v\n", err)
		return
	}
	defer s.Close()
	fmt.Printf("locked %d\n", os.Getpid())
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// startLockHolder starts a process holding the spool in d, and returns it
// with its stdin (closing it stops the process gracefully) and pid.
func startLockHolder(t *testing.T, d string) (*exec.Cmd, io.WriteCloser, int) {
	t.Helper()
	// GORACE: a race-enabled binary otherwise waits 1 s before exiting.
	cmd, stdin, stdout := spawntest.Self(t, []string{"-test.run=^TestLockHelperProcess$", "-test.count=1"},
		lockHelperEnv+"="+d, "GORACE=atexit_sleep_ms=0")
	line, err := bufio.NewReader(stdout).ReadString('\n')
	pid, perr := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "locked ")))
	if err != nil || perr != nil {
		t.Fatalf("helper printed %q: %v", line, err)
	}
	return cmd, stdin, pid
}

func TestLockedByAnotherProcess(t *testing.T) {
	t.Parallel()
	for _, stop := range []string{"graceful", "SIGKILL"} {
		t.Run(stop, func(t *testing.T) {
			t.Parallel()
			d := t.TempDir()
			cmd, stdin, pid := startLockHolder(t, d)

			_, err := spool.Open(spool.OSFS{}, d, spool.Options{})
			if !errors.Is(err, spool.ErrLocked) {
				t.Fatalf("open while another process holds the spool: %v, want ErrLocked", err)
			}
			if msg := err.Error(); !strings.Contains(msg, d) || !strings.Contains(msg, "pid "+strconv.Itoa(pid)) {
				t.Fatalf("%q does not name the directory and the holder's pid %d", msg, pid)
			}
			t.Logf("open while held: %v", err)

			if stop == "graceful" {
				_ = stdin.Close()
			} else {
				_ = cmd.Process.Kill()
			}
			_ = cmd.Wait()
			// The kernel released the flock with the process, even a
			// killed one: no stale lock to clean up.
			s, err := spool.Open(spool.OSFS{}, d, spool.Options{})
			if err != nil {
				t.Fatalf("open after the holder's %s exit: %v", stop, err)
			}
			_ = s.Close()
		})
	}
}
