package chaos

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testwait"
	"github.com/tollgate/tollgate/loadtest/internal/chaos/history"
)

func shProc(t *testing.T, rec *recorder, script, ready string) *proc {
	t.Helper()
	p := &proc{name: "child", path: "/bin/sh", args: []string{"-c", script}, env: os.Environ(),
		logPath: filepath.Join(t.TempDir(), "child.log"), ready: ready, rec: rec}
	t.Cleanup(func() { _ = p.stop(5 * time.Second); p.wait() })
	return p
}

func exits(rec *recorder) []history.Proc {
	var out []history.Proc
	for _, p := range rec.history().Procs {
		if p.Kind == history.ProcExit {
			out = append(out, p)
		}
	}
	return out
}

// procState is the state letter of /proc/<pid>/stat (T: stopped).
func procState(pid int) byte {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(b), ')')
	return b[i+2]
}

func TestProcLifecycle(t *testing.T) {
	rec := newRecorder(nil)
	p := shProc(t, rec, "echo ready; exec sleep 60", "ready")
	if err := p.start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := p.start(t.Context()); err == nil {
		t.Fatal("a second start of a running process succeeded")
	}
	pid := p.pid()
	if err := p.pause(); err != nil || procState(pid) != 'T' || !p.isPaused() {
		t.Fatalf("pause: %v, state %c", err, procState(pid))
	}
	if err := p.resume(); err != nil || p.isPaused() {
		t.Fatalf("resume: %v", err)
	}
	if err := p.kill(); err != nil || p.running() {
		t.Fatalf("kill: %v, running %v", err, p.running())
	}
	if err := p.start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := p.pause(); err != nil {
		t.Fatal(err)
	}
	// A graceful stop resumes a paused process first.
	if err := p.stop(5 * time.Second); err != nil || p.running() {
		t.Fatalf("stop: %v", err)
	}
	ex := exits(rec)
	if len(ex) != 2 || !ex[0].Planned || !ex[1].Planned {
		t.Fatalf("exits %+v, want two planned", ex)
	}
}

func TestProcUnplannedExitIsRecorded(t *testing.T) {
	rec := newRecorder(nil)
	p := shProc(t, rec, "echo ready; exit 3", "ready")
	if err := p.start(t.Context()); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 10*time.Second, func() error {
		if len(exits(rec)) == 0 {
			return os.ErrNotExist
		}
		return nil
	})
	ex := exits(rec)[0]
	if ex.Planned || !strings.Contains(ex.Detail, "exit status 3") {
		t.Fatalf("exit %+v, want unplanned, status 3", ex)
	}
}

func TestProcStartFailsWhenTheChildDiesBeforeItIsReady(t *testing.T) {
	rec := newRecorder(nil)
	p := shProc(t, rec, "exit 1", "ready")
	if err := p.start(t.Context()); err == nil || !strings.Contains(err.Error(), "before it was ready") {
		t.Fatalf("start: %v", err)
	}
}
