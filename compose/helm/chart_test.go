package helm_test

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/cli/values"
	"helm.sh/helm/v3/pkg/getter"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
)

// The chart, its documented value sets, and how the tests install it.
const (
	chartDir    = "tollgate"
	releaseName = "tg"
	namespace   = "tollgate"
)

// kubeVersion is the cluster the renders claim: the oldest the chart
// supports (Chart.yaml kubeVersion), so a newer API it used would show.
var kubeVersion = chartutil.KubeVersion{Version: "v1.30.0", Major: "1", Minor: "30"}

// valueSets returns the documented value sets: ci/*-values.yaml.
func valueSets(t testing.TB) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartDir, "ci", "*-values.yaml"))
	if err != nil || len(files) < 3 {
		t.Fatalf("want the documented value sets in %s/ci, have %v (%v)", chartDir, files, err)
	}
	return files
}

// loadValues merges value files and --set style assignments as helm does.
func loadValues(t testing.TB, files []string, sets ...string) map[string]any {
	t.Helper()
	opts := values.Options{ValueFiles: files, Values: sets}
	vals, err := opts.MergeValues(getter.Providers{})
	if err != nil {
		t.Fatalf("values %v %v: %v", files, sets, err)
	}
	return vals
}

// render installs the chart client-only (helm template) with vals and
// returns its manifest.
func render(t testing.TB, vals map[string]any) (string, error) {
	t.Helper()
	chrt, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	inst := action.NewInstall(new(action.Configuration))
	inst.DryRun, inst.ClientOnly, inst.Replace = true, true, true
	inst.ReleaseName, inst.Namespace = releaseName, namespace
	inst.KubeVersion = &kubeVersion
	rel, err := inst.Run(chrt, vals)
	if err != nil {
		return "", err
	}
	return rel.Manifest, nil
}

// decoder decodes manifests strictly with the Kubernetes API's own types
// (client-go's scheme) and the Prometheus Operator's: an unknown or
// duplicate field is an error, and so is a kind neither knows.
var decoder = func() runtime.Decoder {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, monitoringv1.AddToScheme} {
		if err := add(scheme); err != nil {
			panic(err) // static registration: a broken build, not input
		}
	}
	return kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, scheme, scheme, kjson.SerializerOptions{Yaml: true, Strict: true})
}()

// object is one rendered object, decoded.
type object struct {
	source string // template file
	obj    runtime.Object
}

// release is a rendered chart, decoded.
type release struct {
	name    string // value set
	objects []object
}

// decodeManifest decodes every object of a manifest strictly.
func decodeManifest(manifest string) ([]object, error) {
	docs := releaseutil.SplitManifests(manifest)
	keys := make([]string, 0, len(docs))
	for k := range docs {
		keys = append(keys, k)
	}
	sort.Sort(releaseutil.BySplitManifestsOrder(keys))
	var objs []object
	for _, k := range keys {
		doc := docs[k]
		source := "?"
		if _, after, ok := strings.Cut(doc, "# Source: "); ok {
			source, _, _ = strings.Cut(after, "\n")
		}
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		obj, _, err := decoder.Decode([]byte(doc), nil, nil)
		if err != nil {
			return nil, fmt.Errorf("%s: %w\n%s", source, err, doc)
		}
		objs = append(objs, object{source: source, obj: obj})
	}
	return objs, nil
}

// stripComments drops YAML comment lines.
func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// renderSet renders and decodes one value set (a file under ci/, plus
// assignments), failing the test on any error.
func renderSet(t testing.TB, file string, sets ...string) release {
	t.Helper()
	var files []string
	if file != "" {
		files = []string{file}
	}
	manifest, err := render(t, loadValues(t, files, sets...))
	if err != nil {
		t.Fatalf("%s %v: render: %v", file, sets, err)
	}
	objs, err := decodeManifest(manifest)
	if err != nil {
		t.Fatalf("%s %v: %v", file, sets, err)
	}
	return release{name: strings.Join(append([]string{filepath.Base(file)}, sets...), " "), objects: objs}
}

