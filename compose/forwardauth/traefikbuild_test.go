package forwardauth_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Debian ships no Traefik, and Traefik's go.mod has replace directives, so
// `go install …@version` refuses it. The tests build ./cmd/traefik from a
// writable copy of the module's source (the module cache is read-only),
// fetched through the Go module proxy like any dependency, and keep the
// binary under the user's cache directory, keyed by the version and the
// recipe below, so only the first run pays for the build.

// traefikBuild lets the tests build Traefik when it is not in the cache
// yet (make traefik). The build takes minutes (more on a fresh machine,
// which downloads Traefik's dependencies too), so make test does not pay
// for it: without the flag and the cached binary, TestTraefik is skipped.
var traefikBuild = flag.Bool("traefik.build", false, "build Traefik from the Go module proxy when it is not in the cache")

// traefikModule is the Traefik the tests run.
const (
	traefikModule  = "github.com/traefik/traefik/v3"
	traefikVersion = "v3.7.13"
)

// traefikPatch is a change the build makes to its copy of Traefik's
// source, none of it in the code paths the tests run.
type traefikPatch struct {
	why   string
	apply func(src string) error
}

// traefikPatches make v3.7.13 build from the module proxy alone:
//
//   - pkg/config/dynamic/ext is a nested module (github.com/traefik/traefik/dynamic/ext,
//     replaced by the directory), so the module's zip leaves it out; it
//     holds two empty extension structs and a conversion between them.
//   - the fork of go-http-auth that go.mod pins (basic and digest auth) is
//     not on every module proxy; the fork's 2020 version, which earlier
//     Traefik releases used, has the same API.
//   - the ACME DNS-01 providers import cloud SDKs some proxies do not
//     serve; the build answers every DNS provider name with an error.
var traefikPatches = []traefikPatch{
	{"recreate the nested module pkg/config/dynamic/ext", func(src string) error {
		dir := filepath.Join(src, "pkg", "config", "dynamic", "ext")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module github.com/traefik/traefik/dynamic/ext\n\ngo 1.24.0\n"), 0o644); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, "ext.go"), []byte(`// Package ext: Traefik's extension points of its dynamic configuration, empty in its open-source build.
package ext

type HTTP struct{}

type Router struct{}

type RouterIng struct{}

func (RouterIng) ToRouter() Router { return Router{} }
`), 0o644)
	}},
	{"use go-http-auth's fork at v0.4.1-0.20200324110947-a37a7636d23e", func(src string) error {
		return editFile(filepath.Join(src, "go.mod"),
			"github.com/abbot/go-http-auth => github.com/containous/go-http-auth v0.4.1-0.20260804094822-b975dcaa8c48",
			"github.com/abbot/go-http-auth => github.com/containous/go-http-auth v0.4.1-0.20200324110947-a37a7636d23e")
	}},
	{"leave the ACME DNS-01 providers out", func(src string) error {
		p := filepath.Join(src, "pkg", "provider", "acme", "provider.go")
		if err := editFile(p, "\t\"github.com/go-acme/lego/v5/providers/dns\"\n", ""); err != nil {
			return err
		}
		if err := editFile(p, "dns.NewDNSChallengeProviderByName(", "dnsProviderNotBuilt("); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(filepath.Dir(p), "tollgate_nodns.go"), []byte(`package acme

import (
	"fmt"

	"github.com/go-acme/lego/v5/challenge"
)

func dnsProviderNotBuilt(name string) (challenge.Provider, error) {
	return nil, fmt.Errorf("DNS challenge provider %q: not in this build (Tollgate's test build of Traefik)", name)
}
`), 0o644)
	}},
}

// editFile replaces old, which must occur exactly once, with new in path.
func editFile(path, old, new string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if n := bytes.Count(b, []byte(old)); n != 1 {
		return fmt.Errorf("%s holds %q %d times, want once: the patch does not fit this Traefik", path, old, n)
	}
	return os.WriteFile(path, bytes.Replace(b, []byte(old), []byte(new), 1), 0o644)
}

var (
	traefikOnce sync.Once
	traefikBin  string
	traefikErr  error
)

// traefikBinary returns the path of a Traefik binary built from source,
// building it on first use (minutes; then cached). When it cannot be built
// the test is skipped saying why — except in CI (CI=true), where it fails:
// CI must run it.
func traefikBinary(t *testing.T) string {
	t.Helper()
	traefikOnce.Do(func() {
		start := time.Now()
		var built bool
		traefikBin, built, traefikErr = buildTraefik(*traefikBuild)
		if built {
			t.Logf("built Traefik %s in %v: %s", traefikVersion, time.Since(start).Round(time.Second), traefikBin)
		}
	})
	if errors.Is(traefikErr, errTraefikNotBuilt) {
		t.Skipf("SKIPPED: Traefik %s is not built here, so the shipped configs/traefik is not tested: run make traefik once (it builds Traefik into the user's cache directory, then runs this test)", traefikVersion)
	}
	if traefikErr != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("Traefik %s could not be built, and CI must run this test: %v", traefikVersion, traefikErr)
		}
		t.Skipf("SKIPPED: Traefik %s could not be built from the Go module proxy here, so the shipped configs/traefik is not tested: %v", traefikVersion, traefikErr)
	}
	return traefikBin
}

// traefikCacheKey names the build: the version and everything the recipe
// does, so that a changed recipe builds anew.
func traefikCacheKey() string {
	h := sha256.New()
	fmt.Fprintln(h, traefikModule, traefikVersion)
	for _, p := range traefikPatches {
		fmt.Fprintln(h, p.why)
	}
	return traefikVersion + "-" + hex.EncodeToString(h.Sum(nil))[:12]
}

// errTraefikNotBuilt: Traefik is not in the cache, and building was not
// asked for.
var errTraefikNotBuilt = errors.New("forwardauth: Traefik is not built")

// buildTraefik returns the cached binary, or, when build, builds it: go
// mod download, a writable copy of the source, the patches, go build
// ./cmd/traefik into the cache. built reports whether it built.
func buildTraefik(build bool) (bin string, built bool, err error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", false, fmt.Errorf("no cache directory: %w", err)
	}
	dir := filepath.Join(cache, "tollgate", "traefik", traefikCacheKey())
	bin = filepath.Join(dir, "traefik")
	if _, err := os.Stat(bin); err == nil {
		return bin, false, nil
	}
	if !build {
		return "", false, errTraefikNotBuilt
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", false, fmt.Errorf("the go command: %w", err)
	}
	work, err := os.MkdirTemp("", "tollgate-traefik-build-")
	if err != nil {
		return "", false, err
	}
	defer os.RemoveAll(work)
	// The child go commands: module mode, no workspace, and the module
	// graph free to change in the copy (the patches change go.mod).
	env := append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "GO111MODULE=on")
	run := func(dir string, args ...string) ([]byte, error) {
		cmd := exec.Command(goBin, args...)
		cmd.Dir, cmd.Env = dir, env
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			msg := stderr.String()
			if len(msg) > 4000 {
				msg = msg[:2000] + "\n…\n" + msg[len(msg)-2000:]
			}
			return nil, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, msg)
		}
		return out, nil
	}
	out, err := run(work, "mod", "download", "-json", traefikModule+"@"+traefikVersion)
	if err != nil {
		return "", false, err
	}
	var mod struct{ Dir, Error string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		return "", false, fmt.Errorf("go mod download %s@%s: %v %s", traefikModule, traefikVersion, err, mod.Error)
	}
	src := filepath.Join(work, "src")
	if err := copyTree(mod.Dir, src); err != nil {
		return "", false, fmt.Errorf("copy Traefik's source: %w", err)
	}
	for _, p := range traefikPatches {
		if err := p.apply(src); err != nil {
			return "", false, fmt.Errorf("%s: %w", p.why, err)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", false, err
	}
	tmp := filepath.Join(dir, fmt.Sprintf(".traefik-%d", os.Getpid()))
	defer os.Remove(tmp)
	if _, err := run(src, "build", "-ldflags=-s -w", "-o", tmp, "./cmd/traefik"); err != nil {
		return "", false, err
	}
	// Another test process may have finished first: either binary is the
	// same build.
	if err := os.Rename(tmp, bin); err != nil {
		return "", false, err
	}
	return bin, true, nil
}

// copyTree copies the regular files and directories under from to to,
// writable by the owner.
func copyTree(from, to string) error {
	return filepath.WalkDir(from, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(from, p)
		if err != nil {
			return err
		}
		target := filepath.Join(to, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(target, 0o755)
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(target, b, 0o644)
		default:
			return errors.New(p + ": neither a file nor a directory")
		}
	})
}
