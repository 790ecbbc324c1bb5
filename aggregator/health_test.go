package aggregator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tollgate/tollgate/aggregator"
	"github.com/tollgate/tollgate/compose/kafkabroker"
	"github.com/tollgate/tollgate/compose/kafkabroker/kafkatest"
	"github.com/tollgate/tollgate/compose/natsserver"
	"github.com/tollgate/tollgate/compose/natsserver/natstest"
	"github.com/tollgate/tollgate/compose/redisserver"
	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/internal/logtest"
	"github.com/tollgate/tollgate/internal/testwait"
)

// answerWithin is how fast /healthz, /readyz and the API must answer,
// whatever the dependencies do.
const answerWithin = time.Second

// readyzBody is the part of /readyz the tests read.
type readyzBody struct {
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
	Since   time.Time
	Kafka   depBody `json:"kafka"`
	State   struct {
		Status string `json:"status"`
	} `json:"state"`
	Processing struct {
		Status     string  `json:"status"`
		Partitions []int32 `json:"partitions"`
	} `json:"processing"`
	NATS  *depBody `json:"nats"`
	Redis depBody  `json:"redis"`
}

type depBody struct {
	Status string    `json:"status"`
	Since  time.Time `json:"since"`
	Error  string    `json:"error"`
}

// timedClient gives up after twice answerWithin; callers check the
// duration themselves.
var timedClient = &http.Client{Timeout: 2 * answerWithin}

