package costs

import (
	"strings"
	"testing"
)

func TestRowCostAndApply(t *testing.T) {
	t.Parallel()
	r, err := RowCost(t.TempDir(), 1_500, 1)
	if err != nil {
		t.Fatal(err)
	}
	// 1 500 keys: one tenant of 1 000 keys (the data set's tenants are
	// whole), one row each.
	if r.Rows != 1_000 || len(r.Reports) != 1 {
		t.Errorf("%d rows, %d reports; want 1000 rows, 1 report", r.Rows, len(r.Reports))
	}
	if r.DiskPerRow <= 0 || r.LogicalPerRow < r.DiskPerRow/4 || r.P99() < r.Reports[0] || r.Mean() <= 0 {
		t.Errorf("implausible figures %+v", r)
	}
	a, err := Apply(3, 5_000)
	if err != nil {
		t.Fatal(err)
	}
	if a.Events != 5_000 || a.CPU <= 0 || a.EventsPerCPUSecond() <= 0 {
		t.Errorf("apply: %+v", a)
	}
}

func TestRefusesBadSizes(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		run  func() error
		want string
	}{
		{"rows of no key", func() error { _, err := RowCost(t.TempDir(), 0, 1); return err }, "both must be ≥ 1"},
		{"no report", func() error { _, err := RowCost(t.TempDir(), 10, 0); return err }, "both must be ≥ 1"},
		{"apply no key", func() error { _, err := Apply(0, 10); return err }, "both must be ≥ 1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.run(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err %v, want %q", err, tc.want)
			}
		})
	}
}
