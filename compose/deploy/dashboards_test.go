package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// dashboard is the part of a Grafana dashboard's JSON model the tests read.
type dashboard struct {
	file          string
	UID           string `json:"uid"`
	Title         string `json:"title"`
	SchemaVersion int    `json:"schemaVersion"`
	Templating    struct {
		List []templateVar `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type dsRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type templateVar struct {
	Name       string `json:"name"`
	Type       string `json:"type"`
	Datasource *dsRef `json:"datasource"`
	Definition string `json:"definition"`
	IncludeAll bool   `json:"includeAll"`
	Multi      bool   `json:"multi"`
	AllValue   string `json:"allValue"`
}

type panel struct {
	ID      int    `json:"id"`
	Type    string `json:"type"`
	Title   string `json:"title"`
	GridPos struct {
		H int `json:"h"`
		W int `json:"w"`
		X int `json:"x"`
		Y int `json:"y"`
	} `json:"gridPos"`
	Datasource *dsRef        `json:"datasource"`
	Targets    []panelTarget `json:"targets"`
	Panels     []panel       `json:"panels"` // a collapsed row's
}

type panelTarget struct {
	RefID      string `json:"refId"`
	Expr       string `json:"expr"`
	Datasource *dsRef `json:"datasource"`
}

// loadDashboards reads every dashboard of the dashboards directory.
func loadDashboards(t testing.TB) []*dashboard {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dashboardsDir, "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards in %s (%v)", dashboardsDir, err)
	}
	var out []*dashboard
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		d := &dashboard{file: f}
		if err := json.Unmarshal(data, d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out = append(out, d)
	}
	return out
}

// allPanels returns the dashboard's panels, those inside collapsed rows
// included.
func (d *dashboard) allPanels() []panel {
	var out []panel
	for _, p := range d.Panels {
		out = append(out, p)
		out = append(out, p.Panels...)
	}
	return out
}

// builtinVars are Grafana's own variables the dashboards may use, with
// the value the live test gives them.
var builtinVars = map[string]string{
	"__rate_interval": "30s",
	"__interval":      "5s",
	"__range":         "1m",
}

// varUse matches a variable reference: $name, ${name}, ${name:format},
// [[name]].
var varUse = regexp.MustCompile(`\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]`)

// labelValues matches label_values(metric, label).
var labelValues = regexp.MustCompile(`^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$`)

// expand replaces the dashboard's variables in expr the way Grafana does
// with "All" selected (a variable's allValue, .* for these dashboards) and
// the built-ins with fixed windows. It returns an error naming an unknown
// variable.
func (d *dashboard) expand(expr string) (string, error) {
	var err error
	out := varUse.ReplaceAllStringFunc(expr, func(m string) string {
		g := varUse.FindStringSubmatch(m)
		name := g[1] + g[2] + g[3]
		if v, ok := builtinVars[name]; ok {
			return v
		}
		for _, tv := range d.Templating.List {
			if tv.Name == name {
				return tv.AllValue
			}
		}
		err = fmt.Errorf("unknown variable $%s", name)
		return m
	})
	return out, err
}

// knownPanelTypes are the panel types the dashboards use.
var knownPanelTypes = []string{"row", "timeseries", "stat", "state-timeline", "heatmap", "table", "gauge", "bargauge"}

// TestDashboards checks the dashboards' structure: unique uids, the
// provisioned datasource everywhere, panels on the 24-column grid without
// overlap, every target a PromQL expression whose variables exist and
// select with =~ (they are multi-valued), and no expression that would
// return data whatever it matches (or vector(0)): the live test must see a
// query that matches nothing.
func TestDashboards(t *testing.T) {
	var promUID string
	for _, ds := range provisionedDatasources(t) {
		if ds.Type == "prometheus" {
			promUID = ds.UID
		}
	}
	if promUID == "" {
		t.Fatalf("%s: no prometheus datasource", datasourceDir)
	}
	checkDS := func(where string, ds *dsRef) {
		if ds == nil || ds.Type != "prometheus" || ds.UID != promUID {
			t.Errorf("%s: datasource %+v, want {prometheus %s} (the provisioned one)", where, ds, promUID)
		}
	}
	uids, titles := map[string]string{}, map[string]string{}
	for _, d := range loadDashboards(t) {
		if d.UID == "" || len(d.UID) > 40 {
			t.Errorf("%s: uid %q: want 1 to 40 characters", d.file, d.UID)
		}
		if other := uids[d.UID]; other != "" {
			t.Errorf("%s: uid %s is also %s's", d.file, d.UID, other)
		}
		uids[d.UID] = d.file
		if other := titles[d.Title]; other != "" || d.Title == "" {
			t.Errorf("%s: title %q empty or also %s's", d.file, d.Title, other)
		}
		titles[d.Title] = d.file
		if d.SchemaVersion < 36 {
			t.Errorf("%s: schemaVersion %d: want a Grafana 9+ model (36 or more)", d.file, d.SchemaVersion)
		}
		vars := map[string]bool{}
		for _, v := range d.Templating.List {
			where := fmt.Sprintf("%s: variable %s", d.file, v.Name)
			vars[v.Name] = true
			checkDS(where, v.Datasource)
			if v.Type != "query" || !labelValues.MatchString(v.Definition) {
				t.Errorf("%s: want a query variable label_values(metric, label), have %s %q", where, v.Type, v.Definition)
			}
			if !v.IncludeAll || v.AllValue != ".*" {
				t.Errorf("%s: want includeAll with allValue .* (All must match every value, also ones that appear later)", where)
			}
		}
		ids := map[int]bool{}
		var placed []panel
		for _, p := range d.allPanels() {
			where := fmt.Sprintf("%s: panel %d %q", d.file, p.ID, p.Title)
			if ids[p.ID] || p.ID <= 0 {
				t.Errorf("%s: id missing or not unique", where)
			}
			ids[p.ID] = true
			if !slices.Contains(knownPanelTypes, p.Type) {
				t.Errorf("%s: panel type %q (known: %v)", where, p.Type, knownPanelTypes)
			}
			g := p.GridPos
			if g.W < 1 || g.H < 1 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 {
				t.Errorf("%s: gridPos %+v is off the 24-column grid", where, g)
			}
			for _, q := range placed {
				h := q.GridPos
				if g.X < h.X+h.W && h.X < g.X+g.W && g.Y < h.Y+h.H && h.Y < g.Y+g.H {
					t.Errorf("%s: overlaps panel %d %q", where, q.ID, q.Title)
				}
			}
			placed = append(placed, p)
			if p.Type == "row" {
				if len(p.Targets) > 0 {
					t.Errorf("%s: a row with targets", where)
				}
				continue
			}
			if p.Title == "" {
				t.Errorf("%s: no title", where)
			}
			checkDS(where, p.Datasource)
			if len(p.Targets) == 0 {
				t.Errorf("%s: no targets", where)
			}
			refs := map[string]bool{}
			for _, tg := range p.Targets {
				tw := where + " target " + tg.RefID
				if tg.RefID == "" || refs[tg.RefID] {
					t.Errorf("%s: refId missing or not unique", tw)
				}
				refs[tg.RefID] = true
				if tg.Datasource != nil {
					checkDS(tw, tg.Datasource)
				}
				if strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("%s: no expr", tw)
					continue
				}
				if _, err := d.expand(tg.Expr); err != nil {
					t.Errorf("%s: %v in %s", tw, err, tg.Expr)
				}
				for _, m := range regexp.MustCompile(`(\w+)\s*(!?=)\s*"\$\{?(\w+)`).FindAllStringSubmatch(tg.Expr, -1) {
					if vars[m[3]] {
						t.Errorf("%s: %s%s\"$%s\": a multi-valued variable needs =~", tw, m[1], m[2], m[3])
					}
				}
				if strings.Contains(tg.Expr, "vector(") {
					t.Errorf("%s: %s: vector() makes a query return data whatever it matches, which hides a misspelt metric", tw, tg.Expr)
				}
			}
		}
	}
}