// call sends a request (with the operator token) and returns the status,
// the body and how long the answer took.
func call(method, url string, body io.Reader) (int, []byte, time.Duration, error) {
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		return 0, nil, 0, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	start := time.Now()
	resp, err := timedClient.Do(req)
	if err != nil {
		return 0, nil, time.Since(start), err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, time.Since(start), err
}

// getReadyz reads /readyz.
func getReadyz(metrics string) (readyzBody, int, error) {
	code, b, took, err := call("GET", "http://"+metrics+"/readyz", nil)
	if err != nil {
		return readyzBody{}, 0, err
	}
	var r readyzBody
	if err := json.Unmarshal(b, &r); err != nil {
		return r, code, fmt.Errorf("readyz %d %q: %w", code, b, err)
	}
	if took > answerWithin {
		return r, code, fmt.Errorf("readyz took %v", took)
	}
	return r, code, nil
}

// prompt checks that a request answers within answerWithin with status
// want, and returns its body.
func prompt(t testing.TB, method, url string, want int) []byte {
	t.Helper()
	code, b, took, err := call(method, url, nil)
	if err != nil {
		t.Fatalf("%s %s: %v after %v (want an answer within %v)", method, url, err, took, answerWithin)
	}
	if took > answerWithin {
		t.Errorf("%s %s answered after %v, want within %v", method, url, took, answerWithin)
	}
	if code != want {
		t.Errorf("%s %s: %d %s, want %d", method, url, code, b, want)
	}
	return b
}

// errorCode returns the code of a JSON error answer.
func errorCode(b []byte) string {
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	_ = json.Unmarshal(b, &e)
	return e.Error.Code
}

// waitReadyz polls /readyz until check accepts it, failing the test if
// any answer takes longer than answerWithin; it returns the body accepted
// and how long it took.
func waitReadyz(t testing.TB, metrics string, timeout time.Duration, check func(readyzBody, int) error) (readyzBody, time.Duration) {
	t.Helper()
	var last readyzBody
	took := testwait.Eventually(t, timeout, func() error {
		r, code, err := getReadyz(metrics)
		if err != nil {
			if strings.Contains(err.Error(), "took") {
				t.Error(err)
			}
			return err
		}
		last = r
		return check(r, code)
	})
	return last, took
}

// ready accepts a 200 /readyz.
func ready(r readyzBody, code int) error {
	if code != http.StatusOK || r.Status != "ready" {
		return fmt.Errorf("not ready: %d %+v", code, r)
	}
	return nil
}

// healthStack is an aggregator with Kafka, NATS and Redis, each a real
// server that the test can take down and bring back.
type healthStack struct {
	kafka *kafkabroker.Broker
	nats  *natsserver.Server
	redis *redisserver.Server
	cfg   aggregator.Config
}

func newHealthStack(t *testing.T) *healthStack {
	h := &healthStack{kafka: kafkatest.StartTB(t), nats: natstest.StartTB(t), redis: redistest.StartTB(t)}
	h.cfg = testConfig([]string{h.kafka.Addr()}, "a", t.TempDir())
	h.cfg.NATS.URL = h.nats.ClientURL()
	h.cfg.Redis.Addrs = []string{h.redis.Addr()}
	return h
}

// fault is one dependency's outage.
type fault struct {
	name       string
	down, up   func(t *testing.T, h *healthStack)
	readyWhile bool                    // /readyz stays 200 during the outage
	named      func(r readyzBody) bool // /readyz names the outage
	// api checks the API during the outage.
	api func(t *testing.T, api string, atStart bool)
}

var faults = []fault{
	{
		name: "kafka",
		down: func(t *testing.T, h *healthStack) { must(t, h.kafka.Down()) },
		up:   func(t *testing.T, h *healthStack) { must(t, h.kafka.Up(t.Context())) },
		named: func(r readyzBody) bool {
			return r.Reason == "kafka_unreachable" && r.Kafka.Status == "disconnected" && !r.Kafka.Since.IsZero()
		},
		api: func(t *testing.T, api string, atStart bool) {
			if atStart {
				b := prompt(t, "GET", "http://"+api+"/v1/usage/tenants/acme", http.StatusServiceUnavailable)
				if errorCode(b) != "STATE_RESTORING" || !strings.Contains(string(b), "Kafka") {
					t.Errorf("usage report while Kafka is down at start: %s, want STATE_RESTORING naming Kafka", b)
				}
			} else {
				prompt(t, "GET", "http://"+api+"/v1/usage/tenants/acme", http.StatusOK)
			}
			b := prompt(t, "PUT", "http://"+api+"/admin/v1/blocklist/kid:blockblockblockblock00?reason=test", http.StatusServiceUnavailable)
			if errorCode(b) != "KAFKA_UNAVAILABLE" {
				t.Errorf("operator change while Kafka is down: %s, want KAFKA_UNAVAILABLE", b)
			}
			if atStart {
				b := prompt(t, "GET", "http://"+api+"/admin/v1/rules", http.StatusServiceUnavailable)
				if errorCode(b) != "KAFKA_UNAVAILABLE" {
					t.Errorf("rules while Kafka is down at start: %s, want KAFKA_UNAVAILABLE", b)
				}
			} else {
				// NATS answers: no ruleset was written in this test.
				prompt(t, "GET", "http://"+api+"/admin/v1/rules", http.StatusNotFound)
			}
		},
	},
	{
		name:       "nats",
		down:       func(t *testing.T, h *healthStack) { must(t, h.nats.Down()) },
		up:         func(t *testing.T, h *healthStack) { must(t, h.nats.Up(t.Context())) },
		readyWhile: true,
		named:      func(r readyzBody) bool { return r.NATS != nil && r.NATS.Status == "disconnected" && r.NATS.Error != "" },
		api: func(t *testing.T, api string, _ bool) {
			b := prompt(t, "GET", "http://"+api+"/admin/v1/rules", http.StatusServiceUnavailable)
			if errorCode(b) != "NATS_UNAVAILABLE" {
				t.Errorf("rules while NATS is down: %s, want NATS_UNAVAILABLE", b)
			}
		},
	},
	{
		name:       "redis killed",
		down:       func(t *testing.T, h *healthStack) { must(t, h.redis.Kill()) },
		up:         func(t *testing.T, h *healthStack) { must(t, h.redis.Restart(t.Context())) },
		readyWhile: true,
		named:      func(r readyzBody) bool { return r.Redis.Status == "disconnected" && r.Redis.Error != "" },
	},
	{
		name:       "redis hung",
		down:       func(t *testing.T, h *healthStack) { must(t, h.redis.Pause()) },
		up:         func(t *testing.T, h *healthStack) { must(t, h.redis.Resume()) },
		readyWhile: true,
		named:      func(r readyzBody) bool { return r.Redis.Status == "disconnected" && r.Redis.Error != "" },
	},
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestHealthUnderDependencyFaults takes Kafka, NATS or Redis down before
// the aggregator starts, or once it is ready: /healthz and /readyz answer
// within a second throughout, /readyz names the missing dependency and
// since when, readiness fails only when the instance cannot count
// (Kafka), the API answers at once with the reason, and all is well once
// the dependency is back.
func TestHealthUnderDependencyFaults(t *testing.T) {
	for _, f := range faults {
		for _, atStart := range []bool{true, false} {
			name := f.name + "/lost later"
			if atStart {
				name = f.name + "/down at start"
			}
			t.Run(name, func(t *testing.T) {
				h := newHealthStack(t)
				if atStart {
					f.down(t, h)
				}
				in := runAggregator(t, h.cfg)
				addrs := in.srv.Addrs()
				if !atStart {
					waitReadyz(t, addrs.Metrics, 60*time.Second, ready)
					f.down(t, h)
				}
				prompt(t, "GET", "http://"+addrs.Metrics+"/healthz", http.StatusOK)
				r, took := waitReadyz(t, addrs.Metrics, 15*time.Second, func(r readyzBody, code int) error {
					if !f.named(r) {
						return fmt.Errorf("readyz does not name the %s outage: %d %+v", f.name, code, r)
					}
					if f.readyWhile && code != http.StatusOK {
						return fmt.Errorf("readyz %d while only %s is down: %+v", code, f.name, r)
					}
					if !f.readyWhile && code != http.StatusServiceUnavailable {
						return fmt.Errorf("readyz %d while %s is down: %+v", code, f.name, r)
					}
					return nil
				})
				t.Logf("readyz named the outage after %v: %s %s %s; kafka %+v nats %+v redis %+v", took.Round(time.Millisecond),
					r.Status, r.Reason, r.Message, r.Kafka, *r.NATS, r.Redis)
				prompt(t, "GET", "http://"+addrs.Metrics+"/healthz", http.StatusOK)
				if f.api != nil {
					f.api(t, addrs.API, atStart)
				}
				f.up(t, h)
				_, took = waitReadyz(t, addrs.Metrics, 60*time.Second, func(r readyzBody, code int) error {
					if err := ready(r, code); err != nil {
						return err
					}
					for name, d := range map[string]depBody{"kafka": r.Kafka, "nats": *r.NATS, "redis": r.Redis} {
						if d.Status != "connected" {
							return fmt.Errorf("%s %+v after the outage", name, d)
						}
					}
					return nil
				})
				t.Logf("ready and connected %v after the dependency came back", took.Round(time.Millisecond))
				// It counts.
				gw := newGateway(t, h.cfg.Kafka.Brokers, "gw-1", 3)
				for range 10 {
					gw.emit(t, "acme", "key-1", true, time.Now())
				}
				waitTotals(t, addrs.API, map[string]*counts{"acme": {allowed: 10}})
			})
		}
	}
}

// TestNotReadyWhileTransactionsFail makes the broker refuse or hold the
// processor's transactions: /readyz turns 503 with the reason, and once
// the broker behaves the instance recovers by itself and its totals are
// exact.
func TestNotReadyWhileTransactionsFail(t *testing.T) {
	tests := []struct {
		name   string
		reason string
		// fault makes the broker misbehave until release is closed.
		fault func(b *kafkabroker.Broker, release <-chan struct{})
	}{
		{name: "commit refused", reason: "transaction_failed", fault: refuseEndTxn},
		{name: "produce held", reason: "stalled", fault: holdTransactionalProduce},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := kafkatest.StartTB(t)
			cfg := testConfig([]string{b.Addr()}, "a", t.TempDir())
			cfg.TransactionTimeout = 3 * time.Second // stalled after 6s
			in := runAggregator(t, cfg)
			addrs := in.srv.Addrs()
			waitReadyz(t, addrs.Metrics, 60*time.Second, ready)
			gw := newGateway(t, cfg.Kafka.Brokers, "gw-1", 5)
			want := map[string]*counts{"acme": {}}
			emit := func(n int) {
				for range n {
					gw.emit(t, "acme", "key-1", true, time.Now())
					want["acme"].allowed++
				}
			}
			emit(5)
			waitTotals(t, addrs.API, want)
			release := make(chan struct{})
			released := false
			defer func() {
				if !released {
					close(release)
				}
			}()
			tt.fault(b, release)
			emit(5)
			r, took := waitReadyz(t, addrs.Metrics, 30*time.Second, func(r readyzBody, code int) error {
				if code != http.StatusServiceUnavailable || r.Reason != tt.reason {
					return fmt.Errorf("readyz %d %+v, want 503 %s", code, r, tt.reason)
				}
				return nil
			})
			t.Logf("readyz after %v: %s %s: %s", took.Round(time.Millisecond), r.Status, r.Reason, r.Message)
			close(release)
			released = true
			emit(5)
			_, took = waitReadyz(t, addrs.Metrics, 60*time.Second, ready)
			t.Logf("ready again %v after the broker behaves", took.Round(time.Millisecond))
			waitTotals(t, addrs.API, want)
		})
	}
}

