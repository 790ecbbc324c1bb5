// Package spawn starts child processes that die with the Go process that
// started them: the servers of compose/redisserver, the real nginx,
// Caddy and Prometheus of the deployment tests, and the chaos soak's
// fleet. On Linux the kernel sends
// the child SIGKILL when its parent dies (Pdeathsig), so a crashed or
// timed-out test binary leaves no orphan behind. Linux sends that signal
// when the OS thread that forked the child exits, not the process, so
// Start forks from a goroutine locked to its thread and keeps it until the
// child exits: every running child holds one OS thread. Outside Linux
// there is no such signal, and a Go process that crashes leaves its
// children behind.
package spawn

import (
	"os/exec"
	"runtime"

	"github.com/tollgate/tollgate/internal/service"
)

// Process is a started child. Its goroutine (a service.Task), which owns
// cmd.Wait, ends when the child exits; wait for it with Done.
type Process struct {
	// Cmd is the command Start started.
	Cmd  *exec.Cmd
	task *service.Task
}

// Start sets cmd's SysProcAttr (see SysProcAttr) and starts it, waiting
// for it on a goroutine locked to its OS thread for as long as it runs.
// The error is cmd.Start's.
func Start(cmd *exec.Cmd) (*Process, error) {
	cmd.SysProcAttr = SysProcAttr()
	started := make(chan error, 1)
	task := service.Go(func() error {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return nil
		}
		started <- nil
		return cmd.Wait()
	})
	if err := <-started; err != nil {
		return nil, err
	}
	return &Process{Cmd: cmd, task: task}, nil
}

// Done is closed once the child has exited and been waited for.
func (p *Process) Done() <-chan struct{} { return p.task.Done() }

// Exited reports whether the child has exited.
func (p *Process) Exited() bool { return p.task.Exited() }

// Err returns cmd.Wait's result once Done is closed, nil before.
func (p *Process) Err() error {
	if !p.task.Exited() {
		return nil
	}
	return p.task.Wait()
}
