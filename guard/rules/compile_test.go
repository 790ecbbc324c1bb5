package rules

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/testnet"
)

func TestParams(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		rule   string // rule body, YAML flow mapping content
		want   Params
		policy int64 // PolicyWindow
	}{
		{"token bucket rate 30/1m", "capacity: 30, rate: 30/1m",
			Params{Limit: 30, Precision: 1, FullNum: 60_000_000, FullDen: 1, RatePeriod: 60_000_000}, 60},
		{"token bucket rate 100/1m", "algorithm: token_bucket, capacity: 100, rate: 100/1m",
			Params{Limit: 100, Precision: 1, FullNum: 60_000_000, FullDen: 1, RatePeriod: 60_000_000}, 60},
		{"token bucket refill_rate 0.5", "capacity: 30, refill_rate: 0.5",
			Params{Limit: 30, Precision: 1, FullNum: 60_000_000, FullDen: 1}, 60},
		// 10 units at 7 per 3 s refill in 30/7 s: not a whole number of µs.
		{"token bucket rate 7/3s", "capacity: 10, rate: 7/3s",
			Params{Limit: 10, Precision: 1, FullNum: 30_000_000, FullDen: 7, RatePeriod: 3_000_000}, 5},
		// 0.3 is 3/10 exactly, never 0.29999999999999998.
		{"token bucket refill_rate 0.3", "capacity: 7, refill_rate: 0.3",
			Params{Limit: 7, Precision: 1, FullNum: 70_000_000, FullDen: 3}, 24},
		{"token bucket refill_rate exponent", "capacity: 1, refill_rate: 5e-1",
			Params{Limit: 1, Precision: 1, FullNum: 2_000_000, FullDen: 1}, 2},
		{"token bucket refill_rate integer", "capacity: 4, refill_rate: 2",
			Params{Limit: 4, Precision: 1, FullNum: 2_000_000, FullDen: 1}, 2},
		{"token bucket fast", "capacity: 3, rate: 1000/1ms",
			Params{Limit: 3, Precision: 1, FullNum: 3, FullDen: 1, RatePeriod: 1000}, 1},
		{"token bucket bare unit", "capacity: 100, rate: 100/s",
			Params{Limit: 100, Precision: 1, FullNum: 1_000_000, FullDen: 1, RatePeriod: 1_000_000}, 1},
		{"fixed window", "algorithm: fixed_window, limit: 20, window: 1s",
			Params{Limit: 20, Window: 1_000_000, Precision: 1, FullDen: 1}, 1},
		{"sliding window log", "algorithm: sliding_window_log, limit: 60, window: 1m30s",
			Params{Limit: 60, Window: 90_000_000, Precision: 1, FullDen: 1}, 90},
		{"sliding window counter default precision", "algorithm: sliding_window_counter, limit: 100, window: 1m",
			Params{Limit: 100, Window: 60_000_000, Precision: 1, FullDen: 1}, 60},
		{"sliding window counter precision", "algorithm: sliding_window_counter, limit: 100, window: 1d, precision: 24",
			Params{Limit: 100, Window: 86_400_000_000, Precision: 24, FullDen: 1}, 86400},
		{"sliding window counter ms", "algorithm: sliding_window_counter, limit: 5, window: 1500ms, precision: 1000",
			Params{Limit: 5, Window: 1_500_000, Precision: 1000, FullDen: 1}, 2},
		// gcra: limit 10000 per minute, burst 500: an empty bucket of 500
		// refills in 500 × 60 s ÷ 10000 = 3 s.
		{"gcra", "algorithm: gcra, limit: 10000, window: 1m, burst: 500",
			Params{Limit: 500, Window: 60_000_000, Precision: 1, FullNum: 3_000_000, FullDen: 1}, 3},
		{"gcra default burst", "algorithm: gcra, limit: 100, window: 1m",
			Params{Limit: 100, Window: 60_000_000, Precision: 1, FullNum: 60_000_000, FullDen: 1}, 60},
		{"gcra fractional", "algorithm: gcra, limit: 7, window: 1s, burst: 3",
			Params{Limit: 3, Window: 1_000_000, Precision: 1, FullNum: 3_000_000, FullDen: 7}, 1},
		{"block without parameters", "match: {tier: t}, block: true",
			Params{Precision: 1, FullDen: 1}, 1},
		{"block with limit 0", "match: {tier: t}, block: true, algorithm: fixed_window, limit: 0, window: 1m",
			Params{Window: 60_000_000, Precision: 1, FullDen: 1}, 60},
		{"block with partial parameters", "match: {tier: t}, block: true, capacity: 5",
			Params{Precision: 1, FullDen: 1}, 1},
		{"largest exact", "capacity: 4503599627370496, rate: 1000000/1s",
			Params{}, 0}, // refused below: capacity above 10^12
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rs, err := Load([]byte("rules:\n  - {id: r, " + tt.rule + "}\n"))
			if tt.policy == 0 {
				if err == nil {
					t.Fatal("Load accepted the rule")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			r := rs.Rule("r")
			if r.Params != tt.want {
				t.Errorf("Params = %+v, want %+v", r.Params, tt.want)
			}
			if got := r.Params.PolicyWindow(r.Algorithm); got != tt.policy {
				t.Errorf("PolicyWindow = %d, want %d", got, tt.policy)
			}
		})
	}
}