// refuseEndTxn answers every EndTxn with INVALID_TXN_STATE until release.
func refuseEndTxn(b *kafkabroker.Broker, release <-chan struct{}) {
	controlUntil(b, kmsg.EndTxn, release, func(c *kfake.Cluster, req kmsg.Request) (kmsg.Response, error, bool) {
		r := req.(*kmsg.EndTxnRequest)
		resp := r.ResponseKind().(*kmsg.EndTxnResponse)
		resp.ErrorCode = kerr.InvalidTxnState.Code
		return resp, nil, true
	})
}

// holdTransactionalProduce holds every transactional produce request
// until release.
func holdTransactionalProduce(b *kafkabroker.Broker, release <-chan struct{}) {
	controlUntil(b, kmsg.Produce, release, func(c *kfake.Cluster, req kmsg.Request) (kmsg.Response, error, bool) {
		if req.(*kmsg.ProduceRequest).TransactionID != nil {
			c.SleepControl(func() { <-release })
		}
		return nil, nil, false
	})
}

// controlUntil has the broker's requests of key answered by control until
// release is closed; from then on the broker answers them itself.
func controlUntil(b *kafkabroker.Broker, key kmsg.Key, release <-chan struct{},
	control func(c *kfake.Cluster, req kmsg.Request) (kmsg.Response, error, bool)) {
	c := b.Cluster()
	c.ControlKey(int16(key), func(req kmsg.Request) (kmsg.Response, error, bool) {
		select {
		case <-release:
			c.DropControl()
			return nil, nil, false
		default:
		}
		c.KeepControl()
		return control(c, req)
	})
}

