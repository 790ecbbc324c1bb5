package helm_test

import (
	"math"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"

	"github.com/tollgate/tollgate/aggregator"
	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/gateway"
	"github.com/tollgate/tollgate/guard/rules"
)

// The binaries a pod runs, by its container's command.
const (
	binGateway    = "gateway"
	binAggregator = "aggregator"
)

// podName is what a fieldRef to metadata.name resolves to in these tests.
const podName = "tg-tollgate-x-0"

// minimalValues is the documented value set with the chart's defaults for
// everything but the addresses and the Secret.
var minimalValues = filepath.Join(chartDir, "ci", "minimal-values.yaml")

// secretValue is what a secretKeyRef resolves to in these tests, followed
// by the key's name: long enough for the key secret, and different per key
// (the viewer token must differ from the admin token).
const secretValue = "secret-from-the-secret-0123456789"

// binary returns the Tollgate binary a container runs.
func binary(c corev1.Container) string {
	if len(c.Command) == 0 {
		return ""
	}
	return c.Command[0]
}

// env resolves a container's environment as the kubelet would, secrets
// and the pod's name replaced by stand-ins, overrides winning.
func env(c corev1.Container, overrides map[string]string) func(string) (string, bool) {
	m := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			m[e.Name] = e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			m[e.Name] = secretValue + "-" + e.ValueFrom.SecretKeyRef.Key
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			m[e.Name] = podName
		}
	}
	for k, v := range overrides {
		m[k] = v
	}
	return configs.MapLookup(m)
}

// envVar returns a container's variable name.
func envVar(c corev1.Container, name string) (corev1.EnvVar, bool) {
	i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == name })
	if i < 0 {
		return corev1.EnvVar{}, false
	}
	return c.Env[i], true
}

// eachContainer calls fn for every Tollgate container of every documented
// value set.
func eachContainer(t *testing.T, fn func(t *testing.T, rel release, workload string, pod *corev1.PodTemplateSpec, c corev1.Container)) {
	for _, rel := range allReleases(t) {
		for workload, pod := range rel.pods() {
			for _, c := range pod.Spec.Containers {
				if b := binary(c); b != binGateway && b != binAggregator {
					t.Errorf("%s: %s: container %s runs %v, not a Tollgate binary", rel.name, workload, c.Name, c.Command)
					continue
				}
				t.Run(rel.name+"/"+workload, func(t *testing.T) { fn(t, rel, workload, pod, c) })
			}
		}
	}
}

// TestChartEnvInRegistry: every TOLLGATE_* variable a container gets is in
// the variable registry (configs.Registry), and CheckEnv, which the
// binaries run at start, accepts the whole environment; no variable is
// set twice.
func TestChartEnvInRegistry(t *testing.T) {
	t.Parallel()
	known := configs.Registry()
	eachContainer(t, func(t *testing.T, _ release, _ string, _ *corev1.PodTemplateSpec, c corev1.Container) {
		var environ []string
		seen := map[string]bool{}
		for _, e := range c.Env {
			if seen[e.Name] {
				t.Errorf("%s is set twice", e.Name)
			}
			seen[e.Name] = true
			if !strings.HasPrefix(e.Name, configs.Prefix) {
				t.Errorf("%s: not a Tollgate variable", e.Name)
			} else if !slices.Contains(known, e.Name) {
				t.Errorf("%s is not in the variable registry (configs.Registry)", e.Name)
			}
			environ = append(environ, e.Name+"=x")
		}
		if err := configs.CheckEnv(environ, known); err != nil {
			t.Error(err)
		}
	})
}

// TestChartEnvLoads: each container's environment loads into a valid
// configuration of its binary (gateway.LoadConfig, aggregator.LoadConfig),
// as at the pod's start.
func TestChartEnvLoads(t *testing.T) {
	t.Parallel()
	eachContainer(t, func(t *testing.T, _ release, _ string, _ *corev1.PodTemplateSpec, c corev1.Container) {
		var err error
		switch binary(c) {
		case binGateway:
			_, err = gateway.LoadConfig("", env(c, nil))
		case binAggregator:
			_, err = aggregator.LoadConfig("", env(c, nil))
		}
		if err != nil {
			t.Errorf("its environment does not load:\n%v", err)
		}
	})
}