func TestRatePerSecond(t *testing.T) {
	t.Parallel()
	rs := mustLoad(t, `rules:
  - {id: half, capacity: 30, refill_rate: 0.5}
  - {id: seven, capacity: 10, rate: 7/3s}
  - {id: fw, algorithm: fixed_window, limit: 30, window: 1m}
  - {id: gcra, algorithm: gcra, limit: 10000, window: 1m, burst: 500}
`)
	for id, want := range map[string]float64{"half": 0.5, "seven": 7.0 / 3, "fw": 0.5, "gcra": 10000.0 / 60} {
		r := rs.Rule(id)
		if got := r.Params.RatePerSecond(r.Algorithm); math.Abs(got-want) > 1e-9 {
			t.Errorf("%s: RatePerSecond = %v, want %v", id, got, want)
		}
	}
}

// TestPolicyWindowLargeDenominator: denominators up to 2^52 must not
// overflow while computing w.
func TestPolicyWindowLargeDenominator(t *testing.T) {
	t.Parallel()
	p := Params{Limit: 1, FullNum: 1 << 52, FullDen: (1 << 52) - 1}
	if got := p.PolicyWindow(TokenBucket); got != 1 {
		t.Errorf("PolicyWindow = %d, want 1", got)
	}
	p = Params{Limit: 1, FullNum: 1 << 52, FullDen: 3}
	if got, want := p.PolicyWindow(TokenBucket), int64((1<<52)/3/1_000_000+1); got != want {
		t.Errorf("PolicyWindow = %d, want %d", got, want)
	}
	rs := mustLoad(t, "rules:\n  - {id: r, capacity: 7, refill_rate: 9999999999.999}\n")
	r := rs.Rule("r")
	if r.Params.FullDen < 1e12 {
		t.Fatalf("expected a large denominator, got %+v", r.Params)
	}
	if got := r.Params.PolicyWindow(TokenBucket); got != 1 {
		t.Errorf("PolicyWindow = %d, want 1", got)
	}
}

func TestOverrides(t *testing.T) {
	t.Parallel()
	rs := mustLoad(t, `rules:
  - id: tb
    capacity: 100
    rate: 100/1m
    overrides:
      sk_capacity: {capacity: 1000}             # keeps 100/1m
      sk_rate: {rate: 50/1s}                    # keeps capacity 100
      sk_refill: {refill_rate: 0.5}             # replaces rate
      sk_both: {capacity: 1000, rate: 1000/1m}
      "kid:AAAAAAAAAAAAAAAAAAAAAA": {capacity: 7}
  - id: tb-refill
    capacity: 10
    refill_rate: 2
    overrides:
      sk_rate: {rate: 1/1s}
  - id: gcra
    algorithm: gcra
    limit: 600
    window: 1m
    overrides:
      sk_limit: {limit: 1200}                   # burst follows the default
      sk_burst: {burst: 50}
  - id: gcra-burst
    algorithm: gcra
    limit: 600
    window: 1m
    burst: 20
    overrides:
      sk_limit: {limit: 1200}                   # keeps burst 20, doubles the rate
  - id: swc
    algorithm: sliding_window_counter
    limit: 100
    window: 1m
    precision: 6
    overrides:
      sk_limit: {limit: 5}
`)
	tests := []struct {
		rule, key, kid string
		want           Params
		override       bool
	}{
		{"tb", "sk_capacity", "", Params{Limit: 1000, Precision: 1, FullNum: 600_000_000, FullDen: 1, RatePeriod: 60_000_000}, true},
		{"tb", "sk_rate", "", Params{Limit: 100, Precision: 1, FullNum: 2_000_000, FullDen: 1, RatePeriod: 1_000_000}, true},
		{"tb", "sk_refill", "", Params{Limit: 100, Precision: 1, FullNum: 200_000_000, FullDen: 1}, true},
		{"tb", "sk_both", "", Params{Limit: 1000, Precision: 1, FullNum: 60_000_000, FullDen: 1, RatePeriod: 60_000_000}, true},
		{"tb", "sk_other", "AAAAAAAAAAAAAAAAAAAAAA", Params{Limit: 7, Precision: 1, FullNum: 4_200_000, FullDen: 1, RatePeriod: 60_000_000}, true},
		{"tb", "sk_capacity", "AAAAAAAAAAAAAAAAAAAAAA", Params{Limit: 1000, Precision: 1, FullNum: 600_000_000, FullDen: 1, RatePeriod: 60_000_000}, true},
		{"tb", "sk_other", "BBBB", Params{Limit: 100, Precision: 1, FullNum: 60_000_000, FullDen: 1, RatePeriod: 60_000_000}, false},
		{"tb", "", "", Params{Limit: 100, Precision: 1, FullNum: 60_000_000, FullDen: 1, RatePeriod: 60_000_000}, false},
		{"tb-refill", "sk_rate", "", Params{Limit: 10, Precision: 1, FullNum: 10_000_000, FullDen: 1, RatePeriod: 1_000_000}, true},
		{"gcra", "sk_limit", "", Params{Limit: 1200, Window: 60_000_000, Precision: 1, FullNum: 60_000_000, FullDen: 1}, true},
		{"gcra", "sk_burst", "", Params{Limit: 50, Window: 60_000_000, Precision: 1, FullNum: 5_000_000, FullDen: 1}, true},
		{"gcra-burst", "sk_limit", "", Params{Limit: 20, Window: 60_000_000, Precision: 1, FullNum: 1_000_000, FullDen: 1}, true},
		{"swc", "sk_limit", "", Params{Limit: 5, Window: 60_000_000, Precision: 6, FullDen: 1}, true},
	}
	for _, tt := range tests {
		t.Run(tt.rule+"/"+tt.key+"/"+tt.kid, func(t *testing.T) {
			t.Parallel()
			got, ok := rs.Rule(tt.rule).ParamsFor(tt.key, tt.kid)
			if got != tt.want || ok != tt.override {
				t.Errorf("ParamsFor = %+v, %v; want %+v, %v", got, ok, tt.want, tt.override)
			}
		})
	}
}

