package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"github.com/tollgate/tollgate/aggregator"
	"github.com/tollgate/tollgate/aggregator/internal/audit"
	"github.com/tollgate/tollgate/compose/kafkabroker"
	"github.com/tollgate/tollgate/compose/kafkabroker/kafkatest"
	"github.com/tollgate/tollgate/internal/logtest"
	"github.com/tollgate/tollgate/internal/testnet"
	"github.com/tollgate/tollgate/internal/testwait"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

const token = "audit-test-admin-token"

// TestAuditEverywhereAndSnapshot writes audit entries, sees them on two
// instances, snapshots one, writes more, and reads the snapshot offline:
// it answers as of its time.
func TestAuditEverywhereAndSnapshot(t *testing.T) {
	brokers := kafkatest.StartTB(t).Addrs()
	start := func(id string) *aggregator.Server {
		cfg := aggregator.Config{Listen: "127.0.0.1:0", MetricsListen: aggregator.Off, ID: id, DataDir: t.TempDir(),
			AdminToken: token, KeySecret: "0123456789abcdef-secret", SessionTimeout: 2 * time.Second}
		cfg.Kafka.Brokers = brokers
		srv, err := aggregator.New(cfg, logtest.Verbose(t))
		if err != nil {
			t.Fatal(err)
		}
		testnet.RunUntilCleanup(t, "aggregator "+id, srv.Run)
		return srv
	}
	a, b := start("a"), start("b")
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	w := audit.NewWriter(cl, tollgatev1.TopicAudit)
	write := func(kind, subject, reason string) {
		t.Helper()
		// The topic is created by the aggregator's processor.
		testwait.Eventually(t, 20*time.Second, func() error {
			return w.Write(context.Background(), &tollgatev1.AuditEntry{Actor: "ops", Kind: kind, Subject: subject, Reason: reason,
				Before: []byte(`{"limit":10}`), After: []byte(`{"limit":20}`)})
		})
	}
	count := func(srv *aggregator.Server, query string) (int, error) {
		req, _ := http.NewRequest("GET", "http://"+srv.Addrs().API+"/admin/v1/audit?"+query, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		var out struct{ Entries []json.RawMessage }
		if err := json.Unmarshal(body, &out); err != nil {
			return 0, fmt.Errorf("%d %s", resp.StatusCode, body)
		}
		return len(out.Entries), nil
	}
	write(audit.KindRules, "rules", "raise pro")
	write(audit.KindBlocklist, "kid-aaaaaaaaaaaaaaaaaa", "abuse")
	for _, srv := range []*aggregator.Server{a, b} {
		testwait.Eventually(t, 20*time.Second, func() error {
			if n, err := count(srv, ""); err != nil || n != 2 {
				return fmt.Errorf("%d entries (%v), want 2", n, err)
			}
			return nil
		})
	}
	if n, _ := count(a, "kind=blocklist"); n != 1 {
		t.Errorf("kind filter: %d entries, want 1", n)
	}
	if n, _ := count(a, "subject=rules"); n != 1 {
		t.Errorf("subject filter: %d entries, want 1", n)
	}
	snap, err := a.Snapshot(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	write(audit.KindOverride, "kid-aaaaaaaaaaaaaaaaaa", "vip")
	testwait.Eventually(t, 20*time.Second, func() error {
		if n, _ := count(a, ""); n != 3 {
			return fmt.Errorf("%d entries, want 3", n)
		}
		return nil
	})
	var out, errOut bytes.Buffer
	if code := run(t.Context(), []string{"audit", "--snapshot", snap, "--no-usage"}, func(string) (string, bool) { return "", false }, &out, &errOut); code != 0 {
		t.Fatalf("audit exit %d: %s", code, errOut.String())
	}
	if lines := strings.Count(out.String(), "\n"); lines != 2 {
		t.Fatalf("snapshot holds %d entries, want the 2 written before it:\n%s", lines, out.String())
	}
	out.Reset()
	run(t.Context(), []string{"audit", "--snapshot", snap, "--kind", "blocklist", "--no-usage"}, func(string) (string, bool) { return "", false }, &out, &errOut)
	if !strings.Contains(out.String(), `"reason":"abuse"`) || strings.Count(out.String(), "\n") != 1 {
		t.Fatalf("kind filter on the snapshot: %s", out.String())
	}
}

// TestPenaltyStepsInSnapshot: a key ignoring Retry-After climbs the
// ladder; a snapshot holds each step's audit entry with its evidence, and
// the offline reader shows them.
func TestPenaltyStepsInSnapshot(t *testing.T) {
	brokers := kafkatest.StartTB(t, kafkabroker.WithPartitions(3), kafkabroker.WithSeedTopics(tollgatev1.TopicDecisions)).Addrs()
	cfg := aggregator.Config{Listen: "127.0.0.1:0", MetricsListen: aggregator.Off, ID: "a", DataDir: t.TempDir(),
		AdminToken: token, KeySecret: "0123456789abcdef-secret", SessionTimeout: 2 * time.Second,
		Penalty: aggregator.PenaltyConfig{Window: 2 * time.Second, BackoffMinIgnored: 20, Grace: 100 * time.Millisecond}}
	cfg.Kafka.Brokers = brokers
	srv, err := aggregator.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	testnet.RunUntilCleanup(t, "aggregator", srv.Run)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	const id = "snapsnapsnapsnapsnap00"
	q := tollgatev1.PartitionOf(id, 3)
	var seq uint64
	count := func() int {
		req, _ := http.NewRequest("GET", "http://"+srv.Addrs().API+"/admin/v1/audit?kind=penalty&key=kid:"+id, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		defer resp.Body.Close()
		var out struct{ Entries []json.RawMessage }
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return len(out.Entries)
	}
	testwait.Eventually(t, 60*time.Second, func() error {
		// A burst of rejections whose Retry-After the key ignores.
		for range 30 {
			seq++
			v, _ := proto.Marshal(&tollgatev1.DecisionEvent{GatewayId: "gw", Epoch: 1, Partition: q, Seq: seq,
				TimeUnixMicros: time.Now().UnixMicro(), Kind: tollgatev1.DecisionEvent_KIND_DECISION, KeyId: id, Tenant: id,
				Endpoint: "/v1/x", Reason: "rate_limited", Status: 429, RetryAfterSeconds: 5})
			if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: tollgatev1.TopicDecisions, Partition: q, Key: []byte(id), Value: v}).FirstErr(); err != nil {
				return err
			}
		}
		if n := count(); n < 3 {
			return fmt.Errorf("%d penalty steps audited, want 3", n)
		}
		return nil
	})
	snap, err := srv.Snapshot(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if code := run(t.Context(), []string{"audit", "--snapshot", snap, "--kind", "penalty", "--key", "kid:" + id, "--no-usage"},
		func(string) (string, bool) { return "", false }, &out, &errOut); code != 0 {
		t.Fatalf("audit exit %d: %s", code, errOut.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("snapshot holds %d penalty entries, want 3:\n%s", len(lines), out.String())
	}
	for i, l := range lines {
		var e struct {
			Actor    string
			Subject  string
			After    struct{ Level int }
			Evidence []struct {
				Detector       string
				IgnoredBackoff int64 `json:"ignored_backoff"`
			}
		}
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatal(err)
		}
		if e.After.Level != i+1 || e.Subject != id || e.Actor == "" || len(e.Evidence) == 0 || e.Evidence[0].IgnoredBackoff < 20 {
			t.Errorf("entry %d: %s", i, l)
		}
	}
}
