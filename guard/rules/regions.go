package rules

import (
	"cmp"
	"fmt"
	"math/big"
	"slices"

	"github.com/tollgate/tollgate/internal/regions"
)

// RegionMode says how a rule's limit is enforced across regions.
type RegionMode string

// Region modes. RegionsRegional is the default.
const (
	// RegionsRegional: every region enforces the whole limit on its own,
	// so a client that rotates N regions can get N × the limit.
	RegionsRegional RegionMode = "regional"
	// RegionsGlobal: the limit holds for all regions together; each
	// region enforces its share of it in its own Redis.
	RegionsGlobal RegionMode = "global"
)

// Region is one region of the rules file's `regions` list: its name and
// its weight in parts per million (WeightScale is a weight of 1).
type Region struct {
	Name   string
	Weight int64
}

// WeightScale is a region weight of 1: weights are parts per million.
const WeightScale = regions.WeightScale

// minGlobalWindow is the shortest window of a global fixed_window rule:
// four times the clock skew bound between regions, since an admission
// within the bound of a window's boundary is due in both windows.
const minGlobalWindow = 4 * regions.DefaultSkew

// Regions returns the rules file's `regions` list with every weight
// filled in (equal parts summing to 1 when the file gives none), or nil
// when the file has none: the deployment is one region, whatever its
// name, holding every global limit whole. The slice must not be modified.
func (rs *Ruleset) Regions() []Region { return rs.regions }

// RegionShare is region's static share of a global rule's limit (a
// window's units, or a bucket's capacity, whose rate is split with it):
// the limit split by the weights with largest-remainder rounding, so that
// the shares sum to the limit when the weights sum to 1 and no unit is
// left over; with a limit smaller than the number of regions some shares
// are 0. Without a `regions` list it is the whole limit. A region the
// list does not name has a share of 0.
func (rs *Ruleset) RegionShare(region string, limit int64) int64 {
	if len(rs.regions) == 0 || limit <= 0 {
		return max(limit, 0)
	}
	i := slices.IndexFunc(rs.regions, func(r Region) bool { return r.Name == region })
	if i < 0 {
		return 0
	}
	w := make([]int64, len(rs.regions))
	for j, r := range rs.regions {
		w[j] = r.Weight
	}
	shares, err := regions.StaticShares(limit, w)
	if err != nil {
		// Compile validated the weights; nothing is the safe answer.
		return 0
	}
	return shares[i]
}

// HasRegion reports whether region may run this ruleset's global rules
// with a share: the `regions` list names it, or there is no list.
func (rs *Ruleset) HasRegion(region string) bool {
	return len(rs.regions) == 0 || slices.ContainsFunc(rs.regions, func(r Region) bool { return r.Name == region })
}

// CheckRegionName reports whether s is a valid region name: 1 to 64
// characters from a-z, 0-9 and -.
func CheckRegionName(s string) error {
	if err := (regions.Fleet{Members: []regions.Member{{Name: s}}}).Validate(); err != nil {
		return fmt.Errorf("invalid region name %q: want 1 to 64 characters from a-z, 0-9 and -", s)
	}
	return nil
}

// regionList validates and compiles the `regions` list.
func (c *compiler) regionList() {
	specs := c.doc.Regions
	if specs == nil {
		return
	}
	top := c.doc.lines["regions"]
	if len(specs) == 0 {
		c.errorf("", "regions", top, "must list at least one region (leave it out for a single region)")
		return
	}
	if len(specs) > regions.MaxRegions {
		c.errorf("", "regions", top, "%d regions: at most %d", len(specs), regions.MaxRegions)
		return
	}
	out := make([]Region, len(specs))
	seen := map[string]int{}
	weighted := 0
	var sum int64
	ok := true
	million := big.NewRat(WeightScale, 1)
	for i, s := range specs {
		field := fmt.Sprintf("regions[%d]", i)
		line := cmp.Or(s.line, top)
		out[i].Name = s.Name
		switch {
		case s.Name == "":
			c.errorf("", field+".name", line, "name is required")
			ok = false
		case CheckRegionName(s.Name) != nil:
			c.errorf("", field+".name", line, "%v", CheckRegionName(s.Name))
			ok = false
		default:
			if j, dup := seen[s.Name]; dup {
				c.errorf("", field+".name", line, "region %q twice (also regions[%d])", s.Name, j)
				ok = false
			}
			seen[s.Name] = i
		}
		if s.Weight == "" {
			continue
		}
		weighted++
		r, err := parseExactDecimal(s.Weight)
		if err != nil {
			c.errorf("", field+".weight", line, "%v", err)
			ok = false
			continue
		}
		ppm := new(big.Rat).Mul(r, million)
		if !ppm.IsInt() || ppm.Num().Cmp(big.NewInt(WeightScale)) > 0 {
			c.errorf("", field+".weight", line, "weight %s: want a number from 0 to 1 with at most six decimals", s.Weight)
			ok = false
			continue
		}
		out[i].Weight = ppm.Num().Int64()
		sum += out[i].Weight
	}
	switch {
	case weighted == 0:
		eq := regions.EqualFleet(make([]string, len(specs))...)
		for i := range out {
			out[i].Weight = eq.Members[i].Weight
		}
	case weighted < len(specs):
		c.errorf("", "regions", top, "%d of %d regions have a weight: give every region one, or none (equal parts)", weighted, len(specs))
		ok = false
	case sum > WeightScale:
		c.errorf("", "regions", top, "the weights sum to %s, more than 1", big.NewRat(sum, WeightScale).FloatString(6))
		ok = false
	}
	if ok {
		c.rs.regions = out
	}
}

// regionMode validates a rule's `regions` field.
func (c *compiler) regionMode(name string, r *Rule, s *RuleSpec, line func(string) int) {
	switch RegionMode(s.Regions) {
	case "", RegionsRegional:
		r.Regions = RegionsRegional
	case RegionsGlobal:
		r.Regions = RegionsGlobal
		if r.Algorithm == FixedWindow && r.Params.Window > 0 && r.Params.Window < minGlobalWindow {
			c.errorf(name, "window", line("window"), "a global fixed_window needs a window of at least %dms (four times the clock skew allowed between regions)", minGlobalWindow/1000)
		}
	default:
		c.errorf(name, "regions", line("regions"), "unknown regions mode %q (want regional or global)", s.Regions)
	}
}
