// Package chromium opens a page in Debian's headless Chromium for tests
// that check what a person would see: [Load] returns the page's DOM after
// Chromium parsed it and a screenshot of its viewport.
//
// Chromium comes from Debian's package (make deps installs it; see
// scripts/install-deps.sh). A test that needs it fails, never skips, when it
// is missing, and says how to install it. $TOLLGATE_CHROMIUM names another
// binary.
//
// Chromium runs with a new empty profile, no sandbox (tests run as root in
// CI), no GPU, and its background networking, component updates and sync
// off, so it contacts nothing: the machines that run the tests have no
// network.
package chromium

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"image/png"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testwait"
)

// InstallCommand installs Chromium on Debian, as root.
const InstallCommand = "apt-get update && apt-get install -y chromium"

// timeout bounds one Chromium run: a start takes 1–2 s on a busy 2-core
// machine.
const timeout = 60 * time.Second

// Path returns the Chromium binary, $TOLLGATE_CHROMIUM or chromium on PATH.
// Without one it fails tb with the command that installs it.
func Path(tb testing.TB) string {
	tb.Helper()
	name := "chromium"
	if p := os.Getenv("TOLLGATE_CHROMIUM"); p != "" {
		name = p
	}
	p, err := exec.LookPath(name)
	if err != nil {
		tb.Fatalf("chromium not found (%v): run `make deps` (scripts/install-deps.sh), or as root: %s", err, InstallCommand)
	}
	return p
}

// Page is what Chromium made of a page.
type Page struct {
	// DOM is the document serialized after loading (--dump-dom).
	DOM string
	// Screenshot is the viewport, one pixel per CSS pixel.
	Screenshot image.Image
}

// Load opens the file at path with a viewport of width × height CSS
// pixels and returns its DOM and a screenshot. It fails tb when Chromium
// is missing, fails or does not finish within a minute. Load returns once
// every process Chromium started has exited.
func Load(tb testing.TB, path string, width, height int) Page {
	tb.Helper()
	bin := Path(tb)
	abs, err := filepath.Abs(path)
	if err != nil {
		tb.Fatalf("chromium: %v", err)
	}
	dir := tb.TempDir()
	shot := filepath.Join(dir, "screenshot.png")
	args := []string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--hide-scrollbars",
		"--user-data-dir=" + filepath.Join(dir, "profile"),
		fmt.Sprintf("--window-size=%d,%d", width, height),
		"--screenshot=" + shot,
		"--dump-dom",
		(&url.URL{Scheme: "file", Path: abs}).String(),
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	// Chromium's own processes (zygote, renderer, crash handler) share
	// its process group, which is waited for below.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	if cmd.Process != nil {
		waitGroup(tb, cmd.Process.Pid)
	}
	if runErr != nil {
		tb.Fatalf("chromium %s: %v\n%s", strings.Join(args, " "), runErr, tail(stderr.String(), 2000))
	}
	f, err := os.Open(shot)
	if err != nil {
		tb.Fatalf("chromium wrote no screenshot: %v\n%s", err, tail(stderr.String(), 2000))
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		tb.Fatalf("chromium screenshot: %v", err)
	}
	return Page{DOM: stdout.String(), Screenshot: img}
}

// waitGroup waits until no live process is left in group pgid, and kills
// the group if some linger for seconds. Zombies, which only their new
// parent can reap, do not count.
func waitGroup(tb testing.TB, pgid int) {
	tb.Helper()
	gone := func() error {
		if n := groupLive(pgid); n > 0 {
			return fmt.Errorf("%d of chromium's processes (group %d) still run", n, pgid)
		}
		return nil
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); <-time.After(20 * time.Millisecond) {
		if gone() == nil {
			return
		}
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	testwait.Eventually(tb, 5*time.Second, gone)
}

// groupLive counts the processes of group pgid that are not zombies, from
// /proc/<pid>/stat.
func groupLive(pgid int) int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid pgrp …; comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 3 || f[0] == "Z" {
			continue
		}
		if g, err := strconv.Atoi(f[2]); err == nil && g == pgid {
			n++
		}
	}
	return n
}

// tail returns the end of s, at most n bytes.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
