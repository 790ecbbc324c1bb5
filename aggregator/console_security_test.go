package aggregator_test

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/aggregator"
	"github.com/tollgate/tollgate/compose/natsserver/natstest"
	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/internal/testnet"
	"github.com/tollgate/tollgate/internal/testwait"
)

const viewerToken = "test-viewer-token-0123"

// browser is an HTTP client with a cookie jar, as a signed-in console page.
type browser struct {
	cl   *http.Client
	base string
	csrf string
}

func (b *browser) do(t *testing.T, method, path, body string, header ...string) (int, []byte) {
	t.Helper()
	code, _, out, err := exchange(b.cl, method, b.base+path, body, header...)
	if err != nil {
		t.Fatal(err)
	}
	return code, out
}

// signIn signs b in with body from the console's origin.
func (b *browser) signIn(t *testing.T, body string) {
	t.Helper()
	code, out := b.do(t, "POST", "/console/session", body, "Origin", b.base, "Content-Type", "application/json")
	if code != 200 {
		t.Fatalf("sign-in: %d %s", code, out)
	}
	var s struct {
		CSRF string `json:"csrf_token"`
	}
	if err := json.Unmarshal(out, &s); err != nil || s.CSRF == "" {
		t.Fatalf("sign-in answer %s: %v", out, err)
	}
	b.csrf = s.CSRF
}