// listeners are a binary's listen variables, the container port name the
// chart gives each, and the binary's default address.
var listeners = map[string][]struct{ variable, port, def string }{
	binGateway: {
		{"TOLLGATE_LISTEN", "proxy", gateway.DefaultListen},
		{"TOLLGATE_API_LISTEN", "check-api", gateway.DefaultAPIListen},
		{"TOLLGATE_GRPC_LISTEN", "rls", gateway.DefaultGRPCListen},
		{"TOLLGATE_METRICS_LISTEN", "metrics", gateway.DefaultMetricsListen},
	},
	binAggregator: {
		{"TOLLGATE_AGGREGATOR_LISTEN", "operator-api", aggregator.DefaultListen},
		{"TOLLGATE_AGGREGATOR_METRICS_LISTEN", "metrics", aggregator.DefaultMetricsListen},
	},
}

// TestChartPortsAndProbes: each listener binds every interface of the pod
// on its binary's default port, behind a container port of that number and
// name (and no container port without a listener); the probes ask the
// metrics listener's /healthz (liveness, startup) and /readyz (readiness).
func TestChartPortsAndProbes(t *testing.T) {
	t.Parallel()
	eachContainer(t, func(t *testing.T, _ release, _ string, _ *corev1.PodTemplateSpec, c corev1.Container) {
		lookup := env(c, nil)
		ports := map[string]int32{}
		for _, p := range c.Ports {
			ports[p.Name] = p.ContainerPort
		}
		bound := map[string]bool{}
		for _, l := range listeners[binary(c)] {
			addr, ok := lookup(l.variable)
			if !ok || addr == "off" || (l.variable == "TOLLGATE_LISTEN" && !has(lookup, "TOLLGATE_UPSTREAM")) {
				if _, exposed := ports[l.port]; exposed {
					t.Errorf("container port %s, but %s is off", l.port, l.variable)
				}
				continue
			}
			host, port, err := net.SplitHostPort(addr)
			_, defPort, _ := net.SplitHostPort(l.def)
			if err != nil || host != "0.0.0.0" || port != defPort {
				t.Errorf("%s=%q, want 0.0.0.0:%s (every interface, the binary's default port)", l.variable, addr, defPort)
			}
			if strconv.Itoa(int(ports[l.port])) != port {
				t.Errorf("container port %s is %d, but %s listens on %s", l.port, ports[l.port], l.variable, port)
			}
			bound[l.port] = true
		}
		for name := range ports {
			if !bound[name] {
				t.Errorf("container port %s has no listener behind it", name)
			}
		}
		for probe, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe} {
			want := "/healthz"
			if probe == "readiness" {
				want = "/readyz"
			}
			if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != want || p.HTTPGet.Port != intstr.FromString("metrics") {
				t.Errorf("%s probe %+v, want GET %s on port metrics", probe, p, want)
			}
		}
	})
}

func has(lookup func(string) (string, bool), k string) bool {
	v, ok := lookup(k)
	return ok && v != ""
}

