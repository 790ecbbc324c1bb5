package events_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/compose/kafkabroker"
	"github.com/tollgate/tollgate/gateway/internal/events"
	"github.com/tollgate/tollgate/internal/spawn/spawntest"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// helperEnv makes the test binary act as a helper process: "kfake" runs a
// broker (for benchmarks, so that its CPU is not the producer's), "record"
// runs a producer that records until it is killed.
const helperEnv = "TOLLGATE_EVENTS_HELPER"

// TestMain runs the helper process helperEnv names instead of the tests,
// when the test binary is re-executed as one (startChild).
func TestMain(m *testing.M) {
	if kind := os.Getenv(helperEnv); kind != "" {
		if err := runHelper(kind); err != nil {
			fmt.Fprintf(os.Stderr, "helper %s: %v\n", kind, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runHelper is the body of a helper process.
func runHelper(kind string) error {
	switch kind {
	case "kfake":
		b, err := kafkabroker.Start(context.Background(), kafkabroker.WithPartitions(partitions), kafkabroker.WithSeedTopics(tollgatev1.TopicDecisions))
		if err != nil {
			return err
		}
		defer func() { _ = b.Stop() }()
		fmt.Printf("addr %s\n", b.Addr())
		_, _ = io.Copy(io.Discard, os.Stdin) // until the parent closes it or dies
		return nil
	case "record":
		return recordUntilKilled()
	}
	return fmt.Errorf("unknown helper %q", kind)
}

// child is a helper process started by a test.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
}

// startChild re-execs the test binary as the helper named kind, with env
// added to its environment. The test kills it at the end.
func startChild(tb testing.TB, kind string, env ...string) *child {
	tb.Helper()
	cmd, stdin, stdout := spawntest.Self(tb, nil, append([]string{helperEnv + "=" + kind}, env...)...)
	return &child{cmd: cmd, stdin: stdin, out: bufio.NewScanner(stdout)}
}

// line returns the child's next line of output that starts with prefix,
// without the prefix.
func (c *child) line(tb testing.TB, prefix string) string {
	tb.Helper()
	for c.out.Scan() {
		if s, ok := strings.CutPrefix(c.out.Text(), prefix); ok {
			return s
		}
	}
	tb.Fatalf("helper process ended before printing %q: %v", prefix, c.out.Err())
	return ""
}

// kafkaProcess starts kfake in a child process and returns its address.
func kafkaProcess(tb testing.TB) []string {
	tb.Helper()
	c := startChild(tb, "kfake")
	return []string{c.line(tb, "addr ")}
}

// Environment of the "record" helper.
const (
	envBrokers = "TOLLGATE_EVENTS_BROKERS"
	envSpool   = "TOLLGATE_EVENTS_SPOOL"
)

// recordUntilKilled runs a producer on the brokers and spool the parent
// names and records 50 decisions every millisecond, printing after each
// batch "recorded <n> <unix nanos>": n decisions were recorded (Record
// returned) by then. It stops only when killed.
func recordUntilKilled() error {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cfg := configWithLog(strings.Split(os.Getenv(envBrokers), ","), os.Getenv(envSpool), log)
	cfg.FlushInterval = killFlushInterval
	cfg.MemoryBytes = killMemoryBytes
	p, err := events.New(context.Background(), cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	fmt.Printf("epoch %d\n", p.Epoch())
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	w := bufio.NewWriter(os.Stdout)
	for n := 0; ; {
		select {
		case <-tick.C:
		case err := <-done:
			return fmt.Errorf("run returned before the kill: %v", err)
		}
		recordN(p, n, recordBatch)
		n += recordBatch
		fmt.Fprintf(w, "recorded %d %d\n", n, time.Now().UnixNano())
		if err := w.Flush(); err != nil {
			return err
		}
	}
}

// recordBatch is how many decisions the "record" helper records between
// two reports: after a SIGKILL it has recorded at least the last number it
// printed and less than that plus recordBatch.
const recordBatch = 50

// parseRecorded parses a "recorded" line's payload.
func parseRecorded(tb testing.TB, s string) (n int, at time.Time) {
	tb.Helper()
	f := strings.Fields(s)
	if len(f) != 2 {
		tb.Fatalf("bad recorded line %q", s)
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		tb.Fatal(err)
	}
	ns, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		tb.Fatal(err)
	}
	return n, time.Unix(0, ns)
}