// TestViewerAndConsoleSessions, on a live aggregator with NATS, Redis and
// Kafka: the viewer token reads (200) and changes nothing (403
// FORBIDDEN, no audit entry); a console session changes only from its own
// origin with its CSRF token; the admin bearer token works as before; and
// no token, cookie or CSRF token reaches the log, even at debug level.
func TestViewerAndConsoleSessions(t *testing.T) {
	ns := natstest.StartTB(t)
	cfg := aggregator.Config{Listen: "127.0.0.1:0", MetricsListen: aggregator.Off, ID: "a", DataDir: t.TempDir(),
		AdminToken: token, ViewerToken: viewerToken, KeySecret: secret, SessionTimeout: 2 * time.Second}
	cfg.Kafka.Brokers = startKafka(t)
	cfg.NATS.URL = ns.ClientURL()
	cfg.Redis.Addrs = []string{redistest.StartTB(t).Addr()}
	logs := &testnet.Buffer{}
	in := runWith(t, cfg, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	srv := in.srv
	addr := srv.Addrs().API
	testwait.Eventually(t, 20*time.Second, func() error {
		if code, _, b := op(t, addr, "PUT", "/admin/v1/rules", validRules); code != 200 {
			return fmt.Errorf("%d %s", code, b)
		}
		return nil
	})

	viewer := func(method, path, body string) (int, []byte) {
		code, _, b, err := exchange(http.DefaultClient, method, "http://"+addr+path, body, "Authorization", "Bearer "+viewerToken)
		if err != nil {
			t.Fatal(err)
		}
		return code, b
	}
	for _, path := range []string{"/admin/v1/rules", "/admin/v1/rules/versions", "/admin/v1/audit", "/admin/v1/penalties/sk_someone",
		"/v1/usage/tenants/acme"} {
		testwait.Eventually(t, 20*time.Second, func() error {
			if code, b := viewer("GET", path, ""); code != 200 {
				return fmt.Errorf("viewer GET %s: %d %s", path, code, b)
			}
			return nil
		})
	}
	if code, b := viewer("POST", "/admin/v1/rules/validate", validRules); code != 200 {
		t.Fatalf("viewer validates: %d %s", code, b)
	}
	for _, c := range []struct{ method, path, body string }{
		{"PUT", "/admin/v1/rules", validRules},
		{"POST", "/admin/v1/rules/rollback", `{"version":1}`},
		{"PUT", "/admin/v1/blocklist/sk_viewer_try", `{}`},
		{"PUT", "/admin/v1/allowlist/sk_viewer_try", `{}`},
		{"PUT", "/admin/v1/overrides/sk_viewer_try", `{"limit":5}`},
		{"POST", "/admin/v1/keys/sk_viewer_try/reset", `{}`},
		{"POST", "/admin/v1/keys/sk_viewer_try/quota", `{"tokens":5}`},
		{"DELETE", "/admin/v1/penalties/sk_viewer_try", ``},
	} {
		if code, b := viewer(c.method, c.path, c.body); code != 403 || errorCode(b) != "FORBIDDEN" {
			t.Errorf("viewer %s %s: %d %s, want 403 FORBIDDEN", c.method, c.path, code, b)
		}
	}

	jar, _ := cookiejar.New(nil)
	br := &browser{cl: &http.Client{Jar: jar}, base: "http://" + addr}
	br.signIn(t, `{"token":"`+token+`"}`)
	if code, b := br.do(t, "GET", "/admin/v1/rules/versions", ""); code != 200 {
		t.Fatalf("session read: %d %s", code, b)
	}
	if code, b := br.do(t, "PUT", "/admin/v1/blocklist/sk_forged", `{}`, "Origin", "https://evil.example", "Content-Type", "text/plain"); code != 403 {
		t.Fatalf("cross-site change with the cookie: %d %s", code, b)
	}
	if code, b := br.do(t, "PUT", "/admin/v1/blocklist/sk_forged", `{}`, "Origin", br.base); code != 403 {
		t.Fatalf("change without the CSRF token: %d %s", code, b)
	}
	if code, b := br.do(t, "PUT", "/admin/v1/blocklist/sk_console", `{"reason":"console"}`, "Origin", br.base,
		"X-CSRF-Token", br.csrf, "X-Tollgate-Actor", "console"); code != 200 {
		t.Fatalf("console change: %d %s", code, b)
	}
	entries := func(key string) []struct{ Actor, Kind string } {
		_, _, b := op(t, addr, "GET", "/admin/v1/audit?key="+key, "")
		var out struct {
			Entries []struct{ Actor, Kind string }
		}
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatalf("audit: %v %s", err, b)
		}
		return out.Entries
	}
	testwait.Eventually(t, 20*time.Second, func() error {
		if e := entries("sk_console"); len(e) != 1 || e[0].Actor != "console" || e[0].Kind != "blocklist" {
			return fmt.Errorf("audit of the console's change: %+v", e)
		}
		return nil
	})
	for _, key := range []string{"sk_forged", "sk_viewer_try"} {
		if e := entries(key); len(e) != 0 {
			t.Errorf("a refused change left audit entries for %s: %+v", key, e)
		}
	}

	vjar, _ := cookiejar.New(nil)
	vb := &browser{cl: &http.Client{Jar: vjar}, base: "http://" + addr}
	vb.signIn(t, `{"token":"`+viewerToken+`"}`)
	if code, b := vb.do(t, "PUT", "/admin/v1/blocklist/sk_viewer_try", `{}`, "Origin", vb.base, "X-CSRF-Token", vb.csrf); code != 403 {
		t.Fatalf("viewer session change: %d %s", code, b)
	}

	ljar, _ := cookiejar.New(nil)
	linked := &browser{cl: &http.Client{Jar: ljar}, base: "http://" + addr}
	code := srv.ConsoleCode()
	if strings.Contains(code, token) {
		t.Fatalf("the console code holds the admin token: %s", code)
	}
	linked.signIn(t, `{"code":"`+code+`"}`)
	if code, b := linked.do(t, "PUT", "/admin/v1/blocklist/sk_linked", `{}`, "Origin", linked.base, "X-CSRF-Token", linked.csrf); code != 200 {
		t.Fatalf("change by a session from the one-time code: %d %s", code, b)
	}
	if c, b := linked.do(t, "POST", "/console/session", `{"code":"`+code+`"}`, "Origin", linked.base); c != 401 {
		t.Fatalf("the code's second use: %d %s", c, b)
	}

	log := logs.String()
	for name, secret := range map[string]string{"admin token": token, "viewer token": viewerToken, "CSRF token": br.csrf} {
		if strings.Contains(log, secret) {
			t.Errorf("the log holds the %s", name)
		}
	}
	u, _ := url.Parse(br.base)
	for _, c := range jar.Cookies(u) {
		if strings.Contains(log, c.Value) {
			t.Errorf("the log holds the session cookie")
		}
	}
}
