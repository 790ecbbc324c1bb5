// Package spawntest checks that a child a test process starts dies with
// it (see package spawn): the test binary runs itself as a helper that
// starts the child and prints its pid, is SIGKILLed, and the child must
// be gone within seconds. Linux only (/proc and Pdeathsig). Self, which
// starts the test binary again as a helper process, serves any test.
package spawntest

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

	"github.com/tollgate/tollgate/internal/testwait"
)

// Helper is the body of the helper test named in NoOrphan: unless the
// variable env is "1" it skips; else it calls start, which starts the
// child and returns its pid, prints the pid and waits until its parent
// closes stdin (or kills it).
func Helper(t *testing.T, env string, start func(t *testing.T) int) {
	if os.Getenv(env) != "1" {
		t.Skip("helper process for a no-orphan test")
	}
	fmt.Printf("pid %d\n", start(t))
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// NoOrphan runs the test binary's test helperTest (which calls Helper)
// with env=1 as a child, SIGKILLs it once it has printed its child's pid,
// and fails unless that grandchild is gone within 5s. It returns how long
// that took.
func NoOrphan(t *testing.T, env, helperTest string) time.Duration {
	t.Helper()
	cmd, _, stdout := Self(t, []string{"-test.run=^" + helperTest + "$", "-test.count=1"}, env+"=1")
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("helper printed %q: %v", line, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "pid ")))
	if err != nil || !Alive(pid) {
		t.Fatalf("helper printed %q; alive %v", line, Alive(pid))
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	return testwait.Eventually(t, 5*time.Second, func() error {
		if Alive(pid) {
			return fmt.Errorf("process %d outlived the process that started it", pid)
		}
		return nil
	})
}

// Self starts the test binary again as a helper process, with args and
// with env added to its environment, its stderr the test's, and returns
// it with pipes to its stdin and from its stdout. When the test ends the
// process's stdin is closed and it is killed and reaped; a test may stop
// it before (close stdin, or kill it, and Wait).
func Self(t testing.TB, args []string, env ...string) (cmd *exec.Cmd, stdin io.WriteCloser, stdout io.ReadCloser) {
	t.Helper()
	cmd = exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err = cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd, stdin, stdout
}

// Alive reports whether pid names a live process that is not a zombie
// (Linux).
func Alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i < 0 || i+2 >= len(b) || b[i+2] != 'Z'
}
