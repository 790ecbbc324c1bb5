package aggregator_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tollgate/tollgate/aggregator"
	"github.com/tollgate/tollgate/compose/kafkabroker/kafkatest"
	"github.com/tollgate/tollgate/guard/keyid"
	"github.com/tollgate/tollgate/internal/testwait"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// putRaw writes value under key in bucket directly, as anything with
// write access to NATS can; it returns the revision.
func putRaw(t *testing.T, js jetstream.JetStream, bucket, key string, value []byte) uint64 {
	t.Helper()
	kv, err := js.KeyValue(t.Context(), bucket)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := kv.Put(t.Context(), key, value)
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

// kvHas reports whether bucket holds key.
func kvHas(t *testing.T, js jetstream.JetStream, bucket, key string) bool {
	t.Helper()
	kv, err := js.KeyValue(t.Context(), bucket)
	if err != nil {
		t.Fatal(err)
	}
	_, err = kv.Get(t.Context(), key)
	return err == nil
}

// errorCode is the code of an operator API error answer.
// waitAudit waits until the audit log holds an entry of kind whose JSON
// contains every want.
func waitAudit(t *testing.T, addr, kind string, want ...string) {
	t.Helper()
	testwait.Eventually(t, 20*time.Second, func() error {
		_, _, b := op(t, addr, "GET", "/admin/v1/audit?kind="+kind, "")
		var out struct{ Entries []json.RawMessage }
		if err := json.Unmarshal(b, &out); err != nil {
			return err
		}
	entries:
		for _, raw := range out.Entries {
			var e bytes.Buffer
			if err := json.Compact(&e, raw); err != nil {
				return err
			}
			for _, w := range want {
				if !bytes.Contains(e.Bytes(), []byte(w)) {
					continue entries
				}
			}
			return nil
		}
		return fmt.Errorf("no %s entry with %q in %s", kind, want, b)
	})
}

// TestCorruptEntriesInTheOperatorAPI: a corrupt entry in a bucket never
// locks the operator out. The API shows it for what it is (409 with its
// revision; before, GET, PUT and rollback of rules answered 502
// NATS_UNAVAILABLE and DELETE of a blocklist entry 404), replaces it
// (If-Match: r<revision>, or a rollback) or deletes it, and audits the
// repair.
func TestCorruptEntriesInTheOperatorAPI(t *testing.T) {
	in, js := startFleetAggregator(t)
	addr := in.srv.Addrs().API
	if code, _, b := op(t, addr, "PUT", "/admin/v1/rules", validRules); code != 200 {
		t.Fatalf("PUT: %d %s", code, b)
	}

	t.Run("rules", func(t *testing.T) {
		rev := putRaw(t, js, tollgatev1.BucketRules, tollgatev1.RulesKey, []byte(`{"version": 2, "source": "rules: [`))
		etag := fmt.Sprintf(`"r%d"`, rev)
		code, hdr, b := op(t, addr, "GET", "/admin/v1/rules", "")
		if code != 409 || errorCode(b) != "RULES_CORRUPT" || hdr.Get("ETag") != etag || !bytes.Contains(b, fmt.Appendf(nil, `"revision": %d`, rev)) {
			t.Fatalf("GET over a corrupt entry: %d %v %s, want 409 RULES_CORRUPT with revision %d and ETag %s", code, hdr.Get("ETag"), b, rev, etag)
		}
		code, _, b = op(t, addr, "GET", "/admin/v1/rules/versions", "")
		if code != 200 || !bytes.Contains(b, []byte(`"corrupt": true`)) || !bytes.Contains(b, []byte(`"version": 1`)) {
			t.Fatalf("versions: %d %s, want version 1 and the corrupt entry", code, b)
		}
		if code, hdr, b := op(t, addr, "PUT", "/admin/v1/rules", validRules, "If-Match", "1"); code != 412 || errorCode(b) != "RULES_CORRUPT" || hdr.Get("ETag") != etag {
			t.Fatalf("PUT with the version before the corruption: %d %s, want 412 RULES_CORRUPT naming %s", code, b, etag)
		}
		code, _, b = op(t, addr, "PUT", "/admin/v1/rules", strings.Replace(validRules, "10/1m", "20/1m", 1), "If-Match", etag)
		if code != 200 || !bytes.Contains(b, []byte(`"version": 2`)) {
			t.Fatalf("PUT with If-Match %s: %d %s, want version 2", etag, code, b)
		}
		waitAudit(t, addr, "rules", `"corrupt":true`, fmt.Sprintf(`"revision":%d`, rev))

		putRaw(t, js, tollgatev1.BucketRules, tollgatev1.RulesKey, []byte("\x00garbage"))
		code, _, b = op(t, addr, "POST", "/admin/v1/rules/rollback", `{"version":1}`)
		if code != 200 || !bytes.Contains(b, []byte(`"version": 3`)) {
			t.Fatalf("rollback over a corrupt entry: %d %s, want version 3", code, b)
		}
		if code, _, b := op(t, addr, "GET", "/admin/v1/rules", ""); code != 200 || string(b) != validRules {
			t.Fatalf("after the rollback: %d %s", code, b)
		}
		waitAudit(t, addr, "rollback", `"corrupt":true`)
	})

	h, err := keyid.New([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	t.Run("blocklist", func(t *testing.T) {
		id := h.ID("sk_corrupt_block")
		putRaw(t, js, tollgatev1.BucketBlocklist, tollgatev1.BlocklistKey(id), []byte(`{"key_id":`))
		if code, _, b := op(t, addr, "GET", "/admin/v1/blocklist/sk_corrupt_block", ""); code != 409 || errorCode(b) != "ENTRY_CORRUPT" ||
			!bytes.Contains(b, []byte("block the key")) {
			t.Fatalf("GET: %d %s, want 409 ENTRY_CORRUPT saying gateways block the key", code, b)
		}
		if code, _, b := op(t, addr, "DELETE", "/admin/v1/blocklist/sk_corrupt_block?reason=repair", ""); code != 204 {
			t.Fatalf("DELETE of a corrupt entry: %d %s, want 204", code, b)
		}
		if kvHas(t, js, tollgatev1.BucketBlocklist, id) {
			t.Fatal("the corrupt entry is still in NATS")
		}
		waitAudit(t, addr, "blocklist", id, `"corrupt":true`, `"reason":"repair"`)
		// An entry under the wrong key is corrupt too; a PUT replaces it.
		other := h.ID("sk_someone_else")
		putRaw(t, js, tollgatev1.BucketBlocklist, tollgatev1.BlocklistKey(id),
			fmt.Appendf(nil, `{"key_id":%q,"action":"block"}`, other))
		if code, _, b := op(t, addr, "GET", "/admin/v1/blocklist/sk_corrupt_block", ""); code != 409 || errorCode(b) != "ENTRY_CORRUPT" {
			t.Fatalf("GET of a misplaced entry: %d %s, want 409 ENTRY_CORRUPT", code, b)
		}
		if code, _, b := op(t, addr, "PUT", "/admin/v1/blocklist/sk_corrupt_block", `{"reason":"rewritten"}`); code != 200 {
			t.Fatalf("PUT over a corrupt entry: %d %s", code, b)
		}
		if code, _, b := op(t, addr, "GET", "/admin/v1/blocklist/sk_corrupt_block", ""); code != 200 || !bytes.Contains(b, []byte(`"rewritten"`)) {
			t.Fatalf("GET after the PUT: %d %s", code, b)
		}
	})

	t.Run("allowlist", func(t *testing.T) {
		id := h.ID("sk_corrupt_allow")
		putRaw(t, js, tollgatev1.BucketBlocklist, tollgatev1.AllowlistKey(id), []byte(`[1,2,3]`))
		if code, _, b := op(t, addr, "GET", "/admin/v1/allowlist/kid:"+id, ""); code != 409 || errorCode(b) != "ENTRY_CORRUPT" {
			t.Fatalf("GET: %d %s", code, b)
		}
		if code, _, b := op(t, addr, "DELETE", "/admin/v1/allowlist/kid:"+id, ""); code != 204 {
			t.Fatalf("DELETE: %d %s", code, b)
		}
		if kvHas(t, js, tollgatev1.BucketBlocklist, tollgatev1.AllowlistKey(id)) {
			t.Fatal("the corrupt entry is still in NATS")
		}
	})

	t.Run("overrides", func(t *testing.T) {
		id := h.ID("sk_corrupt_override")
		name := tollgatev1.OverrideKey(tollgatev1.ScopeKey, id)
		rev := putRaw(t, js, tollgatev1.BucketOverrides, name, []byte(`{"scope":"key","subject":"`+id+`"}`))
		code, hdr, b := op(t, addr, "GET", "/admin/v1/overrides/sk_corrupt_override", "")
		if code != 409 || errorCode(b) != "ENTRY_CORRUPT" || hdr.Get("ETag") != fmt.Sprintf(`"%d"`, rev) {
			t.Fatalf("GET: %d %v %s", code, hdr, b)
		}
		if code, _, b := op(t, addr, "PUT", "/admin/v1/overrides/sk_corrupt_override", `{"limit":50}`, "If-Match", fmt.Sprint(rev+7)); code != 412 {
			t.Fatalf("PUT with a stale If-Match: %d %s", code, b)
		}
		if code, _, b := op(t, addr, "PUT", "/admin/v1/overrides/sk_corrupt_override", `{"limit":50}`, "If-Match", fmt.Sprint(rev)); code != 200 {
			t.Fatalf("PUT with the corrupt entry's revision: %d %s", code, b)
		}
		putRaw(t, js, tollgatev1.BucketOverrides, name, []byte(`garbage`))
		if code, _, b := op(t, addr, "DELETE", "/admin/v1/overrides/sk_corrupt_override", ""); code != 204 {
			t.Fatalf("DELETE: %d %s", code, b)
		}
		if kvHas(t, js, tollgatev1.BucketOverrides, name) {
			t.Fatal("the corrupt entry is still in NATS")
		}
		waitAudit(t, addr, "override", id, `"corrupt":true`)
	})
}

// bigRules returns a valid ruleset of about n bytes (a large key
// registry), tagged so that two differ.
func bigRules(n int, tag string) string {
	var b strings.Builder
	b.WriteString("# " + tag + "\nkeys:\n")
	for i := 0; b.Len() < n-len(validRules); i++ {
		fmt.Fprintf(&b, "  sk_bulk_%s_%07d: {tenant: t%d, tier: pro}\n", tag, i, i%100)
	}
	b.WriteString(validRules)
	return b.String()
}

// failAudit makes the broker refuse every produce to the audit topic with
// MESSAGE_TOO_LARGE while on is set.
func failAudit(t *testing.T, c *kfake.Cluster, on *atomic.Bool) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var id [16]byte
	testwait.Eventually(t, 20*time.Second, func() error { // the aggregator creates the topic
		td, err := kadm.NewClient(cl).ListTopics(t.Context(), tollgatev1.TopicAudit)
		if err != nil {
			return err
		}
		d, ok := td[tollgatev1.TopicAudit]
		if !ok || d.Err != nil {
			return fmt.Errorf("audit topic not there yet: %v", d.Err)
		}
		id = d.ID
		return nil
	})
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		pr := req.(*kmsg.ProduceRequest)
		hit := false
		for _, tp := range pr.Topics {
			hit = hit || tp.Topic == tollgatev1.TopicAudit || tp.TopicID == id
		}
		if !on.Load() || !hit {
			return nil, nil, false
		}
		return kafkatest.RefuseProduce(pr, kerr.MessageTooLarge.Code), nil, true
	})
}

