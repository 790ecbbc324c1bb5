package aggregator_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/aggregator"
	"github.com/tollgate/tollgate/internal/testwait"
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
	srv, err := aggregator.New(cfg, testLogger(t).With("aggregator", cfg.ID))
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

// owns reports whether the child processes at least one partition.
func (c *child) owns() error {
	resp, err := http.Get("http://" + c.metrics + "/readyz")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || strings.Contains(string(b), "owned: []") {
		return fmt.Errorf("child owns no partition yet: %d %s", resp.StatusCode, b)
	}
	return nil
}

func startChild(t *testing.T, brokers []string, id, dir string) *child {
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
			if i%10 == 0 {
				<-time.After(time.Millisecond) // a stream, not one burst
			}
			tenant := fmt.Sprint("tenant-", i%9)
			allowed := i%4 != 0
			gw.emit(t, tenant, fmt.Sprint("key-", i%11), allowed, now)
			if want[tenant] == nil {
				want[tenant] = &counts{}
			}
			if allowed {
				want[tenant].allowed++
			} else {
				want[tenant].rejected++
			}
		}
	}()
	return func() map[string]*counts {
		close(quit)
		<-done
		return want
	}
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
