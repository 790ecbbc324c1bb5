package aggregator_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tollgate/tollgate/aggregator"
	"github.com/tollgate/tollgate/compose/kafkabroker/kafkatest"
	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/internal/logtest"
	"github.com/tollgate/tollgate/internal/service"
	"github.com/tollgate/tollgate/internal/testnet"
	"github.com/tollgate/tollgate/internal/testwait"
)

// settled waits until no more goroutines run than before: everything a
// failed start opened (the Kafka and Redis clients, the Redis store's
// workers, Pebble, the servers) has stopped. On failure it prints the
// stacks of the goroutines left.
func settled(t *testing.T, before int) {
	t.Helper()
	testwait.Eventually(t, 30*time.Second, func() error {
		if n := runtime.NumGoroutine(); n > before {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			return fmt.Errorf("%d goroutines run, %d before the start; left over:\n%s", n, before, buf)
		}
		return nil
	})
}

// miscopartition creates the decisions topic with 3 partitions and the
// changelog with 2, which the processor's Setup refuses.
func miscopartition(t *testing.T, brokers []string, decisions, changelog string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	for topic, n := range map[string]int32{decisions: 3, changelog: 2} {
		if _, err := adm.CreateTopic(t.Context(), n, -1, nil, topic); err != nil {
			t.Fatalf("create %s: %v", topic, err)
		}
	}
}

// TestStartFailuresReleaseEverything fails the start at each point — a
// busy API or metrics listener in New, a Setup the processor refuses in
// Run — and closes a server never run, and checks that nothing New or Run
// opened is left running afterwards, and that a second start on the same
// data_dir and API address succeeds (Pebble's lock and the port are free). It is not parallel: it counts the
// process's goroutines.
func TestStartFailuresReleaseEverything(t *testing.T) {
	brokers := []string{kafkatest.StartTB(t).Addr()}
	redisAddr := redistest.StartTB(t).Addr()
	busy := testnet.Listen(t)
	config := func(t *testing.T, name string) aggregator.Config {
		cfg := testConfig(brokers, name, t.TempDir())
		// A fixed API address, so that a second start shows it was let go.
		cfg.Listen = testnet.FreeAddr(t)
		cfg.Redis.Addrs = []string{redisAddr}
		cfg.Kafka.DecisionsTopic, cfg.Kafka.ChangelogTopic = name+".decisions", name+".changelog"
		return cfg
	}
	tests := []struct {
		name      string
		start     func(t *testing.T, cfg aggregator.Config) (*aggregator.Server, error)
		want      string // in the start's error; "" when it must succeed
		addrInUse bool   // the error is service.ErrAddrInUse
	}{
		{"api listener busy", func(t *testing.T, cfg aggregator.Config) (*aggregator.Server, error) {
			cfg.Listen = busy.Addr().String()
			return aggregator.New(cfg, logtest.Verbose(t))
		}, configs.EnvName("aggregator_listen"), true},
		{"metrics listener busy", func(t *testing.T, cfg aggregator.Config) (*aggregator.Server, error) {
			cfg.MetricsListen = busy.Addr().String()
			return aggregator.New(cfg, logtest.Verbose(t))
		}, configs.EnvName("aggregator_metrics_listen"), true},
		{"setup refused", func(t *testing.T, cfg aggregator.Config) (*aggregator.Server, error) {
			miscopartition(t, brokers, cfg.Kafka.DecisionsTopic, cfg.Kafka.ChangelogTopic)
			srv, err := aggregator.New(cfg, logtest.Verbose(t))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			return srv, srv.Run(ctx)
		}, "co-partitioned", false},
		{"closed before run", func(t *testing.T, cfg aggregator.Config) (*aggregator.Server, error) {
			srv, err := aggregator.New(cfg, logtest.Verbose(t))
			if err != nil {
				t.Fatal(err)
			}
			return srv, srv.Close()
		}, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := config(t, strings.ReplaceAll(tt.name, " ", "-"))
			before := runtime.NumGoroutine()
			first, err := tt.start(t, cfg)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("start: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("start = %v, want an error naming %q", err, tt.want)
			case tt.addrInUse && !errors.Is(err, service.ErrAddrInUse):
				t.Errorf("start = %v, want service.ErrAddrInUse", err)
			}
			settled(t, before)
			// Pebble's lock on data_dir and the API address are free again.
			again, err := aggregator.New(cfg, logtest.Verbose(t))
			if err != nil {
				t.Fatalf("a second start on the same data_dir and address: %v", err)
			}
			if err := again.Close(); err != nil {
				t.Fatal(err)
			}
			// Reachable until now: a listener left open must not be
			// closed by its finalizer instead.
			runtime.KeepAlive(first)
		})
	}
}