// TestAuditBeforeEffect: a change is in force only once its audit entry is
// written. A change whose entry cannot be written does not happen (503
// AUDIT_FAILED; before, it was put in force and answered 500), and audit
// entries always fit the audit topic: two rulesets of half a megabyte
// each (before and after ≈ 1 MB, over Kafka's record limit) are audited
// with the old one's source replaced by its hash.
func TestAuditBeforeEffect(t *testing.T) {
	c := startKafkaBroker(t).Cluster()
	in, js := startFleetAggregatorOn(t, c.ListenAddrs())
	addr := in.srv.Addrs().API

	a, b := bigRules(505<<10, "a"), bigRules(505<<10, "b")
	for _, src := range []string{a, b} {
		if code, _, body := op(t, addr, "PUT", "/admin/v1/rules", src); code != 200 {
			t.Fatalf("PUT of %d bytes: %d %.300s", len(src), code, body)
		}
	}
	if _, _, got := op(t, addr, "GET", "/admin/v1/rules", ""); string(got) != b {
		t.Fatal("the second large ruleset is not in force")
	}
	waitAudit(t, addr, "rules", `"version":2`, `"source_omitted"`, `"bytes":`+fmt.Sprint(len(a)))
	if code, _, body := op(t, addr, "PUT", "/admin/v1/rules", bigRules(600<<10, "c")); code != 413 {
		t.Fatalf("a ruleset over the bound: %d %.300s, want 413", code, body)
	}

	var failing atomic.Bool
	failAudit(t, c, &failing)
	failing.Store(true)
	code, _, body := op(t, addr, "PUT", "/admin/v1/rules", validRules)
	if code != 503 || errorCode(body) != "AUDIT_FAILED" {
		t.Fatalf("PUT while the audit topic refuses: %d %s, want 503 AUDIT_FAILED", code, body)
	}
	if code, hdr, _ := op(t, addr, "GET", "/admin/v1/rules", ""); code != 200 || hdr.Get("ETag") != `"2"` {
		t.Fatalf("the unaudited ruleset took effect: version %s", hdr.Get("ETag"))
	}
	if code, _, body := op(t, addr, "PUT", "/admin/v1/blocklist/sk_unaudited", `{}`); code != 503 || errorCode(body) != "AUDIT_FAILED" {
		t.Fatalf("blocklist PUT while the audit topic refuses: %d %s", code, body)
	}
	h, _ := keyid.New([]byte(secret))
	if kvHas(t, js, tollgatev1.BucketBlocklist, h.ID("sk_unaudited")) {
		t.Fatal("the unaudited blocklist entry took effect")
	}
	failing.Store(false)
	testwait.Eventually(t, 20*time.Second, func() error {
		if code, _, body := op(t, addr, "PUT", "/admin/v1/rules", validRules); code != 200 {
			return fmt.Errorf("PUT once the audit topic takes entries again: %d %s", code, body)
		}
		return nil
	})
}