// allReleases renders every documented value set.
func allReleases(t testing.TB) []release {
	t.Helper()
	var rels []release
	for _, f := range valueSets(t) {
		rels = append(rels, renderSet(t, f))
	}
	return rels
}

// kinds lists a release's objects as Kind/name.
func (r release) kinds() []string {
	var out []string
	for _, o := range r.objects {
		out = append(out, fmt.Sprintf("%T/%s", o.obj, name(o.obj)))
	}
	return out
}

func name(o runtime.Object) string {
	if m, ok := o.(interface{ GetName() string }); ok {
		return m.GetName()
	}
	return "?"
}

// TestChartLint runs helm lint --strict on every documented value set: a
// warning fails it as an error does.
func TestChartLint(t *testing.T) {
	t.Parallel()
	for _, f := range valueSets(t) {
		t.Run(filepath.Base(f), func(t *testing.T) {
			l := action.NewLint()
			l.Strict, l.Namespace = true, namespace
			l.KubeVersion = &kubeVersion
			res := l.Run([]string{chartDir}, loadValues(t, []string{f}))
			for _, m := range res.Messages {
				if m.Severity >= support.WarningSev {
					t.Errorf("helm lint: %s", m)
				}
			}
			for _, err := range res.Errors {
				t.Errorf("helm lint: %v", err)
			}
		})
	}
}

// TestChartRendersKnownObjects renders every documented value set and
// decodes every object strictly (renderSet), and checks each set has the
// objects its values ask for.
func TestChartRendersKnownObjects(t *testing.T) {
	t.Parallel()
	for _, rel := range allReleases(t) {
		count := map[string]int{}
		for _, o := range rel.objects {
			count[fmt.Sprintf("%T", o.obj)]++
		}
		if count["*v1.Deployment"] != 1 || count["*v1.ConfigMap"] != 1 || count["*v1.Service"] < 2 {
			t.Errorf("%s: objects %v", rel.name, rel.kinds())
		}
		t.Logf("%s: %d objects: %s", rel.name, len(rel.objects), strings.Join(rel.kinds(), ", "))
	}
}

// TestStrictDecodingRefusesUnknownFields: the decoder the tests rely on
// refuses a misspelt field and an unknown kind, so a pass means something.
func TestStrictDecodingRefusesUnknownFields(t *testing.T) {
	t.Parallel()
	for name, doc := range map[string]string{
		"misspelt field":  "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  terminationGracePeriodSecond: 5\n  containers: [{name: a, image: b}]\n",
		"duplicate field": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {a: b}\ndata: {c: d}\n",
		"unknown kind":    "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: x}\n",
		"wrong type":      "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replicas: two}\n",
	} {
		if _, err := decodeManifest("---\n# Source: test\n" + doc); err == nil {
			t.Errorf("%s: decoded without error", name)
		}
	}
}