func TestDurations(t *testing.T) {
	t.Parallel()
	good := map[string]int64{
		"1ms": 1000, "500ms": 500_000, "1s": 1_000_000, "1m": 60_000_000, "1h": 3_600_000_000,
		"1d": 86_400_000_000, "1m30s": 90_000_000, "1h30m": 5_400_000_000, "1d12h": 129_600_000_000,
		"366d": 366 * 86_400_000_000, "2s500ms": 2_500_000,
	}
	for s, want := range good {
		if got, err := parseDuration(s); err != nil || got != want {
			t.Errorf("parseDuration(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	for _, s := range []string{"", "0s", "0ms", "-1s", "1", "1.5s", "1us", "1µs", "s", "1 m", "1m ", "367d", "99999999999999999d", "1w", "1m-1s", "+1s"} {
		if got, err := parseDuration(s); err == nil {
			t.Errorf("parseDuration(%q) = %d, want an error", s, got)
		}
	}
}

// tagOf loads a one-rule ruleset and returns the rule's tag.
func tagOf(t *testing.T, rule string) string {
	t.Helper()
	return mustLoad(t, "rules:\n  - {"+rule+"}\n").Rules()[0].Tag
}

func TestTagIdentity(t *testing.T) {
	t.Parallel()
	base := tagOf(t, "id: r, algorithm: sliding_window_counter, limit: 100, window: 1m, precision: 6")
	if len(base) != 3 {
		t.Fatalf("tag %q, want 3 characters", base)
	}
	same := map[string]string{
		"limit":    "id: r, algorithm: sliding_window_counter, limit: 5000, window: 1m, precision: 6",
		"match":    "id: r, algorithm: sliding_window_counter, limit: 100, window: 1m, precision: 6, match: {tier: pro}",
		"cost":     "id: r, algorithm: sliding_window_counter, limit: 100, window: 1m, precision: 6, cost: 3",
		"strict":   "id: r, algorithm: sliding_window_counter, limit: 100, window: 1m, precision: 6, strict: true",
		"compound": "id: r, algorithm: sliding_window_counter, limit: 100, window: 60s, precision: 6",
	}
	for name, rule := range same {
		if got := tagOf(t, rule); got != base {
			t.Errorf("changing %s changed the tag: %q -> %q", name, base, got)
		}
	}
	changed := map[string]string{
		"id":          "id: r2, algorithm: sliding_window_counter, limit: 100, window: 1m, precision: 6",
		"window":      "id: r, algorithm: sliding_window_counter, limit: 100, window: 2m, precision: 6",
		"precision":   "id: r, algorithm: sliding_window_counter, limit: 100, window: 1m, precision: 5",
		"algorithm":   "id: r, algorithm: fixed_window, limit: 100, window: 1m",
		"scope":       "id: r, algorithm: sliding_window_counter, limit: 100, window: 1m, precision: 6, scope: tenant",
		"by_endpoint": "id: r, algorithm: sliding_window_counter, limit: 100, window: 1m, precision: 6, by_endpoint: true",
	}
	for name, rule := range changed {
		if got := tagOf(t, rule); got == base {
			t.Errorf("changing %s kept the tag %q", name, base)
		}
	}
	tb := tagOf(t, "id: b, capacity: 30, rate: 30/1m")
	for _, rule := range []string{"id: b, capacity: 300, rate: 30/1m", "id: b, capacity: 30, refill_rate: 7", "id: b, capacity: 1, rate: 1/1d"} {
		if got := tagOf(t, rule); got != tb {
			t.Errorf("token bucket tag changed with its capacity or rate: %q -> %q (%s)", tb, got, rule)
		}
	}
	gcra := tagOf(t, "id: g, algorithm: gcra, limit: 10, window: 1m")
	if tagOf(t, "id: g, algorithm: gcra, limit: 20, window: 1m, burst: 3") != gcra {
		t.Error("gcra tag changed with limit or burst")
	}
	if tagOf(t, "id: g, algorithm: gcra, limit: 10, window: 1h") == gcra {
		t.Error("gcra tag kept across a window change")
	}
}

func TestTagsOrderIndependent(t *testing.T) {
	t.Parallel()
	rules := []string{
		"  - {id: a, capacity: 10, rate: 10/1m}\n",
		"  - {id: b, algorithm: fixed_window, limit: 10, window: 1m}\n",
		"  - {id: c, algorithm: gcra, limit: 10, window: 1m}\n",
		"  - {id: d, algorithm: sliding_window_counter, limit: 10, window: 1m, precision: 4}\n",
		"  - {id: e, algorithm: sliding_window_log, limit: 10, window: 1m, scope: ip}\n",
	}
	tags := func(order []int, extra string) map[string]string {
		src := "rules:\n"
		for _, i := range order {
			src += rules[i]
		}
		src += extra
		out := map[string]string{}
		for _, r := range mustLoad(t, src).Rules() {
			out[r.ID] = r.Tag
		}
		return out
	}
	want := tags([]int{0, 1, 2, 3, 4}, "")
	for _, order := range [][]int{{4, 3, 2, 1, 0}, {2, 0, 4, 1, 3}} {
		got := tags(order, "")
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("order %v: tags %v, want %v", order, got, want)
		}
	}
	got := tags([]int{1, 0, 2, 3, 4}, "  - {id: inserted, capacity: 1, rate: 1/s}\n")
	delete(got, "inserted")
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("inserting a rule changed tags: %v, want %v", got, want)
	}
}