// TestChartIdentities: every gateway and aggregator is named after its pod
// (TOLLGATE_GATEWAY_ID, TOLLGATE_AGGREGATOR_ID from metadata.name): unique
// per pod, and for a StatefulSet's aggregator stable across restarts, as
// its Kafka transactional id must be. Aggregators are a StatefulSet with a
// volume claim of their own on the data directory.
func TestChartIdentities(t *testing.T) {
	t.Parallel()
	for _, rel := range allReleases(t) {
		for _, d := range find[*appsv1.Deployment](rel) {
			for _, c := range d.Spec.Template.Spec.Containers {
				if binary(c) == binAggregator {
					t.Errorf("%s: aggregator in Deployment %s: its id and volume would not be stable", rel.name, d.Name)
				}
				checkIDFromPodName(t, rel.name, c, "TOLLGATE_GATEWAY_ID")
			}
		}
		for _, s := range find[*appsv1.StatefulSet](rel) {
			for _, c := range s.Spec.Template.Spec.Containers {
				checkIDFromPodName(t, rel.name, c, "TOLLGATE_AGGREGATOR_ID")
				dir, _ := env(c, nil)("TOLLGATE_DATA_DIR")
				i := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == dir })
				if i < 0 || !slices.ContainsFunc(s.Spec.VolumeClaimTemplates, func(p corev1.PersistentVolumeClaim) bool { return p.Name == c.VolumeMounts[i].Name }) {
					t.Errorf("%s: StatefulSet %s: TOLLGATE_DATA_DIR %q is not on a volume claim of its own", rel.name, s.Name, dir)
				}
			}
		}
	}
}

func checkIDFromPodName(t *testing.T, rel string, c corev1.Container, name string) {
	t.Helper()
	e, ok := envVar(c, name)
	if !ok || e.Value != "" || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.name" {
		t.Errorf("%s: container %s: %s %+v, want the pod's name (fieldRef metadata.name)", rel, c.Name, name, e)
	}
}

// TestChartDrain: a gateway pod stopping keeps serving through its preStop
// pause (Kubernetes takes it out of the endpoints meanwhile), then drains
// in-flight requests for TOLLGATE_SHUTDOWN_TIMEOUT and flushes its events;
// terminationGracePeriodSeconds leaves time for all of it, or the kubelet's
// SIGKILL would cut the drain short.
func TestChartDrain(t *testing.T) {
	t.Parallel()
	// The decision events' flush at shutdown (events.DefaultShutdownTimeout).
	const eventsFlush = 5 * time.Second
	for _, rel := range allReleases(t) {
		for _, d := range find[*appsv1.Deployment](rel) {
			spec := d.Spec.Template.Spec
			for _, c := range spec.Containers {
				cfg, err := gateway.LoadConfig("", env(c, nil))
				if err != nil {
					t.Fatalf("%s: %v", rel.name, err)
				}
				var preStop time.Duration
				if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil || c.Lifecycle.PreStop.Sleep.Seconds < 1 {
					t.Errorf("%s: %s: no preStop pause: the pod would stop taking connections before the endpoints drop it", rel.name, d.Name)
				} else {
					preStop = time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
				}
				need := preStop + cfg.ShutdownTimeout + eventsFlush
				if spec.TerminationGracePeriodSeconds == nil || time.Duration(*spec.TerminationGracePeriodSeconds)*time.Second <= need {
					t.Errorf("%s: %s: terminationGracePeriodSeconds %v, want more than preStop %v + shutdown_timeout %v + event flush %v",
						rel.name, d.Name, spec.TerminationGracePeriodSeconds, preStop, cfg.ShutdownTimeout, eventsFlush)
				}
			}
			if s := d.Spec.Strategy.RollingUpdate; s == nil || s.MaxUnavailable == nil || s.MaxUnavailable.IntValue() != 0 {
				t.Errorf("%s: %s: a rolling update should add gateways before it removes any", rel.name, d.Name)
			}
		}
	}
}