// TestUnconditionalWritesNeverConflict: writes without If-Match mean
// "whatever is there", so concurrent ones all succeed, each a version of
// its own (before, some answered 412).
func TestUnconditionalWritesNeverConflict(t *testing.T) {
	in, _ := startFleetAggregator(t)
	addr := in.srv.Addrs().API
	const writers = 12
	var wg sync.WaitGroup
	versions := make(chan string, writers)
	for i := range writers {
		wg.Go(func() {
			code, hdr, b := op(t, addr, "PUT", "/admin/v1/rules", fmt.Sprintf("%s# writer %d\n", validRules, i))
			if code != 200 {
				t.Errorf("writer %d: %d %s", i, code, b)
			}
			versions <- hdr.Get("ETag")
			code, _, b = op(t, addr, "PUT", "/admin/v1/overrides/sk_shared", fmt.Sprintf(`{"limit":%d}`, 100+i))
			if code != 200 {
				t.Errorf("override writer %d: %d %s", i, code, b)
			}
		})
	}
	wg.Wait()
	close(versions)
	seen := map[string]bool{}
	for v := range versions {
		seen[v] = true
	}
	if len(seen) != writers {
		t.Fatalf("versions %v: want %d distinct", seen, writers)
	}
}

// TestKeysWithControlCharacters: list and override keys a gateway would
// refuse as an identity (control characters, spaces) are refused 400
// INVALID_KEY: no request could carry them (before, they were stored).
func TestKeysWithControlCharacters(t *testing.T) {
	in, _ := startFleetAggregator(t)
	addr := in.srv.Addrs().API
	for _, path := range []string{"/admin/v1/blocklist/sk_bad%01key", "/admin/v1/allowlist/sk_bad%7Fkey", "/admin/v1/overrides/sk_bad%0Akey",
		"/admin/v1/blocklist/sk_bad%20key", "/admin/v1/blocklist/sk_bad%C2%85key"} {
		body := `{}`
		if strings.Contains(path, "overrides") {
			body = `{"limit":5}`
		}
		if code, _, b := op(t, addr, "PUT", path, body); code != 400 || errorCode(b) != "INVALID_KEY" {
			t.Errorf("PUT %s: %d %s, want 400 INVALID_KEY", path, code, b)
		}
	}
	if code, _, b := op(t, addr, "PUT", "/admin/v1/overrides/tenant:acme%01corp", `{"limit":5}`); code != 400 {
		t.Errorf("tenant with a control character: %d %s, want 400", code, b)
	}
	if code, _, b := op(t, addr, "PUT", "/admin/v1/blocklist/sk_fine_key", `{}`); code != 200 {
		t.Errorf("a good key: %d %s", code, b)
	}
}

