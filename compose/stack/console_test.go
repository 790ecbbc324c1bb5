package stack_test

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tollgate/tollgate/compose/redisserver"
	"github.com/tollgate/tollgate/compose/stack"
	"github.com/tollgate/tollgate/internal/chromium"
	"github.com/tollgate/tollgate/internal/testwait"
)

var screenshots = flag.Bool("console-screenshots", false, "write the console's screenshots to docs/console/ (go test ./compose/stack -run TestConsoleJourneys -console-screenshots)")

// screenshotDir is where -console-screenshots writes, from this package.
const screenshotDir = "../../docs/console"

// page drives one browser tab.
type page struct {
	t   *testing.T
	ctx context.Context
}

// run runs actions, failing the test after 30 s.
func (p *page) run(what string, actions ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		p.t.Fatalf("%s: %v", what, err)
	}
}

// eval returns a JavaScript expression's value as a string.
func (p *page) eval(expr string) (string, error) {
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer cancel()
	return chromedp.Run(ctx, chromedp.Evaluate[string](`String(`+expr+`)`))
}

// exec runs a JavaScript statement.
func (p *page) exec(what, js string) {
	p.t.Helper()
	if _, err := p.eval(js); err != nil {
		p.t.Fatalf("%s: %v", what, err)
	}
}

// text returns the text of the first element sel selects ("" without one).
func (p *page) text(sel string) string {
	s, _ := p.eval(`(document.querySelector(` + strconv.Quote(sel) + `) || {}).textContent || ""`)
	return s
}

// waitText waits until sel's text holds want.
func (p *page) waitText(sel, want string) {
	p.t.Helper()
	testwait.Eventually(p.t, 30*time.Second, func() error {
		if got := p.text(sel); !strings.Contains(got, want) {
			return fmt.Errorf("%s says %q, want %q in it", sel, got, want)
		}
		return nil
	})
}

// open goes to the console page name (its hash, as the navigation links
// do) and waits for its title.
func (p *page) open(name, title string) {
	p.t.Helper()
	p.exec("open "+name, `location.hash = `+strconv.Quote(name))
	p.waitText("#page-title", title)
}