// TestChartSelectors: every Service, PodDisruptionBudget, HPA, NetworkPolicy
// and ServiceMonitor finds the pods it is for, and every Service port
// targets a container port those pods have.
func TestChartSelectors(t *testing.T) {
	t.Parallel()
	for _, rel := range allReleases(t) {
		pods := rel.pods()
		selects := func(what string, sel map[string]string) []*corev1.PodTemplateSpec {
			var out []*corev1.PodTemplateSpec
			for _, p := range pods {
				if len(sel) > 0 && labels.SelectorFromSet(sel).Matches(labels.Set(p.Labels)) {
					out = append(out, p)
				}
			}
			if len(out) == 0 {
				t.Errorf("%s: %s selects no pod", rel.name, what)
			}
			return out
		}
		for _, s := range find[*corev1.Service](rel) {
			for _, p := range selects("Service "+s.Name, s.Spec.Selector) {
				for _, sp := range s.Spec.Ports {
					if !slices.ContainsFunc(p.Spec.Containers[0].Ports, func(cp corev1.ContainerPort) bool { return cp.Name == sp.TargetPort.StrVal }) {
						t.Errorf("%s: Service %s port %s targets %q, which its pods do not have", rel.name, s.Name, sp.Name, sp.TargetPort.String())
					}
				}
			}
		}
		for _, b := range find[*policyv1.PodDisruptionBudget](rel) {
			selects("PodDisruptionBudget "+b.Name, b.Spec.Selector.MatchLabels)
		}
		for _, n := range find[*networkingv1.NetworkPolicy](rel) {
			selects("NetworkPolicy "+n.Name, n.Spec.PodSelector.MatchLabels)
		}
		for _, m := range find[*monitoringv1.ServiceMonitor](rel) {
			var matched bool
			for _, s := range find[*corev1.Service](rel) {
				if labels.SelectorFromSet(m.Spec.Selector.MatchLabels).Matches(labels.Set(s.Labels)) &&
					slices.ContainsFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == m.Spec.Endpoints[0].Port }) {
					matched = true
				}
			}
			if !matched {
				t.Errorf("%s: ServiceMonitor %s finds no Service with port %q", rel.name, m.Name, m.Spec.Endpoints[0].Port)
			}
		}
		for _, h := range find[*autoscalingv2.HorizontalPodAutoscaler](rel) {
			if _, ok := pods[h.Spec.ScaleTargetRef.Name]; !ok || h.Spec.ScaleTargetRef.Kind != "Deployment" {
				t.Errorf("%s: HPA %s scales %+v, not the gateways' Deployment", rel.name, h.Name, h.Spec.ScaleTargetRef)
			}
			for _, c := range pods[h.Spec.ScaleTargetRef.Name].Spec.Containers {
				if c.Resources.Requests.Cpu().IsZero() {
					t.Errorf("%s: HPA %s on CPU, but container %s requests no CPU", rel.name, h.Name, c.Name)
				}
			}
		}
	}
}

// TestChartNetworkPolicies: where NetworkPolicies are on, the check API,
// Envoy's rate-limit service and the operator API admit only named peers
// (a rule without peers admits everyone), and every port a policy names is
// a container port of its pods.
func TestChartNetworkPolicies(t *testing.T) {
	t.Parallel()
	private := []string{"check-api", "rls", "operator-api"}
	for _, rel := range allReleases(t) {
		pods := rel.pods()
		for _, n := range find[*networkingv1.NetworkPolicy](rel) {
			var podPorts []string
			for _, p := range pods {
				if labels.SelectorFromSet(n.Spec.PodSelector.MatchLabels).Matches(labels.Set(p.Labels)) {
					for _, cp := range p.Spec.Containers[0].Ports {
						podPorts = append(podPorts, cp.Name)
					}
				}
			}
			covered := map[string]bool{}
			for _, r := range n.Spec.Ingress {
				for _, p := range r.Ports {
					name := p.Port.StrVal
					covered[name] = true
					if !slices.Contains(podPorts, name) {
						t.Errorf("%s: NetworkPolicy %s names port %q, which its pods do not have", rel.name, n.Name, p.Port.String())
					}
					if slices.Contains(private, name) && len(r.From) == 0 {
						t.Errorf("%s: NetworkPolicy %s admits anyone to %s", rel.name, n.Name, name)
					}
				}
			}
			for _, p := range podPorts {
				if !covered[p] {
					t.Errorf("%s: NetworkPolicy %s: port %s of its pods is closed to everyone (its Service and probes included)", rel.name, n.Name, p)
				}
			}
		}
	}
}

