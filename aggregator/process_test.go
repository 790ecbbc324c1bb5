package aggregator_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/aggregator"
	"github.com/tollgate/tollgate/internal/logtest"
	"github.com/tollgate/tollgate/internal/testwait"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// processEnv makes the test binary run one aggregator instance as a child
// process, configured by the TOLLGATE_* environment, printing its API
// address; the parent SIGKILLs it.
const processEnv = "TOLLGATE_AGGREGATOR_TEST_PROCESS"

func TestAggregatorProcess(t *testing.T) {
	if os.Getenv(processEnv) != "1" {
		t.Skip("child process of the SIGKILL tests")
	}
	cfg, err := aggregator.LoadConfig("", nil)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := aggregator.New(cfg, logtest.Verbose(t).With("aggregator", cfg.ID))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("api %s %s\n", srv.Addrs().API, srv.Addrs().Metrics)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := srv.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

// child is an aggregator instance in its own process.
type child struct {
	cmd     *exec.Cmd
	api     string
	metrics string
	once    sync.Once
}

// owns reports whether the child is ready and processes at least one
// partition.
func (c *child) owns() error {
	r, code, err := getReadyz(c.metrics)
	if err != nil {
		return err
	}
	if code != http.StatusOK || len(r.Processing.Partitions) == 0 {
		return fmt.Errorf("child owns no partition yet: %d %+v", code, r)
	}
	return nil
}

func startChild(t *testing.T, brokers []string, id, dir string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestAggregatorProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), processEnv+"=1",
		"TOLLGATE_KAFKA_BROKERS="+strings.Join(brokers, ","),
		fmt.Sprintf("TOLLGATE_KAFKA_PARTITIONS=%d", partitions),
		"TOLLGATE_AGGREGATOR_ID="+id,
		"TOLLGATE_DATA_DIR="+dir,
		"TOLLGATE_AGGREGATOR_LISTEN=127.0.0.1:0",
		"TOLLGATE_AGGREGATOR_METRICS_LISTEN=127.0.0.1:0",
		"TOLLGATE_ADMIN_TOKEN="+token,
		"TOLLGATE_KEY_SECRET="+secret,
		"TOLLGATE_AGGREGATOR_SESSION_TIMEOUT=2s",
		"TOLLGATE_AGGREGATOR_TRANSACTION_TIMEOUT=3s",
		"TOLLGATE_USAGE_LATENESS=1s",
	)
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd}
	t.Cleanup(func() { c.kill() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if !strings.HasPrefix(line, "api ") {
		c.kill()
		t.Fatalf("child printed %q: %v", line, err)
	}
	f := strings.Fields(line)
	c.api, c.metrics = f[1], f[2]
	return c
}

func (c *child) kill() {
	c.once.Do(func() {
		_ = c.cmd.Process.Signal(syscall.SIGKILL)
		_ = c.cmd.Wait()
	})
}

// sender emits decisions from a background goroutine until stopped, so a
// kill lands mid-stream; it returns what it sent per tenant.
func sender(t *testing.T, gw *gateway, now time.Time) (stop func() map[string]*counts) {
	want := map[string]*counts{}
	stopLoop := inBackground(func(i int) {
		if i%10 == 0 {
			<-time.After(time.Millisecond) // a stream, not one burst
		}
		gw.emitCounted(t, want, fmt.Sprint("tenant-", i%9), fmt.Sprint("key-", i%11), i%4 != 0, now)
	})
	return func() map[string]*counts {
		stopLoop()
		return want
	}
}

// inBackground calls step(0), step(1), … from a goroutine until stop is
// called; stop (idempotent) returns once the goroutine has.
func inBackground(step func(i int)) (stop func()) {
	quit := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-quit:
				return
			default:
			}
			step(i)
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(quit); <-done }) }
}

// waitSent waits until the gateway has sent at least n events.
func waitSent(gw *gateway, n int) {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		gw.mu.Lock()
		sent := len(gw.sent)
		gw.mu.Unlock()
		if sent >= n {
			return
		}
		<-time.After(5 * time.Millisecond)
	}
}

// TestSIGKILLAndRestart kills an aggregator process mid-stream and starts
// it again on the same data directory: the report is exact.
func TestSIGKILLAndRestart(t *testing.T) {
	brokers := startKafka(t)
	dir := t.TempDir()
	a := startChild(t, brokers, "a", dir)
	gw := newGateway(t, brokers, "gw-1", 7)
	stop := sender(t, gw, time.Now())
	testwait.Eventually(t, 30*time.Second, a.owns)
	waitSent(gw, 500)
	a.kill()
	waitSent(gw, 1500)
	a = startChild(t, brokers, "a", dir)
	waitSent(gw, 2500)
	want := stop()
	waitTotals(t, a.api, want)
}

// TestSIGKILLForGood runs two aggregator processes, kills one mid-stream
// and never restarts it: the survivor takes its partitions over (after the
// session timeout) and its report is exact.
func TestSIGKILLForGood(t *testing.T) {
	brokers := startKafka(t)
	a := startChild(t, brokers, "a", t.TempDir())
	b := startChild(t, brokers, "b", t.TempDir())
	gw := newGateway(t, brokers, "gw-1", 9)
	stop := sender(t, gw, time.Now())
	testwait.Eventually(t, 30*time.Second, a.owns)
	testwait.Eventually(t, 30*time.Second, b.owns)
	waitSent(gw, 1000)
	a.kill()
	waitSent(gw, 2000)
	want := stop()
	start := time.Now()
	waitTotals(t, b.api, want)
	t.Logf("survivor exact %v after the last decision", time.Since(start))
}

