package chaos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tollgate/tollgate/internal/spawn"
	"github.com/tollgate/tollgate/loadtest/internal/chaos/history"
)

// proc is one child process the harness runs, kills, pauses and restarts
// (a gateway, an aggregator, the broker, NATS): the same command and
// environment each life. Its exits are recorded; an exit the harness did
// not ask for is an unplanned one.
type proc struct {
	name    string
	path    string
	args    []string
	env     []string
	logPath string
	// ready, when set, is read from the child's stdout: the child is up
	// once it prints a line starting with it.
	ready string
	rec   *recorder

	mu       sync.Mutex
	life     *life // guarded by mu; nil before the first start
	planned  bool  // guarded by mu; the next exit is the harness's doing
	paused   bool  // guarded by mu
	starting bool  // guarded by mu; a start is under way
	wg       sync.WaitGroup
}

// life is one run of a proc.
type life struct {
	pid  int
	done chan struct{} // closed when it has exited
	err  error         // its exit, valid after done
}

func (l *life) exited() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// errNotRunning is returned by signals sent to a proc that is not running.
var errNotRunning = errors.New("chaos: process not running")

// start runs the proc and, with ready set, waits for its ready line
// (bounded by ctx). The process is started through spawn.Start, so that
// on Linux the kernel kills it (Pdeathsig) if the harness dies, and
// watched by a goroutine of the proc's that records its exit; wait with
// Wait.
func (p *proc) start(ctx context.Context) error {
	p.mu.Lock()
	if p.starting || (p.life != nil && !p.life.exited()) {
		p.mu.Unlock()
		return fmt.Errorf("chaos: start %s: already running", p.name)
	}
	p.starting = true
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.starting = false
		p.mu.Unlock()
	}()

	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("chaos: start %s: %w", p.name, err)
	}
	fmt.Fprintf(logf, "=== %s: start %s\n", time.Now().Format(time.RFC3339Nano), p.name)
	cmd := exec.Command(p.path, p.args...)
	cmd.Env = p.env
	cmd.Stderr = logf
	// The ready line comes through a pipe of our own: cmd.StdoutPipe's
	// would be closed by Wait, losing what a child that exited at once
	// wrote.
	var stdout, childOut *os.File
	if p.ready != "" {
		if stdout, childOut, err = os.Pipe(); err != nil {
			logf.Close()
			return fmt.Errorf("chaos: start %s: %w", p.name, err)
		}
		cmd.Stdout = childOut
	} else {
		cmd.Stdout = logf
	}
	// spawn.Start forks from a thread it keeps until the child exits, so
	// that the kernel kills the child if the harness dies.
	child, err := spawn.Start(cmd)
	if childOut != nil {
		childOut.Close() // the child has its own copy
	}
	if err != nil {
		if stdout != nil {
			stdout.Close()
		}
		logf.Close()
		return fmt.Errorf("chaos: start %s: %w", p.name, err)
	}
	l := &life{pid: cmd.Process.Pid, done: make(chan struct{})}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		<-child.Done()
		logf.Close()
		l.err = child.Err()
		p.exited(l) // recorded before anyone waiting sees the exit
		close(l.done)
	}()
	p.mu.Lock()
	p.life, p.planned, p.paused = l, false, false
	p.mu.Unlock()
	p.rec.proc(history.Proc{Name: p.name, Kind: history.ProcStart, Detail: fmt.Sprintf("pid %d", l.pid)})
	if stdout == nil {
		return nil
	}
	lines := make(chan string, 1)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer stdout.Close()
		sc := bufio.NewScanner(stdout)
		sent := false
		for sc.Scan() {
			if !sent && strings.HasPrefix(sc.Text(), p.ready) {
				lines <- sc.Text()
				sent = true
			}
		}
		if !sent {
			close(lines)
		}
	}()
	select {
	case _, ok := <-lines:
		if !ok {
			<-l.done
			return fmt.Errorf("chaos: start %s: exited before it was ready: %v (log %s)", p.name, l.err, p.logPath)
		}
		return nil
	case <-ctx.Done():
		_ = p.kill()
		return fmt.Errorf("chaos: start %s: %w", p.name, ctx.Err())
	}
}

