package stack

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/guard/rules"
)

// TestWriteRegionRules: the regions' rules file is the rules file with its
// top-level regions list, whatever its form, replaced by the stack's
// regions, and every other line as written.
func TestWriteRegionRules(t *testing.T) {
	t.Parallel()
	list := "regions:                         # written by make run for TOLLGATE_STACK_REGIONS: equal shares\n  - {name: r1}\n  - {name: r2}\n"
	tests := []struct {
		name, in, want string
	}{
		{"block list", "version: 1\nregions:\n  - {name: local, weight: 1}\n\nrules: []\n",
			"version: 1\n" + list + "\nrules: []\n"},
		{"block list of mappings, comments kept", "# head\nregions: # ours\n  - name: a\n    weight: 0.5\n  # a comment in the list\n  - name: b\n# after\nrules: []\n",
			"# head\n" + list + "# after\nrules: []\n"},
		{"blank line inside the list", "regions:\n\n  - {name: a}\n\n  - {name: b}\n\nrules: []\n", list + "\nrules: []\n"},
		{"list at the end", "rules: []\nregions:\n  - {name: a}\n", "rules: []\n" + list},
		{"flow list", "regions: [{name: a}, {name: b}]\nrules: []\n", list + "rules: []\n"},
		{"no list", "rules:\n  - id: x\n    regions: global\n", "rules:\n  - id: x\n    regions: global\n\n" + list},
		{"no list, no final newline", "rules: []", "rules: []\n\n" + list},
		{"a rule's regions untouched", "regions:\n  - {name: a}\nrules:\n  - id: x\n    regions: global\n",
			list + "rules:\n  - id: x\n    regions: global\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			src, dst := filepath.Join(dir, "in.yaml"), filepath.Join(dir, "out.yaml")
			if err := os.WriteFile(src, []byte(tt.in), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := writeRegionRules(src, dst, []string{"r1", "r2"}); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(dst)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Fatalf("got\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
	if err := writeRegionRules(filepath.Join(t.TempDir(), "missing.yaml"), filepath.Join(t.TempDir(), "out.yaml"), []string{"r1"}); err == nil ||
		!strings.Contains(err.Error(), "rules file") {
		t.Fatalf("a missing rules file: %v, want an error naming it", err)
	}
}

// TestShippedRulesInRegions: the shipped rules, given three regions, are
// valid and split world-demo's limit of 10 between them, 10 in all.
func TestShippedRulesInRegions(t *testing.T) {
	t.Parallel()
	dst := filepath.Join(t.TempDir(), "rules.yaml")
	if err := writeRegionRules("../../configs/rules.yaml", dst, []string{"r1", "r2", "r3"}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := rules.Load(b)
	if err != nil {
		t.Fatalf("the regions' rules file is invalid: %v", err)
	}
	var names []string
	var total int64
	for _, r := range rs.Regions() {
		names = append(names, r.Name)
		total += rs.RegionShare(r.Name, 10)
	}
	if strings.Join(names, ",") != "r1,r2,r3" || total != 10 {
		t.Fatalf("regions %v sharing %d of 10, want r1,r2,r3 sharing all 10", names, total)
	}
}

// FuzzRegionRules: whatever the rules file holds, the regions' copy is
// made without a panic, holds the stack's list, and a file without a
// regions list only gains one at its end.
func FuzzRegionRules(f *testing.F) {
	for _, s := range []string{"regions:\n  - {name: a}\nrules: []\n", "rules: []", "", "\n\n", "regions: [a]\nregions:\n  - b\n", "regions:", " regions:\n"} {
		f.Add(s)
	}
	if b, err := os.ReadFile("../../configs/rules.yaml"); err == nil {
		f.Add(string(b))
	}
	f.Fuzz(func(t *testing.T, in string) {
		out := string(regionRules([]byte(in), []string{"r1", "r2"}))
		if !strings.Contains(out, "  - {name: r1}\n  - {name: r2}\n") {
			t.Fatalf("no list of the stack's regions in\n%s", out)
		}
		if !strings.Contains(in, "\nregions:") && !strings.HasPrefix(in, "regions:") && !strings.HasPrefix(out, in) {
			t.Fatalf("a file without a regions list was changed, not added to:\n%q\n%q", in, out)
		}
	})
}
