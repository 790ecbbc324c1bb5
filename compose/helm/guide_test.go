package helm_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// guidePath is the deployment guide, which walks through an install.
const guidePath = "../../docs/deployment.md"

// guideNames matches the object names the guide tells users to use:
// tg-tollgate-… in `deploy/…`, `statefulset/…` and Service mentions.
var guideNames = regexp.MustCompile("`(?:deploy/|statefulset/)?(tg-tollgate-[a-z-]+)`")

// TestDeploymentGuideValues: the values file the deployment guide shows
// renders with this chart (so a user who copies it gets an install, not a
// schema error), and every object name the guide sends traffic or
// rollout commands to is one the chart makes under the guide's release
// name.
func TestDeploymentGuideValues(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(guidePath)
	if err != nil {
		t.Fatal(err)
	}
	guide := string(b)
	_, rest, ok := strings.Cut(guide, "```yaml\n")
	if !ok {
		t.Fatalf("%s: no yaml values block", guidePath)
	}
	block, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatalf("%s: the yaml block does not end", guidePath)
	}
	if !strings.Contains(guide, "helm install "+releaseName+" compose/helm/tollgate -n "+namespace) {
		t.Errorf("%s: want the install as release %q in namespace %q, the names the tests render", guidePath, releaseName, namespace)
	}
	file := filepath.Join(t.TempDir(), "guide-values.yaml")
	if err := os.WriteFile(file, []byte(block), 0o644); err != nil {
		t.Fatal(err)
	}
	rel := renderSet(t, file)
	var made []string
	for _, o := range rel.objects {
		made = append(made, name(o.obj))
	}
	found := guideNames.FindAllStringSubmatch(guide, -1)
	if len(found) < 5 {
		t.Fatalf("%s names %d objects, want the gateway's Services, Deployment and the aggregators'", guidePath, len(found))
	}
	for _, m := range found {
		if !slices.Contains(made, m[1]) {
			t.Errorf("%s names %s, which the chart does not make with the guide's values (it makes %v)", guidePath, m[1], made)
		}
	}
}