// TestTagCollision: rules whose 3-character tags collide all get 8.
func TestTagCollision(t *testing.T) {
	t.Parallel()
	seen := map[string]string{}
	var a, b string
	for i := 0; a == ""; i++ {
		id := fmt.Sprintf("r%d", i)
		r := &Rule{ID: id, Algorithm: TokenBucket, Scope: ScopeKey, Params: Params{Precision: 1}}
		assignTags([]*Rule{r})
		if other, ok := seen[r.Tag]; ok {
			a, b = other, id
		}
		seen[r.Tag] = id
	}
	src := fmt.Sprintf("rules:\n  - {id: %s, capacity: 1, rate: 1/s}\n  - {id: other, capacity: 1, rate: 1/s}\n  - {id: %s, capacity: 2, rate: 1/s}\n", a, b)
	rs := mustLoad(t, src)
	ta, tb, to := rs.Rule(a).Tag, rs.Rule(b).Tag, rs.Rule("other").Tag
	if len(ta) != 8 || len(tb) != 8 || ta == tb || ta[:3] != tb[:3] || len(to) != 3 {
		t.Errorf("tags %q %q %q", ta, tb, to)
	}
	alone := mustLoad(t, fmt.Sprintf("rules:\n  - {id: %s, capacity: 1, rate: 1/s}\n", a)).Rule(a).Tag
	if alone != ta[:3] {
		t.Errorf("tag without the collision = %q, want %q", alone, ta[:3])
	}
}

func TestTagsUnique(t *testing.T) {
	t.Parallel()
	rs := mustLoad(t, "rules:\n"+strings.Join(testnet.Numbered("  - {id: rule-%d, capacity: 1, rate: 1/s}\n", 3000), ""))
	var tags []string
	for _, r := range rs.Rules() {
		tags = append(tags, r.Tag)
	}
	slices.Sort(tags)
	if len(slices.Compact(tags)) != 3000 {
		t.Error("tags are not unique")
	}
}
