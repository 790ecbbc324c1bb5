package checkapi

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/httpguard"
	"github.com/tollgate/tollgate/guard/redisstore"
	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/internal/testnet"
)

// surfaceRules: two units per key on /v1/items, so a third check is a 429.
const surfaceRules = `
rules:
  - {id: items, match: {endpoint: "^/v1/items"}, algorithm: fixed_window, limit: 2, window: 1h}
`

// realGuard returns a guard on a real redis-server enforcing surfaceRules.
func realGuard(t *testing.T) *guard.Guard {
	t.Helper()
	c, err := redisstore.NewClient(redisstore.Config{Addrs: []string{redistest.StartTB(t).Addr()}, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	store := redisstore.New(c, redisstore.WithTimeout(2*time.Second))
	t.Cleanup(func() {
		store.Close()
		c.Close()
	})
	rs, err := rules.Load([]byte(surfaceRules))
	if err != nil {
		t.Fatal(err)
	}
	g, err := guard.New(store, []byte("checkapi-test-secret-0123456789"), rs)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// testLimits are the limits of the servers of the differential tests.
var testLimits = ServerLimits{
	ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
	WriteTimeout: 10 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 16 << 10,
}

// serveFast serves NewFastServer(cfg, l) on a loopback port until the
// test ends and returns its address.
func serveFast(t *testing.T, cfg Config, l ServerLimits) string {
	t.Helper()
	ln := testnet.Listen(t)
	srv := NewFastServer(cfg, l)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		if err := srv.Shutdown(); err != nil {
			t.Error(err)
		}
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return ln.Addr().String()
}

// rawExchange sends raw (an HTTP/1.1 request as bytes) on a new
// connection to addr and returns the response, headers canonical as
// net/http parses them, with Date dropped (it is the clock's).
func rawExchange(t *testing.T, addr, raw string) (int, http.Header, []byte) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%q: %v", raw, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	resp.Header.Del("Date")
	return resp.StatusCode, resp.Header, body
}

var keySeq atomic.Int64

// TestFastServerAnswersAsNetHTTP: every answer of the fasthttp server —
// decisions, 429s with Retry-After, peeks, batches, reports, /v1/authz,
// and every error (401, 404, 405, 400 on malformed bodies and keys, 413 on
// oversized bodies, problem+json) — is the net/http handler's, status,
// headers and body, for the same sequence of requests on a key of its
// own, against one guard on a real Redis.
func TestFastServerAnswersAsNetHTTP(t *testing.T) {
	t.Parallel()
	g := realGuard(t)
	for _, token := range []string{"", "s3cret-token"} {
		cfg := Config{Decider: g, Token: token, MaxBatch: 3, MaxBody: 1024, Identity: &httpguard.Identity{}}
		std := httptest.NewUnstartedServer(New(cfg))
		std.Config.MaxHeaderBytes = 16 << 10 // as serveFast's
		std.Start()
		t.Cleanup(std.Close)
		stdAddr := strings.TrimPrefix(std.URL, "http://")
		fastAddr := serveFast(t, cfg, testLimits)

		auth := ""
		if token != "" {
			auth = "Authorization: Bearer " + token + "\r\n"
		}
		post := func(path, body string, extra ...string) string {
			return "POST " + path + " HTTP/1.1\r\nHost: t\r\n" + auth + strings.Join(extra, "") +
				"Content-Type: application/json\r\nContent-Length: " + fmt.Sprint(len(body)) + "\r\n\r\n" + body
		}
		check := func(key string) string {
			return post("/v1/check", `{"api_key":"`+key+`","endpoint":"/v1/items","method":"GET"}`)
		}
		tests := []struct {
			name string
			// reqs builds the requests in order for one key (the KEY
			// placeholder is replaced by a fresh key per server).
			reqs []string
		}{
			{"admitted, admitted, 429", []string{check("KEY"), check("KEY"), check("KEY")}},
			{"no rule matches", []string{post("/v1/check", `{"api_key":"KEY","endpoint":"/v1/other"}`)}},
			{"peek", []string{check("KEY"), post("/v1/check", `{"api_key":"KEY","endpoint":"/v1/items","cost":0}`)}},
			{"strict decoder (escapes, spaces)", []string{post("/v1/check", "{ \"api_key\" : \"KEY\\u005fx\", \"endpoint\": \"/v1/items\" }")}},
			{"query string", []string{post("/v1/check?x=1", `{"api_key":"KEY","endpoint":"/v1/items"}`)}},
			{"chunked body", []string{"POST /v1/check HTTP/1.1\r\nHost: t\r\n" + auth + "Transfer-Encoding: chunked\r\n\r\n" +
				"CHUNKED:{\"api_key\":\"KEY\",\"endpoint\":\"/v1/items\"}"}},
			{"HTTP/1.0", []string{strings.Replace(check("KEY"), "HTTP/1.1", "HTTP/1.0", 1)}},
			{"cost above the limit", []string{post("/v1/check", `{"api_key":"KEY","endpoint":"/v1/items","cost":3}`)}},
			{"invalid key", []string{post("/v1/check", `{"api_key":"KEY\u0001"}`)}},
			{"300-byte key", []string{post("/v1/check", `{"api_key":"KEY`+strings.Repeat("k", 300)+`"}`)}},
			{"invalid UTF-8 key", []string{post("/v1/check", "{\"api_key\":\"KEY\xff\"}")}},
			{"invalid path", []string{post("/v1/check", `{"api_key":"KEY","endpoint":"/v1/../../x"}`)}},
			{"malformed JSON", []string{post("/v1/check", `{"api_key":"KEY"`)}},
			{"unknown field", []string{post("/v1/check", `{"api_key":"KEY","x":1}`)}},
			{"empty body", []string{post("/v1/check", ``)}},
			{"problem+json", []string{post("/v1/check", `{"api_key":`, "Accept: application/problem+json\r\n")}},
			{"oversized body", []string{post("/v1/check", `{"api_key":"KEY","endpoint":"/`+strings.Repeat("a", 1100)+`"}`)}},
			{"broken chunked body", []string{"POST /v1/check HTTP/1.1\r\nHost: t\r\n" + auth + "Transfer-Encoding: chunked\r\n\r\n" +
				"zz\r\n{}\r\n0\r\n\r\n"}},
			{"oversized chunked body", []string{"POST /v1/check HTTP/1.1\r\nHost: t\r\n" + auth + "Transfer-Encoding: chunked\r\n\r\n" +
				"500\r\n" + strings.Repeat(" ", 0x500) + "\r\n0\r\n\r\n"}},
			{"oversized headers", []string{strings.Replace(check("KEY"), "Host: t\r\n", "Host: t\r\nX-Big: "+strings.Repeat("b", 40<<10)+"\r\n", 1)}},
			{"malformed request line", []string{"GARBAGE\r\n\r\n"}},
			{"GET", []string{"GET /v1/check HTTP/1.1\r\nHost: t\r\n" + auth + "\r\n"}},
			{"unknown path", []string{post("/v1/nope", `{}`)}},
			{"batch", []string{post("/v1/check/batch", `[{"api_key":"KEY","endpoint":"/v1/items"},{"api_key":"KEY","x":1},{"api_key":"KEY","endpoint":"/v1/items","cost":5}]`)}},
			{"batch too long", []string{post("/v1/check/batch", `[{},{},{},{}]`)}},
			{"batch malformed", []string{post("/v1/check/batch", `[{"api_key":"KEY"},`)}},
			{"report", []string{post("/v1/report", `{"api_key":"KEY","endpoint":"/v1/items","cost":2}`), check("KEY")}},
			{"report peek", []string{post("/v1/report", `{"api_key":"KEY","cost":0}`)}},
			{"report invalid key", []string{post("/v1/report", "{\"api_key\":\"KEY\xfe\",\"cost\":2}")}},
			{"authz", []string{
				"GET /v1/authz HTTP/1.1\r\nHost: t\r\nX-API-Key: KEY\r\nX-Forwarded-Method: GET\r\nX-Forwarded-Uri: /v1/items?q=1\r\n" +
					strings.ReplaceAll(auth, "Authorization: Bearer", "X-Tollgate-Token:") + "\r\n",
			}},
			{"authz nginx mode, 429", []string{check("KEY"), check("KEY"),
				"GET /v1/authz HTTP/1.1\r\nHost: t\r\nX-API-Key: KEY\r\nX-Original-URI: /v1/items\r\nX-Tollgate-Authz-Mode: nginx\r\n" +
					strings.ReplaceAll(auth, "Authorization: Bearer", "X-Tollgate-Token:") + "\r\n",
			}},
		}
		if token != "" {
			tests = append(tests, []struct {
				name string
				reqs []string
			}{
				{"no token", []string{strings.Replace(check("KEY"), auth, "", 1)}},
				{"wrong token", []string{strings.Replace(check("KEY"), token, "nope", 1)}},
				{"lower-case scheme", []string{strings.Replace(check("KEY"), "Bearer", "bearer", 1)}},
				{"authz without token", []string{"GET /v1/authz HTTP/1.1\r\nHost: t\r\nX-API-Key: KEY\r\nX-Forwarded-Uri: /v1/items\r\n\r\n"}},
			}...)
		}
		for _, tt := range tests {
			t.Run(fmt.Sprintf("token=%v/%s", token != "", tt.name), func(t *testing.T) {
				// The clock may tick between the two sequences and move
				// Reset or RateLimit's t by a second: retry on fresh keys.
				var diff string
				var statuses []int
				for range 3 {
					if diff, statuses = compareSequence(t, stdAddr, fastAddr, tt.reqs); diff == "" {
						break
					}
				}
				if diff != "" {
					t.Fatal(diff)
				}
				if want, ok := wantStatuses[tt.name]; ok && !slices.Equal(statuses, want) {
					t.Errorf("statuses %v, want %v", statuses, want)
				}
			})
		}
	}
}

// wantStatuses are the answers of some sequences, so that the test is
// known to compare decisions and not only refusals.
var wantStatuses = map[string][]int{
	"admitted, admitted, 429":          {200, 200, 429},
	"no rule matches":                  {200},
	"peek":                             {200, 200},
	"strict decoder (escapes, spaces)": {200},
	"query string":                     {200},
	"chunked body":                     {200},
	"HTTP/1.0":                         {200},
	"cost above the limit":             {400},
	"invalid key":                      {400},
	"oversized body":                   {413},
	"oversized chunked body":           {413},
	"malformed request line":           {400},
	"GET":                              {405},
	"unknown path":                     {404},
	"batch":                            {200},
	"report":                           {204, 429}, // cost 2 of the limit 2
	"authz":                            {200},
	"authz nginx mode, 429":            {200, 200, 401},
	"no token":                         {401},
	"lower-case scheme":                {200},
}

// compareSequence sends reqs to net/http and to fasthttp, each on a fresh
// key, and returns how the answers differ ("" when they do not) and the
// statuses.
func compareSequence(t *testing.T, stdAddr, fastAddr string, reqs []string) (string, []int) {
	var statuses []int
	stdKey := fmt.Sprintf("sk_std_%d", keySeq.Add(1))
	fastKey := fmt.Sprintf("sk_fst_%d", keySeq.Add(1))
	for i, raw := range reqs {
		sc, sh, sb := rawExchange(t, stdAddr, fixLength(chunk(strings.ReplaceAll(raw, "KEY", stdKey))))
		fc, fh, fb := rawExchange(t, fastAddr, fixLength(chunk(strings.ReplaceAll(raw, "KEY", fastKey))))
		if fh.Get("Connection") == "close" && sh.Get("Connection") == "" && sc == http.StatusBadRequest {
			// fasthttp closes the connection after a request it could
			// not read, and says so.
			fh.Del("Connection")
		}
		if (sc == http.StatusRequestHeaderFieldsTooLarge || sc == http.StatusBadRequest) && sh.Get("Content-Length") == "" &&
			sh.Get("Content-Type") == "text/plain; charset=utf-8" {
			// net/http ends its plain-text 431 and 400 by closing the
			// connection, fasthttp with a Content-Length.
			fh.Del("Content-Length")
		}
		if sc != fc || !bytes.Equal(sb, fb) || !maps.EqualFunc(sh, fh, slices.Equal) {
			if len(raw) > 300 {
				raw = raw[:300] + "…"
			}
			return fmt.Sprintf("request %d %q:\nnet/http %d %v %s\nfasthttp %d %v %s", i, raw, sc, sh, sb, fc, fh, fb), nil
		}
		statuses = append(statuses, sc)
	}
	return "", statuses
}

// fixLength sets a Content-Length header of raw to its body's length
// (the key put in place of KEY changed it).
func fixLength(raw string) string {
	head, body, ok := strings.Cut(raw, "\r\n\r\n")
	if !ok {
		return raw
	}
	lines := strings.Split(head, "\r\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "Content-Length: ") {
			lines[i] = fmt.Sprintf("Content-Length: %d", len(body))
		}
	}
	return strings.Join(lines, "\r\n") + "\r\n\r\n" + body
}

// chunk encodes a body marked CHUNKED: as two chunks.
func chunk(raw string) string {
	head, body, ok := strings.Cut(raw, "CHUNKED:")
	if !ok {
		return raw
	}
	return fmt.Sprintf("%s%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n", head, 5, body[:5], len(body)-5, body[5:])
}

// TestFastServerTimeoutsAsNetHTTP: a client too slow for the read
// timeouts gets what net/http gives it: a new connection that sends
// nothing is closed without an answer, part of a request head is 400;
// but a body that stops arriving is closed without an answer where
// net/http says 400 INVALID_REQUEST.
func TestFastServerTimeoutsAsNetHTTP(t *testing.T) {
	t.Parallel()
	cfg := Config{Decider: realGuard(t), MaxBody: 1024}
	l := testLimits
	l.ReadHeaderTimeout, l.ReadTimeout = 300*time.Millisecond, 600*time.Millisecond
	std := httptest.NewUnstartedServer(New(cfg))
	std.Config.ReadHeaderTimeout, std.Config.ReadTimeout = l.ReadHeaderTimeout, l.ReadTimeout
	std.Start()
	t.Cleanup(std.Close)
	addrs := map[string]string{"net/http": strings.TrimPrefix(std.URL, "http://"), "fasthttp": serveFast(t, cfg, l)}
	for _, tt := range []struct {
		name, send string
		// status by server; 0: closed without an answer
		status map[string]int
		code   string
	}{
		{"nothing", "", map[string]int{"net/http": 0, "fasthttp": 0}, ""},
		{"part of the head", "POST /v1/check HTTP/1.1\r\nHost: t\r\nContent-Le",
			map[string]int{"net/http": http.StatusBadRequest, "fasthttp": http.StatusBadRequest}, "400 Bad Request"},
		// fasthttp reports this as it reports an idle connection timing
		// out (readError): the one answer that differs.
		{"part of the body", "POST /v1/check HTTP/1.1\r\nHost: t\r\nContent-Length: 50\r\n\r\n{\"api_key\":",
			map[string]int{"net/http": http.StatusBadRequest, "fasthttp": 0}, `"INVALID_REQUEST"`},
	} {
		for name, addr := range addrs {
			t.Run(tt.name+"/"+name, func(t *testing.T) {
				t.Parallel()
				c, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				if _, err := io.WriteString(c, tt.send); err != nil {
					t.Fatal(err)
				}
				got, err := io.ReadAll(c)
				if err != nil && !strings.Contains(err.Error(), "reset") {
					t.Fatal(err)
				}
				status := tt.status[name]
				if status == 0 {
					if len(got) > 0 {
						t.Fatalf("answered %q, want the connection closed without an answer", got)
					}
					return
				}
				resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(got)), nil)
				if err != nil {
					t.Fatalf("%q: %v", got, err)
				}
				body, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != status || !strings.Contains(string(body), tt.code) {
					t.Fatalf("%d %s, want %d %s", resp.StatusCode, body, status, tt.code)
				}
			})
		}
	}
}
