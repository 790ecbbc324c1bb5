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
)

// Process is a started child. Its goroutine, which owns cmd.Wait, ends
// when the child exits; wait for it with Done.
type Process struct {
	// Cmd is the command Start started.
	Cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Start sets cmd's SysProcAttr (see SysProcAttr) and starts it, waiting
// for it on a goroutine locked to its OS thread for as long as it runs.
// The error is cmd.Start's.
func Start(cmd *exec.Cmd) (*Process, error) {
	cmd.SysProcAttr = SysProcAttr()
	p := &Process{Cmd: cmd, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		p.err = cmd.Wait()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return p, nil
}

// Done is closed once the child has exited and been waited for.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the child has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err returns cmd.Wait's result once Done is closed, nil before.
func (p *Process) Err() error {
	select {
	case <-p.done:
		return p.err
	default:
		return nil
	}
}