// TestChartRefusesBadValues: a value set that cannot work stops the render
// with a message naming the value to set, and a misspelt or mistyped
// value is refused by the schema.
func TestChartRefusesBadValues(t *testing.T) {
	t.Parallel()
	minimal := minimalValues
	for _, c := range []struct {
		name  string
		files []string
		sets  []string
		want  string
	}{
		{"no redis", nil, []string{"secrets.existingSecret=s", "kafka.brokers={k:9092}"}, "redis.addrs"},
		{"no kafka for the aggregators", nil, []string{"secrets.existingSecret=s", "redis.addrs={r:6379}"}, "kafka.brokers"},
		{"no secrets", nil, []string{"redis.addrs={r:6379}", "kafka.brokers={k:9092}"}, "secrets.keySecret"},
		{"short key secret", nil, []string{"redis.addrs={r:6379}", "kafka.brokers={k:9092}", "secrets.keySecret=short"}, "at least 16 bytes"},
		{"no api token", nil, []string{"redis.addrs={r:6379}", "kafka.brokers={k:9092}", "secrets.keySecret=0123456789abcdef0123", "secrets.adminToken=a"}, "secrets.apiToken"},
		{"no admin token", nil, []string{"redis.addrs={r:6379}", "kafka.brokers={k:9092}", "secrets.keySecret=0123456789abcdef0123", "secrets.apiToken=a"}, "secrets.adminToken"},
		{"short viewer token", []string{minimal}, []string{"secrets.existingSecret=", "secrets.keySecret=0123456789abcdef0123", "secrets.apiToken=a", "secrets.adminToken=admin-0123456789abcdef", "secrets.viewerToken=short"}, "secrets.viewerToken: at least 16"},
		{"viewer token is the admin token", []string{minimal}, []string{"secrets.existingSecret=", "secrets.keySecret=0123456789abcdef0123", "secrets.apiToken=a", "secrets.adminToken=admin-0123456789abcdef", "secrets.viewerToken=admin-0123456789abcdef"}, "secrets.viewerToken: must differ"},
		{"misspelt value", []string{minimal}, []string{"gateway.replica=3"}, "replica"},
		{"unknown redis mode", []string{minimal}, []string{"redis.mode=sentinal"}, "/redis/mode"},
		{"address without port", []string{minimal}, []string{"redis.addrs={redis.example}"}, "/redis/addrs"},
		{"not a TOLLGATE_ variable", []string{minimal}, []string{"gateway.env.LOG_LEVEL=debug"}, "LOG_LEVEL"},
		{"bad duration", []string{minimal}, []string{"redis.timeout=50"}, "/redis/timeout"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := render(t, loadValues(t, c.files, c.sets...))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("render error %v, want one naming %q", err, c.want)
			}
		})
	}
}

// TestChartValuesDocumented: every value in values.yaml is in the chart
// README's table, and every value the table names exists.
func TestChartValuesDocumented(t *testing.T) {
	t.Parallel()
	vals, err := chartutil.ReadValuesFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, line := range strings.Split(string(readme), "\n") {
		if rest, ok := strings.CutPrefix(line, "| `"); ok {
			key, _, _ := strings.Cut(rest, "`")
			documented[key] = true
		}
	}
	var keys []string
	var walk func(prefix string, m map[string]any)
	walk = func(prefix string, m map[string]any) {
		for k, v := range m {
			key := prefix + k
			// A section with fields of its own is documented field by
			// field; free-form maps (env, annotations, resources, ...) as one.
			if sub, ok := v.(map[string]any); ok && len(sub) > 0 && !documented[key] {
				walk(key+".", sub)
				continue
			}
			keys = append(keys, key)
		}
	}
	walk("", vals)
	for _, k := range keys {
		if !documented[k] {
			t.Errorf("value %s is not in %s/README.md's table", k, chartDir)
		}
	}
	for k := range documented {
		var v any = map[string]any(vals)
		for _, part := range strings.Split(k, ".") {
			m, _ := v.(map[string]any)
			v = m[part]
		}
		if v == nil {
			t.Errorf("%s/README.md documents %s, which values.yaml does not have", chartDir, k)
		}
	}
}

// pods returns the pod templates of a release's Deployments and
// StatefulSets, by workload name.
func (r release) pods() map[string]*corev1.PodTemplateSpec {
	out := map[string]*corev1.PodTemplateSpec{}
	for _, o := range r.objects {
		switch w := o.obj.(type) {
		case *appsv1.Deployment:
			out[w.Name] = &w.Spec.Template
		case *appsv1.StatefulSet:
			out[w.Name] = &w.Spec.Template
		}
	}
	return out
}

// find returns the release's objects of type T.
func find[T runtime.Object](r release) []T {
	var out []T
	for _, o := range r.objects {
		if v, ok := o.obj.(T); ok {
			out = append(out, v)
		}
	}
	return out
}
