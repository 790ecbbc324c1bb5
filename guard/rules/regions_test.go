package rules

import (
	"slices"
	"testing"
)

func TestRegionShares(t *testing.T) {
	t.Parallel()
	const rule = "\nrules:\n  - {id: g, algorithm: fixed_window, limit: 10, window: 1s, regions: global}\n  - {id: r, algorithm: fixed_window, limit: 10, window: 1s}\n"
	tests := []struct {
		name    string
		regions string
		limit   int64
		want    map[string]int64 // region -> share of limit
		list    []Region
	}{
		{name: "no list: the whole limit wherever", limit: 10, want: map[string]int64{"": 10, "eu": 10}},
		{name: "equal parts", regions: "regions: [{name: eu}, {name: us}, {name: ap}]", limit: 10,
			want: map[string]int64{"eu": 4, "us": 3, "ap": 3, "sa": 0},
			list: []Region{{"eu", 333334}, {"us", 333333}, {"ap", 333333}}},
		{name: "largest remainder, no unit stranded", regions: "regions: [{name: eu, weight: 0.45}, {name: us, weight: 0.55}]", limit: 3,
			want: map[string]int64{"eu": 1, "us": 2}, list: []Region{{"eu", 450000}, {"us", 550000}}},
		{name: "fewer units than regions", regions: "regions: [{name: a}, {name: b}, {name: c}]", limit: 2,
			want: map[string]int64{"a": 1, "b": 1, "c": 0}},
		{name: "weights under 1 keep the rest", regions: "regions: [{name: a, weight: 0.25}, {name: b, weight: 0.25}]", limit: 10,
			want: map[string]int64{"a": 3, "b": 2}}, // 5 of 10: quotas 2.5 each, the tie to the first
		{name: "one region of weight 1", regions: "regions: [{name: solo, weight: 1}]", limit: 7,
			want: map[string]int64{"solo": 7, "other": 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rs, err := Load([]byte(tt.regions + rule))
			if err != nil {
				t.Fatal(err)
			}
			if rs.Rule("g").Regions != RegionsGlobal || rs.Rule("r").Regions != RegionsRegional {
				t.Fatalf("modes %q %q", rs.Rule("g").Regions, rs.Rule("r").Regions)
			}
			for region, want := range tt.want {
				if got := rs.RegionShare(region, tt.limit); got != want {
					t.Errorf("share of %d in %q = %d, want %d", tt.limit, region, got, want)
				}
			}
			if tt.list != nil && !slices.Equal(rs.Regions(), tt.list) {
				t.Errorf("regions %+v, want %+v", rs.Regions(), tt.list)
			}
		})
	}
}