// exited records the end of life l.
func (p *proc) exited(l *life) {
	p.mu.Lock()
	planned := p.planned && p.life == l
	p.mu.Unlock()
	detail := "exit status 0"
	if l.err != nil {
		detail = l.err.Error()
	}
	p.rec.proc(history.Proc{Name: p.name, Kind: history.ProcExit, Planned: planned, Detail: detail})
}

// current returns the running life, or nil.
func (p *proc) current() *life {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.life == nil || p.life.exited() {
		return nil
	}
	return p.life
}

// Pid is the running process's id, or 0.
func (p *proc) pid() int {
	if l := p.current(); l != nil {
		return l.pid
	}
	return 0
}

// running reports whether the process is alive (paused or not).
func (p *proc) running() bool { return p.current() != nil }

// signal sends sig, marking the exit it causes as planned when expectExit.
func (p *proc) signal(sig syscall.Signal, expectExit bool) (*life, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.life
	if l == nil || l.exited() {
		return nil, errNotRunning
	}
	if expectExit {
		p.planned = true
	}
	if err := syscall.Kill(l.pid, sig); err != nil {
		return nil, fmt.Errorf("chaos: signal %s: %w", p.name, err)
	}
	switch sig {
	case syscall.SIGSTOP:
		p.paused = true
	case syscall.SIGCONT:
		p.paused = false
	}
	return l, nil
}

// kill SIGKILLs the process and waits until it has exited.
func (p *proc) kill() error {
	l, err := p.signal(syscall.SIGKILL, true)
	if err != nil {
		return err
	}
	<-l.done
	return nil
}

// pause SIGSTOPs the process and waits until the kernel has stopped it.
func (p *proc) pause() error {
	l, err := p.signal(syscall.SIGSTOP, false)
	if err != nil {
		return err
	}
	waitStopped(l.pid, l.done)
	return nil
}

// resume SIGCONTs a paused process.
func (p *proc) resume() error {
	_, err := p.signal(syscall.SIGCONT, false)
	return err
}

// isStarting reports whether a start is under way.
func (p *proc) isStarting() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.starting
}

// isPaused reports whether the harness paused the process.
func (p *proc) isPaused() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.paused
}

// stop ends the process gracefully: SIGCONT if paused, SIGTERM, then
// SIGKILL after grace; it waits for the exit. A process not running is
// left alone.
func (p *proc) stop(grace time.Duration) error {
	if p.isPaused() {
		_ = p.resume()
	}
	l, err := p.signal(syscall.SIGTERM, true)
	if errors.Is(err, errNotRunning) {
		return nil
	}
	if err != nil {
		return err
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-l.done:
		return nil
	case <-t.C:
		if err := p.kill(); err != nil && !errors.Is(err, errNotRunning) {
			return err
		}
		return nil // exited by itself, or now
	}
}

// wait waits for the proc's goroutines (after its last exit).
func (p *proc) wait() { p.wg.Wait() }

// waitStopped polls /proc/<pid>/stat until the process is in the stopped
// state (T), it exits, or a second passes.
func waitStopped(pid int, done <-chan struct{}) {
	deadline := time.Now().Add(time.Second)
	path := fmt.Sprintf("/proc/%d/stat", pid)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(path)
		if err != nil {
			return
		}
		// pid (comm) S ...: the state follows the last ')'.
		if i := strings.LastIndexByte(string(b), ')'); i >= 0 && i+2 < len(b) && b[i+2] == 'T' {
			return
		}
		select {
		case <-done:
			return
		case <-time.After(time.Millisecond):
		}
	}
}