// TestChartSecrets: no secret is written into a pod spec: the key secret,
// tokens and Redis password come from the Secret, and a Secret the chart
// creates holds every key its pods ask for.
func TestChartSecrets(t *testing.T) {
	t.Parallel()
	secretVars := []string{"TOLLGATE_KEY_SECRET", "TOLLGATE_API_TOKEN", "TOLLGATE_ADMIN_TOKEN", "TOLLGATE_VIEWER_TOKEN", "TOLLGATE_REDIS_PASSWORD"}
	for _, rel := range allReleases(t) {
		created := map[string]*corev1.Secret{}
		for _, s := range find[*corev1.Secret](rel) {
			created[s.Name] = s
		}
		for workload, pod := range rel.pods() {
			for _, c := range pod.Spec.Containers {
				for _, e := range c.Env {
					if !slices.Contains(secretVars, e.Name) {
						continue
					}
					if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
						t.Errorf("%s: %s: %s is not from a Secret", rel.name, workload, e.Name)
						continue
					}
					ref := e.ValueFrom.SecretKeyRef
					if s := created[ref.Name]; s != nil {
						if _, ok := s.Data[ref.Key]; !ok {
							t.Errorf("%s: %s: %s asks Secret %s for %q, which it does not hold", rel.name, workload, e.Name, ref.Name, ref.Key)
						}
					}
				}
			}
		}
	}
}

// TestChartViewerToken: the read-only viewer token reaches the aggregators
// (never the gateways) from the Secret when one is set or the Secret is
// the user's (then optional: a Secret without viewer-token leaves it
// unset), loads into the aggregator's configuration, and is absent
// otherwise.
func TestChartViewerToken(t *testing.T) {
	t.Parallel()
	fleet := filepath.Join(chartDir, "ci", "fleet-values.yaml")
	for _, c := range []struct {
		name     string
		file     string
		sets     []string
		want     bool // the aggregator gets TOLLGATE_VIEWER_TOKEN
		inSecret string
		optional bool
	}{
		{"set: from the chart's Secret", fleet, nil, true, "replace-with-a-read-only-token", true},
		{"unset: none", fleet, []string{"secrets.viewerToken="}, false, "", false},
		{"existing Secret: optional key", minimalValues, nil, true, "", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			rel := renderSet(t, c.file, c.sets...)
			var aggregators int
			for workload, pod := range rel.pods() {
				ct := pod.Spec.Containers[0]
				e, ok := envVar(ct, "TOLLGATE_VIEWER_TOKEN")
				if binary(ct) != binAggregator {
					if ok {
						t.Errorf("%s: a gateway gets TOLLGATE_VIEWER_TOKEN", workload)
					}
					continue
				}
				aggregators++
				if ok != c.want {
					t.Fatalf("%s: TOLLGATE_VIEWER_TOKEN present %v, want %v", workload, ok, c.want)
				}
				cfg, err := aggregator.LoadConfig("", env(ct, nil))
				if err != nil {
					t.Fatalf("%s: %v", workload, err)
				}
				if !ok {
					if cfg.ViewerToken != "" {
						t.Errorf("%s: viewer token %q without the variable", workload, cfg.ViewerToken)
					}
					continue
				}
				ref := e.ValueFrom.SecretKeyRef
				if ref == nil || ref.Key != "viewer-token" {
					t.Fatalf("%s: TOLLGATE_VIEWER_TOKEN is not the Secret's viewer-token: %+v", workload, e)
				}
				if got := ref.Optional != nil && *ref.Optional; got != c.optional {
					t.Errorf("%s: optional %v, want %v", workload, got, c.optional)
				}
				if want := secretValue + "-viewer-token"; cfg.ViewerToken != want {
					t.Errorf("%s: the aggregator's viewer token is %q, want the Secret's %q", workload, cfg.ViewerToken, want)
				}
			}
			if aggregators == 0 {
				t.Fatalf("%s renders no aggregator", rel.name)
			}
			var secret *corev1.Secret
			for _, s := range find[*corev1.Secret](rel) {
				secret = s
			}
			switch {
			case c.inSecret == "" && secret != nil && secret.Data["viewer-token"] != nil:
				t.Errorf("the chart's Secret holds a viewer-token nobody set")
			case c.inSecret != "" && (secret == nil || string(secret.Data["viewer-token"]) != c.inSecret):
				t.Errorf("the chart's Secret does not hold viewer-token %q", c.inSecret)
			}
		})
	}
}