// TestForgedChangeRefused: with admin_insecure (no token), a cross-site
// text/plain POST — what any web page can make a browser send — is
// refused and grants nothing (before, it granted 1000 tokens); a request
// with a bearer header is served.
func TestForgedChangeRefused(t *testing.T) {
	in, _ := startFleetAggregatorOn(t, startKafka(t), func(c *aggregator.Config) { c.AdminToken, c.AdminInsecure = "", true })
	addr := in.srv.Addrs().API
	if code, _, b := op(t, addr, "PUT", "/admin/v1/rules", validRules); code != 200 {
		t.Fatalf("PUT rules with a bearer header: %d %s", code, b)
	}
	code, _, _, err := exchange(http.DefaultClient, "POST", "http://"+addr+"/admin/v1/keys/sk_some_client/quota", `{"tokens":1000}`,
		"Content-Type", "text/plain", "Origin", "https://evil.example")
	if err != nil {
		t.Fatal(err)
	}
	if code != 401 {
		t.Fatalf("forged quota grant: %d, want 401", code)
	}
	if code, _, b := op(t, addr, "POST", "/admin/v1/keys/sk_some_client/quota", `{"tokens":1000}`); code != 200 {
		t.Fatalf("quota with a bearer header: %d %s", code, b)
	}
	waitAudit(t, addr, "quota", `"tokens":1000`)
	_, _, b := op(t, addr, "GET", "/admin/v1/audit?kind=quota", "")
	if n := bytes.Count(b, []byte(`"kind": "quota"`)); n != 1 {
		t.Fatalf("%d quota entries, want 1 (the forged request must leave none): %s", n, b)
	}
}