// TestGrafanaProvisioning: Grafana's datasource points at the prometheus
// service, and its dashboard provider reads the directory holding the
// dashboards the other tests check.
func TestGrafanaProvisioning(t *testing.T) {
	c := loadCompose(t, testEnv(t))
	g := c.Services["grafana"]
	if g == nil {
		t.Fatal("no grafana service")
	}
	if g.mountSource("/etc/grafana/provisioning/datasources") != filepath.Clean(datasourceDir) {
		t.Errorf("grafana does not mount %s at /etc/grafana/provisioning/datasources", datasourceDir)
	}
	for _, ds := range provisionedDatasources(t) {
		for _, a := range addrs(datasourceDir+": datasource "+ds.UID, ds.URL) {
			if msg := c.checkAddr("grafana", a); msg != "" {
				t.Error(msg)
			}
		}
	}
	var prov struct {
		Providers []struct {
			Name    string `yaml:"name"`
			Type    string `yaml:"type"`
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	readYAML(t, filepath.Join(providerDir, "tollgate.yml"), &prov)
	if g.mountSource("/etc/grafana/provisioning/dashboards") != filepath.Clean(providerDir) {
		t.Errorf("grafana does not mount %s at /etc/grafana/provisioning/dashboards", providerDir)
	}
	if len(prov.Providers) != 1 || prov.Providers[0].Type != "file" {
		t.Fatalf("%s: want one file provider", providerDir)
	}
	if src := g.mountSource(prov.Providers[0].Options.Path); src != filepath.Clean(dashboardsDir) {
		t.Errorf("dashboard provider path %s holds %q in the grafana service, want %s", prov.Providers[0].Options.Path, src, dashboardsDir)
	}
	if home := g.Environment["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]; home != "" {
		if _, err := os.Stat(g.mountSource(home)); err != nil {
			t.Errorf("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH %s: %v", home, err)
		}
	}
}

// datasource is a provisioned Grafana datasource.
type datasource struct {
	Name string `yaml:"name"`
	UID  string `yaml:"uid"`
	Type string `yaml:"type"`
	URL  string `yaml:"url"`
}

// provisionedDatasources reads every file of the datasources directory.
func provisionedDatasources(t testing.TB) []datasource {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(datasourceDir, "*.yml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no datasource files in %s (%v)", datasourceDir, err)
	}
	var out []datasource
	for _, f := range files {
		var doc struct {
			Datasources []datasource `yaml:"datasources"`
		}
		readYAML(t, f, &doc)
		out = append(out, doc.Datasources...)
	}
	return out
}