// TestDuplicateIDRefused starts a second instance with a running
// instance's aggregator_id: it says why it is not ready while it checks,
// then stops with an error naming TOLLGATE_AGGREGATOR_ID, and the first
// goes on counting exactly.
func TestDuplicateIDRefused(t *testing.T) {
	b := kafkatest.StartTB(t)
	brokers := []string{b.Addr()}
	a := startAggregator(t, brokers, "same", t.TempDir())
	waitReadyz(t, a.srv.Addrs().Metrics, 60*time.Second, func(r readyzBody, code int) error {
		if err := ready(r, code); err != nil {
			return err
		}
		if len(r.Processing.Partitions) != partitions {
			return fmt.Errorf("owns %v", r.Processing.Partitions)
		}
		return nil
	})
	gw := newGateway(t, brokers, "gw-1", 8)
	want := map[string]*counts{"acme": {allowed: 3}}
	for range 3 {
		gw.emit(t, "acme", "key-1", true, time.Now())
	}

	srv, err := aggregator.New(testConfig(brokers, "same", t.TempDir()), logtest.Verbose(t).With("aggregator", "same (second)"))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer func() {
		cancel()
		<-done
	}()
	go func() { done <- srv.Run(ctx) }()
	waitReadyz(t, srv.Addrs().Metrics, 30*time.Second, func(r readyzBody, code int) error {
		if code != http.StatusServiceUnavailable || r.Reason != "checking_id" {
			return fmt.Errorf("second instance: %d %+v, want 503 checking_id", code, r)
		}
		return nil
	})
	select {
	case err := <-done:
		done <- err
		if !errors.Is(err, aggregator.ErrDuplicateID) || !strings.Contains(err.Error(), "TOLLGATE_AGGREGATOR_ID") {
			t.Fatalf("second instance stopped with %v, want ErrDuplicateID naming TOLLGATE_AGGREGATOR_ID", err)
		}
		t.Logf("second instance: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("the second instance with the same aggregator_id still runs after 60s")
	}
	for range 3 {
		gw.emit(t, "acme", "key-1", true, time.Now())
	}
	want["acme"].allowed += 3
	waitTotals(t, a.srv.Addrs().API, want)
}