// shot writes a screenshot of the viewport to docs/console/name.png with
// -console-screenshots.
func (p *page) shot(name string) {
	p.t.Helper()
	if !*screenshots {
		return
	}
	ctx, cancel := context.WithTimeout(p.ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		p.t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.MkdirAll(screenshotDir, 0o755); err != nil {
		p.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(screenshotDir, name+".png"), png, 0o644); err != nil {
		p.t.Fatal(err)
	}
}

// status sends one request through the stack's proxy with key and
// returns its status.
func status(t *testing.T, r *running, key string) int {
	resp, _ := get(t, "http://"+r.addrs.Proxy+"/v1/users/42", key)
	return resp.StatusCode
}

// TestConsoleJourneys walks the console in headless Chromium over a live
// stack (gateway, aggregator, redis-server, NATS, kfake): sign in with
// the banner's one-time link, see the overview move under load, raise a
// limit in the rules editor and see the gateway enforce it, block a key
// and see it refused, lift a penalty the ladder put on a key, read the
// audit entries, and sign in by typing the viewer token, which can change
// nothing. One Chromium serves every journey.
func TestConsoleJourneys(t *testing.T) {
	if _, err := redisserver.LookPath(); err != nil {
		t.Fatalf("%v (make deps installs it)", err)
	}
	bin := chromium.Path(t)
	cfg := testConfig(stack.RedisServer)
	// A ladder that fires on a few requests: 20 requests in 10 s, half of
	// them rejected.
	cfg.Penalty.Window = 10 * time.Second
	cfg.Penalty.RejectionMinRequests = 20
	cfg.Penalty.RejectionRatio = 0.5
	cfg.Penalty.Detectors = []string{"sustained_rejection"}
	r := start(t, cfg)
	defer r.stop(t)
	banner := r.banner.String()
	link := bannerValue(t, banner, "console")
	viewerToken := bannerValue(t, banner, "viewer token")

	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin), chromedp.NoSandbox, chromedp.Headless, chromedp.DisableGPU, chromedp.WindowSize(1280, 800),
		chromedp.UserDataDir(t.TempDir()), chromedp.Flag("disable-quic", true))...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	p := &page{t: t, ctx: bctx}
	// The first run starts Chromium, on the browser's own context (a
	// timeout on it would stop the browser).
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("start chromium %s: %v", bin, err)
	}

	// Sign in with the banner's link: the code is exchanged once and
	// leaves the address bar.
	p.run("open the banner's link", chromedp.Navigate(link))
	p.waitText("#page-title", "Overview")
	p.waitText("#who", "admin")
	if loc, _ := p.eval(`location.href`); strings.Contains(loc, "code=") {
		t.Errorf("the one-time code stays in the address bar: %s", loc)
	}
	if cookie, _ := p.eval(`document.cookie`); strings.Contains(cookie, "tollgate_session") {
		t.Errorf("the session cookie is readable from JavaScript: %q", cookie)
	}

	// The overview moves under load.
	decisions := func() int {
		s := strings.ReplaceAll(p.text("#m-decisions .value"), ",", "")
		n, _ := strconv.Atoi(s)
		return n
	}
	before := decisions()
	for range 12 {
		status(t, r, "sk_prod_acme_1")
	}
	testwait.Eventually(t, 30*time.Second, func() error {
		if n := decisions(); n < before+12 {
			return fmt.Errorf("overview shows %d decisions, want at least %d", n, before+12)
		}
		return nil
	})
	// The stack's gateway announces itself, on the active rules version.
	p.waitText("#ov-gateways", "local")
	p.waitText("#ov-gateways", "✓ current")
	p.waitText("#m-gateways .value", "1")
	p.shot("overview")

	// A penalty: hammer a free key until the ladder climbs, then lift it
	// from the penalties page.
	for range 30 {
		status(t, r, "sk_free_hammer")
	}
	testwait.Eventually(t, 30*time.Second, func() error {
		if n := p.text("#m-penalties .value"); !strings.Contains(n, "reduced 1 · cooldown 0 · blocked 0") {
			return fmt.Errorf("penalty levels %q, want one key at level 1", n)
		}
		return nil
	})
	// A key configured without a tenant is its own tenant: named as such,
	// not by its key_id.
	p.waitText("#ov", "no tenant (key sk_")
	p.run("follow the penalised key", chromedp.Click(chromedp.CSS(`#ov a[href^="#penalties"]`)))
	p.waitText("#page-title", "Penalties")
	p.waitText("#p-level .value", "1 reduced limit")
	if got := p.text("#p-level .value"); got != "1 reduced limit" {
		t.Errorf("the penalised key's level reads %q, want %q", got, "1 reduced limit")
	}
	p.waitText("#p-list", "no tenant (key sk_")
	p.shot("penalties")
	p.run("lift", chromedp.Click(chromedp.CSS("#p-lift")))
	p.waitText("#p-note", "Lifted")
	p.waitText("#p-level .value", "0")

	// Raise a limit in the editor: sk_free_demo spends its 5, is refused,
	// then passes once the editor's version is saved.
	for i := range 6 {
		if got, want := status(t, r, "sk_free_demo"), map[bool]int{true: 429, false: 200}[i == 5]; got != want {
			t.Fatalf("sk_free_demo request %d: %d, want %d", i+1, got, want)
		}
	}
	p.open("rules", "Rules")
	p.waitText("#r-info", "Running version")
	p.exec("edit", `(() => { const e = document.getElementById("r-editor");
		e.value = e.value.replace("capacity: 5 ", "capacity: 50 "); })()`)
	p.run("validate", chromedp.Click(chromedp.CSS("#r-validate")))
	p.waitText("#r-out", "Valid")
	p.run("diff", chromedp.Click(chromedp.CSS("#r-diff")))
	p.waitText("#r-diff-out", "+ ")
	p.shot("rules")
	p.run("save", chromedp.Click(chromedp.CSS("#r-save")))
	p.waitText("#r-out", "Saved as version")
	saved := strings.TrimSuffix(strings.Fields(strings.SplitN(p.text("#r-out"), "Saved as version ", 2)[1])[0], ":")
	testwait.Eventually(t, 30*time.Second, func() error {
		if got := status(t, r, "sk_free_demo"); got != http.StatusOK {
			return fmt.Errorf("sk_free_demo after the raise: %d, want 200", got)
		}
		return nil
	})
	// The overview shows the gateway on the version just saved.
	p.open("overview", "Overview")
	p.waitText("#ov-gateways", "v"+saved+" ✓ current")
	p.exec("scroll to the gateways", `document.getElementById("ov-gateways").scrollIntoView()`)
	p.shot("gateways")

	// Block a key from the lists page: every gateway refuses it.
	if got := status(t, r, "sk_prod_acme_2"); got != http.StatusOK {
		t.Fatalf("sk_prod_acme_2 before the block: %d", got)
	}
	p.open("lists", "Blocklist")
	p.run("fill the block", chromedp.SetValue(chromedp.CSS("#l-list"), "blocklist"),
		chromedp.SendKeys(chromedp.CSS("#l-key"), "sk_prod_acme_2"), chromedp.SendKeys(chromedp.CSS("#l-ttl"), "10m"),
		chromedp.SendKeys(chromedp.CSS("#l-reason"), "console journey"), chromedp.Click(chromedp.CSS("#l-put")))
	p.waitText("#l-out", "Done")
	testwait.Eventually(t, 30*time.Second, func() error {
		if got := status(t, r, "sk_prod_acme_2"); got != http.StatusForbidden {
			return fmt.Errorf("sk_prod_acme_2 after the block: %d, want 403", got)
		}
		return nil
	})
	p.run("look it up", chromedp.Click(chromedp.CSS("#l-look")))
	p.waitText("#l-entry", "console journey")
	p.shot("lists")

	// The key lookup shows the raised limit.
	p.open("keys?key=sk_free_demo&endpoint=/v1/users/42", "Key lookup")
	p.waitText("#k-out", "free-default")
	p.waitText("#k-out", "no tenant (key sk_")
	p.shot("keys")
	p.run("grant", chromedp.SendKeys(chromedp.CSS("#k-tokens"), "3"), chromedp.Click(chromedp.CSS("#k-grant")))
	p.waitText("#k-note", "Granted 3")

	// The audit log holds the console's changes, by actor.
	p.open("audit", "Audit log")
	p.run("search", chromedp.SendKeys(chromedp.CSS("#a-text"), "console journey"))
	p.waitText("#a-out", "console (admin)")
	p.waitText("#a-out", "blocklist")
	p.shot("audit")

	// Roll the rules back to version 1 from the versions list: the burst
	// of 5 is back, and sk_free_demo, which spent more, is refused.
	p.open("rules", "Rules")
	p.waitText("#r-versions", "Roll back to 1")
	p.exec("accept the confirmation", `window.confirm = () => true`)
	p.exec("roll back", `[...document.querySelectorAll("#r-versions button")].find((b) => b.textContent === "Roll back to 1").click()`)
	p.waitText("#r-out", "Rolled back")
	testwait.Eventually(t, 30*time.Second, func() error {
		if got := status(t, r, "sk_free_demo"); got != http.StatusTooManyRequests {
			return fmt.Errorf("sk_free_demo after the rollback: %d, want 429", got)
		}
		return nil
	})

	p.open("usage?tenant=acme", "Usage")
	p.waitText("#u-allowed .value", "")
	testwait.Eventually(t, 30*time.Second, func() error {
		if n := p.text("#u-allowed .value"); n == "" || n == "0" {
			return fmt.Errorf("acme's allowed: %q", n)
		}
		return nil
	})
	p.shot("usage")

	// Sign out, then sign in by typing the viewer token: reads work,
	// changes are refused.
	p.run("sign out", chromedp.Click(chromedp.CSS("#signout")))
	p.waitText("#page-title", "Sign in")
	p.shot("signin")
	p.run("type the viewer token", chromedp.SendKeys(chromedp.CSS("#token"), viewerToken+"\r"))
	p.waitText("#who", "viewer")
	adminToken := bannerValue(t, banner, "admin token")
	for name, secret := range map[string]string{"viewer token": viewerToken, "admin token": adminToken} {
		if html, _ := p.eval(`document.documentElement.outerHTML + location.href`); strings.Contains(html, secret) {
			t.Errorf("the page or its address holds the %s", name)
		}
	}
	p.open("lists?list=blocklist&key=sk_prod_acme_1", "Blocklist")
	if dis, _ := p.eval(`document.getElementById("l-put").disabled`); dis != "true" {
		t.Errorf("the viewer's Add button is enabled")
	}
	p.exec("enable the button", `document.getElementById("l-put").disabled = false`)
	p.run("force a change", chromedp.Click(chromedp.CSS("#l-put")))
	p.waitText("#l-out", "FORBIDDEN")
	if got := status(t, r, "sk_prod_acme_1"); got == http.StatusForbidden {
		t.Fatalf("the viewer blocked a key")
	}

	code := link[strings.Index(link, "#code=")+len("#code="):]
	for name, secret := range map[string]string{"viewer token": viewerToken, "admin token": adminToken, "one-time code": code} {
		if strings.Contains(r.logs.String(), secret) {
			t.Errorf("the stack's log holds the %s", name)
		}
	}

	// A phone-sized screen.
	p.run("phone", chromedp.EmulateViewport(390, 844))
	p.open("overview", "Overview")
	p.waitText("#m-health .value", "")
	if w, _ := p.eval(`document.documentElement.scrollWidth <= window.innerWidth + 1`); w != "true" {
		t.Errorf("the overview scrolls sideways on a phone-sized screen")
	}
	p.shot("overview-phone")
}
