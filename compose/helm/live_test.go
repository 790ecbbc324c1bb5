package helm_test

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tollgate/tollgate/aggregator"
	"github.com/tollgate/tollgate/compose/kafkabroker"
	"github.com/tollgate/tollgate/compose/kafkabroker/kafkatest"
	"github.com/tollgate/tollgate/compose/natsserver/natstest"
	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/gateway"
	"github.com/tollgate/tollgate/internal/logtest"
	"github.com/tollgate/tollgate/internal/testnet"
	"github.com/tollgate/tollgate/internal/testwait"
)

// TestChartProbesAnswer starts a real gateway and aggregator with the
// environment the chart gives their pods (fleet-values.yaml: fleet mode,
// events to Kafka), only the addresses of their listeners and of Redis,
// Kafka and NATS replaced by this test's, and the rules from the rendered
// ConfigMap; then asks each probe of their pod specs, on the listener its
// port names, and wants a 200: the probes ask endpoints that exist and
// answer a healthy process.
func TestChartProbesAnswer(t *testing.T) {
	t.Parallel()
	rel := renderSet(t, filepath.Join(chartDir, "ci", "fleet-values.yaml"))
	var gw, agg corev1.Container
	for _, pod := range rel.pods() {
		switch c := pod.Spec.Containers[0]; binary(c) {
		case binGateway:
			gw = c
		case binAggregator:
			agg = c
		}
	}
	if gw.Name == "" || agg.Name == "" {
		t.Fatalf("fleet-values.yaml renders no gateway or no aggregator: %v", rel.kinds())
	}
	rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rulesFile, []byte(find[*corev1.ConfigMap](rel)[0].Data["rules.yaml"]), 0o600); err != nil {
		t.Fatal(err)
	}
	partitions, _ := strconv.Atoi(must(env(agg, nil)("TOLLGATE_KAFKA_PARTITIONS")))
	kafka := kafkatest.StartTB(t, kafkabroker.WithPartitions(partitions))
	redis := redistest.StartTB(t)
	nats := natstest.StartTB(t)
	deps := map[string]string{
		"TOLLGATE_DATA_DIR":       t.TempDir(),
		"TOLLGATE_RULES_FILE":     rulesFile,
		"TOLLGATE_KAFKA_BROKERS":  strings.Join(kafka.Addrs(), ","),
		"TOLLGATE_NATS_URL":       nats.ClientURL(),
		"TOLLGATE_REDIS_MODE":     "standalone",
		"TOLLGATE_REDIS_ADDRS":    redis.Addr(),
		"TOLLGATE_REDIS_PASSWORD": "",
	}
	log := logtest.Warnings(t)

	// The aggregator first: it creates the KV buckets fleet mode watches.
	aggCfg, err := aggregator.LoadConfig("", env(agg, with(deps, map[string]string{
		"TOLLGATE_AGGREGATOR_LISTEN":         "127.0.0.1:0",
		"TOLLGATE_AGGREGATOR_METRICS_LISTEN": "127.0.0.1:0",
	})))
	if err != nil {
		t.Fatal(err)
	}
	aggSrv, err := aggregator.New(aggCfg, log.With("pod", "aggregator"))
	if err != nil {
		t.Fatal(err)
	}
	testnet.RunUntilCleanup(t, "aggregator", aggSrv.Run)

	gwDeps := with(deps, map[string]string{
		"TOLLGATE_UPSTREAM":       "http://127.0.0.1:1", // the proxy starts; nothing is proxied
		"TOLLGATE_LISTEN":         "127.0.0.1:0",
		"TOLLGATE_API_LISTEN":     "127.0.0.1:0",
		"TOLLGATE_GRPC_LISTEN":    "127.0.0.1:0",
		"TOLLGATE_METRICS_LISTEN": "127.0.0.1:0",
	})
	gwCfg, err := gateway.LoadConfig("", env(gw, gwDeps))
	if err != nil {
		t.Fatal(err)
	}
	gwSrv, err := gateway.New(gwCfg, log.With("pod", "gateway"))
	if err != nil {
		t.Fatal(err)
	}
	testnet.RunUntilCleanup(t, "gateway", gwSrv.Run)

	// The listener behind each container port name.
	listeners := map[string]map[string]string{
		binGateway:    {"proxy": gwSrv.Addrs().Proxy, "check-api": gwSrv.Addrs().API, "rls": gwSrv.Addrs().GRPC, "metrics": gwSrv.Addrs().Metrics},
		binAggregator: {"operator-api": aggSrv.Addrs().API, "metrics": aggSrv.Addrs().Metrics},
	}
	client := &http.Client{Timeout: 5 * time.Second}
	for _, c := range []corev1.Container{gw, agg} {
		for kind, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe} {
			addr := listeners[binary(c)][p.HTTPGet.Port.StrVal]
			if addr == "" {
				t.Errorf("%s: %s probe on port %q: no listener of that name", c.Name, kind, p.HTTPGet.Port.String())
				continue
			}
			url := "http://" + addr + p.HTTPGet.Path
			// The aggregator becomes ready once its state is restored.
			took := testwait.Eventually(t, 60*time.Second, func() error {
				resp, err := client.Get(url)
				if err != nil {
					return err
				}
				defer resp.Body.Close()
				body, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != http.StatusOK {
					return fmt.Errorf("%s probe GET %s: %s %s", kind, url, resp.Status, body)
				}
				return nil
			})
			t.Logf("%s: %s probe GET %s on port %s: 200 after %v", c.Name, kind, p.HTTPGet.Path, p.HTTPGet.Port.String(), took.Round(time.Millisecond))
		}
	}
}

// with returns a copy of a with b's entries added.
func with(a, b map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

func must(v string, ok bool) string {
	if !ok {
		return ""
	}
	return v
}