// penaltyEnv is a ladder for the SIGKILL tests: level 1 after 20 ignored
// Retry-Afters in 2s, the next level no sooner than 2s later, no step
// down within the test.
var penaltyEnv = []string{"TOLLGATE_PENALTY_WINDOW=2s", "TOLLGATE_PENALTY_BACKOFF_MIN_IGNORED=20",
	"TOLLGATE_PENALTY_GRACE=2s", "TOLLGATE_PENALTY_QUIET_PERIOD=1h", "TOLLGATE_PENALTY_REDUCED_FOR=1h",
	"TOLLGATE_PENALTY_COOLDOWN_FOR=1h", "TOLLGATE_PENALTY_BLOCK_FOR=1h"}

// storm has a gateway gw-1 of epoch emit, from a background goroutine
// until stopped, 100 rejections a second of key ("kid:" and its key_id)
// that ignores their Retry-After, and normal traffic of other tenants
// besides; it returns once api shows the key's first step (or more: the
// storm goes on while api is polled).
func storm(t *testing.T, brokers []string, epoch uint64, key, api string) (keyID string, stop func()) {
	gw := newGateway(t, brokers, "gw-1", epoch)
	keyID = strings.TrimPrefix(key, "kid:")
	stop = inBackground(func(i int) {
		<-time.After(10 * time.Millisecond)
		gw.send(t, &tollgatev1.DecisionEvent{TimeUnixMicros: time.Now().UnixMicro(), Kind: tollgatev1.DecisionEvent_KIND_DECISION,
			KeyId: keyID, KeyPrefix: "sk_…", Tenant: keyID, Endpoint: "/v1/x", Allowed: false, Reason: "rate_limited",
			Status: 429, RetryAfterSeconds: 5})
		gw.emit(t, fmt.Sprint("tenant-", i%5), fmt.Sprint("key-", i%7), true, time.Now())
	})
	t.Cleanup(stop)
	waitClimbed(t, api, key, 30*time.Second, "reduced_limit→1")
	return keyID, stop
}

// TestPenaltySurvivesSIGKILL kills an aggregator process while a key
// climbs the ladder and starts it again on its data directory: the key
// keeps its level and goes on climbing from it — its history is 1, 2, 3
// with no step lost, repeated or reset.
func TestPenaltySurvivesSIGKILL(t *testing.T) {
	brokers := startKafka(t)
	dir := t.TempDir()
	a := startChild(t, brokers, "a", dir, penaltyEnv...)
	testwait.Eventually(t, 30*time.Second, a.owns)
	const key = "kid:stormstormstormstorm00"
	_, stop := storm(t, brokers, 11, key, a.api)
	a.kill()
	a = startChild(t, brokers, "a", dir, penaltyEnv...)
	testwait.Eventually(t, 30*time.Second, func() error {
		p, err := getPenalty(t, a.api, key)
		if err != nil {
			return err
		}
		if p.Level < 1 || p.Step < 1 {
			return fmt.Errorf("after the restart: level %d step %d", p.Level, p.Step)
		}
		return nil
	})
	p := waitChanges(t, a.api, key, 60*time.Second, "reduced_limit→1", "cooldown→2", "blocklist→3")
	stop()
	if p.Level != 3 || p.Step != 3 {
		t.Fatalf("after the restart: %+v", p)
	}
}

// TestPenaltySurvivesLostInstance runs two aggregator processes and
// SIGKILLs for good the one that owns a climbing key's partition: the
// survivor takes the partition over with the key's level and evidence,
// and the key goes on climbing from its level.
func TestPenaltySurvivesLostInstance(t *testing.T) {
	brokers := startKafka(t)
	a := startChild(t, brokers, "a", t.TempDir(), penaltyEnv...)
	b := startChild(t, brokers, "b", t.TempDir(), penaltyEnv...)
	testwait.Eventually(t, 30*time.Second, a.owns)
	testwait.Eventually(t, 30*time.Second, b.owns)
	const key = "kid:lostlostlostlostlost00"
	id, stop := storm(t, brokers, 12, key, b.api)
	// Kill the owner of the key's partition; the other survives.
	owner, survivor := a, b
	if b.ownsPartition(t, partitionOf(id)) {
		owner, survivor = b, a
	}
	owner.kill()
	p := waitChanges(t, survivor.api, key, 60*time.Second, "reduced_limit→1", "cooldown→2", "blocklist→3")
	stop()
	if p.Level != 3 || p.Step != 3 {
		t.Fatalf("on the survivor: %+v", p)
	}
}

// ownsPartition reports whether the child processes decisions partition q.
func (c *child) ownsPartition(t *testing.T, q int32) bool {
	r, _, err := getReadyz(c.metrics)
	if err != nil {
		t.Fatal(err)
	}
	return slices.Contains(r.Processing.Partitions, q)
}