// TestChartRules: the rules the pods mount are valid rules (the default
// file and every value set's), where TOLLGATE_RULES_FILE says.
func TestChartRules(t *testing.T) {
	t.Parallel()
	for _, rel := range allReleases(t) {
		cms := find[*corev1.ConfigMap](rel)
		if len(cms) != 1 {
			t.Fatalf("%s: %d ConfigMaps", rel.name, len(cms))
		}
		if _, err := rules.Load([]byte(cms[0].Data["rules.yaml"])); err != nil {
			t.Errorf("%s: ConfigMap %s: rules.yaml: %v", rel.name, cms[0].Name, err)
		}
		for workload, pod := range rel.pods() {
			c := pod.Spec.Containers[0]
			file, _ := env(c, nil)("TOLLGATE_RULES_FILE")
			i := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath+"/rules.yaml" == file })
			if i < 0 {
				t.Errorf("%s: %s: TOLLGATE_RULES_FILE %s is not rules.yaml of a mounted directory (a file mount would never see an update)", rel.name, workload, file)
				continue
			}
			j := slices.IndexFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == c.VolumeMounts[i].Name })
			if j < 0 || pod.Spec.Volumes[j].ConfigMap == nil || pod.Spec.Volumes[j].ConfigMap.Name != cms[0].Name {
				t.Errorf("%s: %s: the rules directory is not the rules ConfigMap", rel.name, workload)
			}
		}
	}
}

// TestChartFailureShare: by default each gateway's share of a Redis outage
// is 1 / the largest fleet the chart can run, so the fleet together never
// admits more than a fail-closed rule's limit.
func TestChartFailureShare(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		sets    []string
		largest int
	}{
		{nil, 10},
		{[]string{"gateway.autoscaling.maxReplicas=40"}, 40},
		{[]string{"gateway.autoscaling.enabled=false", "gateway.replicas=3"}, 3},
		{[]string{"gateway.failureShare=0.5"}, 2},
	} {
		rel := renderSet(t, minimalValues, c.sets...)
		d := find[*appsv1.Deployment](rel)[0]
		share, _ := env(d.Spec.Template.Spec.Containers[0], nil)("TOLLGATE_FAILURE_SHARE")
		if f, err := strconv.ParseFloat(share, 64); err != nil || math.Abs(f-1/float64(c.largest)) > 1e-4 {
			t.Errorf("%v: TOLLGATE_FAILURE_SHARE %q, want 1/%d", c.sets, share, c.largest)
		}
	}
}

// TestChartServiceMonitorJobs: the ServiceMonitors name the Prometheus jobs
// the shipped dashboards and alerts select (tollgate-gateway,
// tollgate-aggregator).
func TestChartServiceMonitorJobs(t *testing.T) {
	t.Parallel()
	rel := renderSet(t, minimalValues, "metrics.serviceMonitor.enabled=true")
	var jobs []string
	for _, m := range find[*monitoringv1.ServiceMonitor](rel) {
		for _, e := range m.Spec.Endpoints {
			for _, r := range e.RelabelConfigs {
				if r.TargetLabel == "job" && r.Replacement != nil {
					jobs = append(jobs, *r.Replacement)
				}
			}
		}
	}
	slices.Sort(jobs)
	if want := []string{"tollgate-aggregator", "tollgate-gateway"}; !slices.Equal(jobs, want) {
		t.Errorf("ServiceMonitor jobs %v, want %v", jobs, want)
	}
}
