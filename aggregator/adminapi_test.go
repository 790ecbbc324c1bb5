package aggregator_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/aggregator"
	"github.com/tollgate/tollgate/compose/natsserver/natstest"
	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/internal/logtest"
	"github.com/tollgate/tollgate/internal/testwait"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

const validRules = `
rules:
  - id: default
    algorithm: token_bucket
    capacity: 10
    rate: 10/1m
`

// op calls the operator API with the admin token.
func op(t *testing.T, addr, method, path, body string, header ...string) (int, http.Header, []byte) {
	t.Helper()
	code, h, b, err := exchange(http.DefaultClient, method, "http://"+addr+path, body,
		append([]string{"Authorization", "Bearer " + token}, header...)...)
	if err != nil {
		t.Fatal(err)
	}
	return code, h, b
}

// exchange sends a request through cl with header (name, value pairs, a
// later one replacing an earlier) and returns the answer's status, header
// and body.
func exchange(cl *http.Client, method, url, body string, header ...string) (int, http.Header, []byte, error) {
	req, err := http.NewRequestWithContext(context.Background(), method, url, strings.NewReader(body))
	if err != nil {
		return 0, nil, nil, err
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := cl.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b, err
}

func startFleetAggregator(t *testing.T) (*instance, jetstream.JetStream) {
	return startFleetAggregatorOn(t, startKafka(t))
}

// startFleetAggregatorOn starts an aggregator with NATS and Redis on the
// Kafka brokers given, and a JetStream client of its NATS.
func startFleetAggregatorOn(t *testing.T, brokers []string, opts ...func(*aggregator.Config)) (*instance, jetstream.JetStream) {
	ns := natstest.StartTB(t)
	cfg := aggregator.Config{Listen: "127.0.0.1:0", MetricsListen: aggregator.Off, ID: "a", DataDir: t.TempDir(),
		AdminToken: token, KeySecret: secret, SessionTimeout: 2 * time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	cfg.Kafka.Brokers = brokers
	cfg.NATS.URL = ns.ClientURL()
	cfg.Redis.Addrs = []string{redistest.StartTB(t).Addr()}
	in := runWith(t, cfg, logtest.Verbose(t))
	srv := in.srv
	js := natstest.JetStream(t, ns.ClientURL())
	testwait.Eventually(t, 20*time.Second, func() error {
		if code, _, b := op(t, srv.Addrs().API, "GET", "/admin/v1/rules/versions", ""); code != 200 {
			return fmt.Errorf("%d %s", code, b)
		}
		return nil
	})
	return in, js
}

func TestOperatorAPI(t *testing.T) {
	in, js := startFleetAggregator(t)
	addr := in.srv.Addrs().API

	t.Run("token", func(t *testing.T) {
		code, _, _, err := exchange(http.DefaultClient, "GET", "http://"+addr+"/admin/v1/rules", "")
		if err != nil {
			t.Fatal(err)
		}
		if code != 401 {
			t.Fatalf("without token: %d, want 401", code)
		}
	})

	t.Run("rules", func(t *testing.T) {
		code, _, b := op(t, addr, "PUT", "/admin/v1/rules", "rules:\n  - id: bad\n    algorithm: token_bucket\n    capacity: 0\n    rate: 1/1s\n")
		if code != 400 || !bytes.Contains(b, []byte(`"rule": "bad"`)) || !bytes.Contains(b, []byte(`"field": "capacity"`)) {
			t.Fatalf("invalid ruleset: %d %s, want 400 naming rule bad and field capacity", code, b)
		}
		if code, _, _ := op(t, addr, "GET", "/admin/v1/rules", ""); code != 404 {
			t.Fatalf("nothing written yet: GET %d, want 404", code)
		}
		code, hdr, b := op(t, addr, "PUT", "/admin/v1/rules", validRules)
		if code != 200 || hdr.Get("ETag") != `"1"` {
			t.Fatalf("PUT: %d %s %v", code, b, hdr)
		}
		if code, _, b := op(t, addr, "PUT", "/admin/v1/rules", validRules+"# v2\n", "If-Match", "7"); code != 412 {
			t.Fatalf("If-Match 7 at version 1: %d %s, want 412", code, b)
		}
		if code, _, b := op(t, addr, "PUT", "/admin/v1/rules", strings.Replace(validRules, "10/1m", "20/1m", 1), "If-Match", "1"); code != 200 {
			t.Fatalf("If-Match 1: %d %s", code, b)
		}
		code, _, b = op(t, addr, "POST", "/admin/v1/rules/rollback", `{"version":1}`)
		if code != 200 || !bytes.Contains(b, []byte(`"version": 3`)) {
			t.Fatalf("rollback: %d %s, want version 3", code, b)
		}
		_, _, b = op(t, addr, "GET", "/admin/v1/rules", "")
		if string(b) != validRules {
			t.Fatalf("after rollback the rules are\n%s\nwant version 1's", b)
		}
		kv, err := js.KeyValue(context.Background(), tollgatev1.BucketRules)
		if err != nil {
			t.Fatal(err)
		}
		e, err := kv.Get(context.Background(), tollgatev1.RulesKey)
		if err != nil {
			t.Fatal(err)
		}
		re, err := tollgatev1.DecodeRulesEntry(e.Value())
		if err != nil || re.Version != 3 {
			t.Fatalf("KV holds %+v %v, want version 3", re, err)
		}
		code, _, b = op(t, addr, "GET", "/admin/v1/rules/versions", "")
		if code != 200 || bytes.Count(b, []byte(`"version"`)) != 3 {
			t.Fatalf("versions: %d %s", code, b)
		}
		if code, _, _ := op(t, addr, "POST", "/admin/v1/rules/validate", validRules); code != 200 {
			t.Fatalf("validate: %d", code)
		}
		// A ruleset refusing every request: refused naming the field, or
		// accepted with a warning when it says so.
		total := "blocklist: [\"*\"]\n" + validRules
		code, _, b = op(t, addr, "POST", "/admin/v1/rules/validate", total)
		if code != 400 || !bytes.Contains(b, []byte(`"field": "blocklist[0]"`)) || !bytes.Contains(b, []byte("would refuse every request")) {
			t.Fatalf("validate of a total block: %d %s, want 400 naming blocklist[0]", code, b)
		}
		code, _, b = op(t, addr, "POST", "/admin/v1/rules/validate", "allow_total_block: true\n"+total)
		if code != 200 || !bytes.Contains(b, []byte(`"warnings"`)) || !bytes.Contains(b, []byte(`"field": "blocklist[0]"`)) {
			t.Fatalf("validate with allow_total_block: %d %s, want 200 with a warning naming blocklist[0]", code, b)
		}
	})

	t.Run("blocklist", func(t *testing.T) {
		code, _, b := op(t, addr, "PUT", "/admin/v1/blocklist/sk_live_abuser", `{"ttl":"10m","reason":"scraping"}`)
		if code != 200 {
			t.Fatalf("PUT: %d %s", code, b)
		}
		var e tollgatev1.ListEntry
		_ = json.Unmarshal(b, &e)
		kv, _ := js.KeyValue(context.Background(), tollgatev1.BucketBlocklist)
		got, err := kv.Get(context.Background(), e.KeyID)
		if err != nil || !bytes.Contains(got.Value(), []byte(`"action":"block"`)) || bytes.Contains(got.Value(), []byte("sk_live_abuser")) {
			t.Fatalf("KV entry %s (%v): want a block entry by key_id, never the raw key", got.Value(), err)
		}
		if code, _, b := op(t, addr, "PUT", "/admin/v1/blocklist/sk_x", `{"ttl":"forever"}`); code != 400 {
			t.Fatalf("bad ttl: %d %s", code, b)
		}
		if code, _, _ := op(t, addr, "DELETE", "/admin/v1/blocklist/kid:"+e.KeyID, ""); code != 204 {
			t.Fatalf("DELETE by kid: %d", code)
		}
		if _, err := kv.Get(context.Background(), e.KeyID); err == nil {
			t.Fatal("entry still in KV after DELETE")
		}
	})

	t.Run("overrides", func(t *testing.T) {
		code, hdr, b := op(t, addr, "PUT", "/admin/v1/overrides/sk_prod_vip", `{"factor":2,"ttl":"1h","reason":"launch"}`)
		if code != 200 {
			t.Fatalf("PUT: %d %s", code, b)
		}
		v := strings.Trim(hdr.Get("ETag"), `"`)
		if code, _, _ := op(t, addr, "PUT", "/admin/v1/overrides/sk_prod_vip", `{"limit":500}`, "If-Match", v+"9"); code != 412 {
			t.Fatalf("stale If-Match: %d, want 412", code)
		}
		if code, _, b := op(t, addr, "PUT", "/admin/v1/overrides/sk_prod_vip", `{"limit":500}`, "If-Match", v); code != 200 {
			t.Fatalf("If-Match %s: %d %s", v, code, b)
		}
		if code, _, _ := op(t, addr, "PUT", "/admin/v1/overrides/tenant:acme", `{"limit":5,"factor":2}`); code != 400 {
			t.Fatal("limit and factor together accepted")
		}
		if code, _, b := op(t, addr, "PUT", "/admin/v1/overrides/tenant:acme", `{"limit":5000}`); code != 200 {
			t.Fatalf("tenant override: %d %s", code, b)
		}
	})

	t.Run("keys", func(t *testing.T) {
		// The active ruleset is version 3 (= validRules): a bucket of 10.
		code, _, b := op(t, addr, "GET", "/admin/v1/keys/sk_some_client?endpoint=/v1/x", "")
		if code != 200 || !bytes.Contains(b, []byte(`"remaining": 10`)) {
			t.Fatalf("GET keys: %d %s, want a full bucket of 10", code, b)
		}
		// A grant never fills a counter above its limit, and its answer
		// says how much was granted: nothing, on a full bucket.
		code, _, b = op(t, addr, "POST", "/admin/v1/keys/sk_some_client/quota", `{"tokens":5,"reason":"goodwill"}`)
		if code != 200 || !bytes.Contains(b, []byte(`"remaining": 10`)) || !bytes.Contains(b, []byte(`"granted": 0`)) ||
			!bytes.Contains(b, []byte(`"tokens": 5`)) {
			t.Fatalf("quota on a full bucket: %d %s, want remaining 10, granted 0 of tokens 5", code, b)
		}
		if code, _, b := op(t, addr, "POST", "/admin/v1/keys/sk_some_client/reset", `{}`); code != 200 {
			t.Fatalf("reset: %d %s", code, b)
		}
		if code, _, _ := op(t, addr, "GET", "/admin/v1/keys/kid:aaaaaaaaaaaaaaaaaaaaaa", ""); code != 400 {
			t.Fatalf("kid: on keys/{key}: %d, want 400", code)
		}
	})

	t.Run("audit", func(t *testing.T) {
		testwait.Eventually(t, 10*time.Second, func() error {
			_, _, b := op(t, addr, "GET", "/admin/v1/audit", "")
			for _, kind := range []string{`"kind": "rules"`, `"kind": "rollback"`, `"kind": "blocklist"`, `"kind": "override"`, `"kind": "quota"`, `"kind": "reset"`} {
				if !bytes.Contains(b, []byte(kind)) {
					return fmt.Errorf("no %s entry in %s", kind, b)
				}
			}
			return nil
		})
	})
}
