package keyspace

import (
	"math"
	"slices"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	t.Parallel()
	ok := Config{Keys: 10, Prefix: "k", Dist: Zipf, ZipfS: 1.1, Paths: []string{"/"}}
	tests := []struct {
		name   string
		change func(*Config)
		want   []string // substrings of the error; none: valid
	}{
		{"valid", func(*Config) {}, nil},
		{"empty dist is uniform", func(c *Config) { c.Dist = "" }, nil},
		{"no keys", func(c *Config) { c.Keys = 0 }, []string{"keys must be at least 1"}},
		{"zipf s of 1", func(c *Config) { c.ZipfS = 1 }, []string{"greater than 1"}},
		{"zipf s NaN", func(c *Config) { c.ZipfS = math.NaN() }, []string{"greater than 1"}},
		{"unknown dist", func(c *Config) { c.Dist = "pareto" }, []string{`"pareto"`}},
		{"every fault at once", func(c *Config) { c.Keys, c.Paths, c.Dist = -1, nil, "x" },
			[]string{"keys", "path", `"x"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := ok
			tt.change(&c)
			err := c.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Validate accepted an invalid config")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if _, err := New(c, 1); err == nil {
				t.Error("New accepted an invalid config")
			}
		})
	}
}

func draw(t *testing.T, cfg Config, seed uint64, n int) []int {
	t.Helper()
	p, err := New(cfg, seed)
	if err != nil {
		t.Fatal(err)
	}
	counts := make([]int, cfg.Keys)
	for range n {
		i := p.Index()
		if i < 0 || i >= cfg.Keys {
			t.Fatalf("index %d out of [0, %d)", i, cfg.Keys)
		}
		counts[i]++
	}
	return counts
}

func TestZipfSkew(t *testing.T) {
	t.Parallel()
	const keys, n = 1000, 200_000
	cfg := Config{Keys: keys, Dist: Zipf, ZipfS: 1.1, Paths: []string{"/"}}
	counts := draw(t, cfg, 7, n)
	if top := slices.Max(counts); counts[0] != top {
		t.Errorf("key 0 drawn %d times, but another key %d times", counts[0], top)
	}
	// P(i) = (1+i)^-s / H: key 0 takes about 1/H of the draws.
	var h float64
	for i := range keys {
		h += math.Pow(float64(1+i), -cfg.ZipfS)
	}
	want := float64(n) / h
	if got := float64(counts[0]); math.Abs(got-want) > 0.05*want {
		t.Errorf("key 0 drawn %v times, want %.0f ± 5%%", got, want)
	}
	if !(counts[0] > counts[1] && counts[1] > counts[10] && counts[10] > counts[500]) {
		t.Errorf("counts not decreasing with the index: %d, %d, %d, %d", counts[0], counts[1], counts[10], counts[500])
	}
	uniformShare := n / keys
	if counts[0] < 20*uniformShare {
		t.Errorf("key 0 drawn %d times: barely more than a uniform share (%d)", counts[0], uniformShare)
	}
}

func TestUniformCoverage(t *testing.T) {
	t.Parallel()
	const keys, n = 50, 100_000
	counts := draw(t, Config{Keys: keys, Dist: Uniform, Paths: []string{"/"}}, 3, n)
	want := n / keys // 2000, standard deviation ≈ 44
	for i, c := range counts {
		if c < want*8/10 || c > want*12/10 {
			t.Errorf("key %d drawn %d times, want %d ± 20%%", i, c, want)
		}
	}
}

func TestPickerDeterministicAndNames(t *testing.T) {
	t.Parallel()
	cfg := Config{Keys: 100, Prefix: "sk_load_", Dist: Zipf, ZipfS: 1.3, Paths: []string{"/a", "/b", "/c"}}
	seq := func(seed uint64) []string {
		p, err := New(cfg, seed)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for range 200 {
			k, path := p.Next()
			out = append(out, k+" "+path)
		}
		return out
	}
	a, b, c := seq(1), seq(1), seq(2)
	if !slices.Equal(a, b) {
		t.Error("the same seed drew different sequences")
	}
	if slices.Equal(a, c) {
		t.Error("different seeds drew the same sequence")
	}
	paths := map[string]bool{}
	for _, s := range a {
		key, path, _ := strings.Cut(s, " ")
		if !strings.HasPrefix(key, "sk_load_") {
			t.Fatalf("key %q lacks the prefix", key)
		}
		paths[path] = true
	}
	if len(paths) != 3 {
		t.Errorf("paths drawn %v, want all of %v", paths, cfg.Paths)
	}
	p, _ := New(cfg, 1)
	if got := p.Key(42); got != "sk_load_42" {
		t.Errorf("Key(42) = %q", got)
	}
}
