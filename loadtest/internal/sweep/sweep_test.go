package sweep

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/loadtest/internal/keyspace"
)

func TestParseKeys(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in   string
		want []int
		err  string
	}{
		{"1k,100k,1m,10m", []int{1_000, 100_000, 1_000_000, 10_000_000}, ""},
		{" 2500 , 3K,", []int{2_500, 3_000}, ""},
		{"1x", nil, `count "1x"`},
		{"0", nil, `count "0"`},
		{"-5", nil, `count "-5"`},
		{"1.5m", nil, `count "1.5m"`},
		{"101m", nil, `count "101m"`},
		{"", nil, "no key counts"},
		{"k", nil, `count "k"`},
	}
	for _, tc := range cases {
		got, err := ParseKeys(tc.in)
		if tc.err != "" {
			if err == nil || !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseKeys(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("ParseKeys(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	for k, name := range map[int]string{1_000: "1k", 100_000: "100k", 1_000_000: "1M", 10_000_000: "10M", 2_500: "2500", 1_500_000: "1500k"} {
		if got := KeyName(k); got != name {
			t.Errorf("KeyName(%d) = %q, want %q", k, got, name)
		}
	}
}

func TestParseEarlier(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in   string
		want Earlier
		err  string
	}{
		{"abb8edd=193223, 35666,-,34974", Earlier{"abb8edd", []float64{193223, 35666, nan, 34974}}, ""},
		{" before the rework =1.5e5", Earlier{"before the rework", []float64{150000}}, ""},
		{"=1,2", Earlier{}, "want NAME=V"},
		{"name", Earlier{}, "want NAME=V"},
		{"name=", Earlier{}, "want NAME=V"},
		{"name=1,x", Earlier{}, `value "x"`},
		{"name=1,,2", Earlier{}, `value ""`},
		{"name=-3", Earlier{}, `value "-3"`},
		{"name=NaN", Earlier{}, `value "NaN"`},
		{"name=+Inf", Earlier{}, `value "+Inf"`},
	}
	for _, tc := range cases {
		got, err := ParseEarlier(tc.in)
		if tc.err != "" {
			if err == nil || !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseEarlier(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.err)
			}
			continue
		}
		same := got.Name == tc.want.Name && slices.EqualFunc(got.Values, tc.want.Values, func(a, b float64) bool { return a == b || math.IsNaN(a) && math.IsNaN(b) })
		if err != nil || !same {
			t.Errorf("ParseEarlier(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	c := DefaultConfig()
	c.AggregatorEarlier = []Earlier{{"short", []float64{1, 2}}}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "2 values for 4 key counts") {
		t.Errorf("Validate with 2 earlier values for 4 key counts = %v, want an error", err)
	}
}

// FuzzParseEarlier: any input gives a series or an ErrConfig error, never
// a panic, and a series has a name and only figures ≥ 0 or gaps.
func FuzzParseEarlier(f *testing.F) {
	for _, s := range []string{"a=1,2,-", "=", "x=1e400", "n=,", "a=b=c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		e, err := ParseEarlier(s)
		if err != nil {
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("ParseEarlier(%q): error %v is not ErrConfig", s, err)
			}
			return
		}
		if e.Name == "" || len(e.Values) == 0 {
			t.Fatalf("ParseEarlier(%q) = %+v: no name or no values", s, e)
		}
		for _, v := range e.Values {
			if v < 0 || math.IsInf(v, 0) {
				t.Fatalf("ParseEarlier(%q) = %+v: a value out of bounds", s, e)
			}
		}
	})
}

// TestAggregatorChartKeepsEarlier: the aggregator's chart draws the
// earlier series first, in thousands, then this sweep's.
func TestAggregatorChartKeepsEarlier(t *testing.T) {
	t.Parallel()
	r := &Result{Config: DefaultConfig(), Aggregator: []AggregatorPoint{{Keys: 1_000, EventsPerCPU: 400_000}}}
	r.Config.Keys = []int{1_000, 100_000}
	r.Config.AggregatorEarlier = []Earlier{{"before", []float64{200_000, nan}}}
	for _, f := range r.Figures() {
		if f.File != "sweep-aggregator.svg" {
			continue
		}
		s := f.Chart.Series
		if len(s) != 2 || s[0].Name != "before" || s[0].Values[0] != 200 || !math.IsNaN(s[0].Values[1]) || s[1].Values[0] != 400 {
			t.Fatalf("aggregator chart series %+v, want the earlier one (200, gap) then this sweep's (400)", s)
		}
		return
	}
	t.Fatal("no aggregator chart")
}

func TestParseWhatAndDists(t *testing.T) {
	t.Parallel()
	if got, err := ParseWhat("pebble, gateway"); err != nil || !slices.Equal(got, []string{Gateway, Pebble}) {
		t.Errorf("ParseWhat = %v, %v; want gateway, pebble in run order", got, err)
	}
	if got, err := ParseWhat("all,redis"); err != nil || !slices.Equal(got, Parts) {
		t.Errorf("ParseWhat(all) = %v, %v", got, err)
	}
	for _, bad := range []string{"gatway", "", " , ", "all,nats"} {
		if got, err := ParseWhat(bad); err == nil || !errors.Is(err, ErrConfig) {
			t.Errorf("ParseWhat(%q) = %v, %v; want an error", bad, got, err)
		}
	}
	if got, err := ParseDists("zipf,uniform,zipf"); err != nil || !slices.Equal(got, []string{keyspace.Zipf, keyspace.Uniform}) {
		t.Errorf("ParseDists = %v, %v", got, err)
	}
	for _, bad := range []string{"normal", ""} {
		if _, err := ParseDists(bad); err == nil || !errors.Is(err, ErrConfig) {
			t.Errorf("ParseDists(%q): want an error", bad)
		}
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"default", func(*Config) {}, ""},
		{"keys descend", func(c *Config) { c.Keys = []int{1000, 10} }, "must ascend"},
		{"no keys", func(c *Config) { c.Keys = nil }, "no key counts"},
		{"zero point", func(c *Config) { c.Point = 0 }, "-point 0s"},
		{"hour point", func(c *Config) { c.Point = time.Hour }, "-point 1h0m0s"},
		{"no workers", func(c *Config) { c.Workers = 0 }, "-workers 0"},
		{"zipf exponent", func(c *Config) { c.ZipfS = 1 }, "-zipf-s 1"},
		{"no events", func(c *Config) { c.Events = 0 }, "-events 0"},
		{"no reports", func(c *Config) { c.Reports = 0 }, "-reports 0"},
		{"unknown part", func(c *Config) { c.What = []string{"nats"} }, `-what "nats"`},
		{"point unused without gateway", func(c *Config) { c.What = []string{Redis}; c.Point = 0 }, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.edit(&c)
			err := c.Validate()
			if tc.want == "" {
				if err != nil {
					t.Errorf("Validate = %v, want nil", err)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate = %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// TestTinySweep runs every part at two small key counts against a real
// redis-server and checks the figures, the charts (parsed back) and the
// tables. It asserts no timing.
func TestTinySweep(t *testing.T) {
	srv := redistest.StartTB(t)
	cfg := Config{
		What: slices.Clone(Parts), Keys: []int{50, 2_000}, Dists: []string{keyspace.Uniform, keyspace.Zipf}, ZipfS: 1.1,
		Point: 300 * time.Millisecond, Workers: 4, Events: 5_000, Reports: 1,
		AllAlgorithmsUpTo: 50, PebbleUpTo: 50, Seed: 3,
	}
	var progress bytes.Buffer
	res, err := Run(context.Background(), cfg, Env{RedisAddr: srv.Addr(), RedisPID: srv.Pid(), TempDir: t.TempDir()}, &progress)
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	t.Log(progress.String())
	if len(res.Gateway) != 4 {
		t.Fatalf("%d gateway points, want 4", len(res.Gateway))
	}
	for _, p := range res.Gateway {
		if p.Decisions == 0 || p.Distinct == 0 || p.Distinct > p.Keys || p.Local < 0 || p.Local > 1 || p.CPUPerDecision <= 0 || p.EvalSHA <= 0 {
			t.Errorf("implausible gateway point %+v", p)
		}
		if p.Tracked != min(p.Distinct, 1<<16) {
			t.Errorf("%d tracked for %d distinct keys", p.Tracked, p.Distinct)
		}
	}
	// Five algorithms at 50 keys, the token bucket alone at 2 000.
	if len(res.Redis) != 6 || res.Redis[5].Keys != 2_000 || res.Redis[5].Algorithm != Algorithms[0] {
		t.Errorf("redis points %+v, want 5 at 50 keys and the token bucket at 2000", res.Redis)
	}
	for _, p := range res.Redis {
		// used_memory moves by more than 50 small counters take (client
		// buffers, table resizes): only MEMORY USAGE is checked.
		if p.Usage < 50 || p.Usage > 400 || p.Encoding == "" {
			t.Errorf("implausible redis point %+v", p)
		}
	}
	if len(res.Aggregator) != 2 || res.Aggregator[1].DistinctEvents != 2_000 || res.Aggregator[0].EventsPerCPU <= 0 {
		t.Errorf("aggregator points %+v", res.Aggregator)
	}
	if len(res.Pebble) != 1 || res.Pebble[0].DiskPerRow <= 0 || res.Pebble[0].ReportP99 <= 0 {
		t.Errorf("pebble points %+v, want one at 50 keys", res.Pebble)
	}
	if len(res.Notes) != 2 {
		t.Errorf("notes %q, want the token-bucket-only and the pebble skip", res.Notes)
	}

	dir := t.TempDir()
	files, err := res.WriteFigures(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"sweep-gateway-cpu.svg", "sweep-gateway-local.svg", "sweep-gateway-memory.svg", "sweep-redis-bytes.svg",
		"sweep-aggregator.svg", "sweep-pebble-bytes.svg", "sweep-report.svg"}
	if len(files) != len(want) {
		t.Fatalf("wrote %q, want %q", files, want)
	}
	for _, name := range want {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		texts := svgTexts(t, b)
		for _, label := range []string{"50", "2k", keysTitle} {
			if !slices.Contains(texts, label) {
				t.Errorf("%s: no label %q in %q", name, label, texts)
			}
		}
	}
	var md bytes.Buffer
	if err := res.WriteMarkdown(&md, "abc123"); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"commit abc123", "| 2k | zipf |", "| 50 | 1", "| 2k | 2000 |", "pebble: 2k keys not run"} {
		if !strings.Contains(md.String(), s) {
			t.Errorf("the tables lack %q:\n%s", s, md.String())
		}
	}
}

// svgTexts parses an SVG document, failing on malformed XML, and returns
// its texts.
func svgTexts(t *testing.T, doc []byte) []string {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(doc))
	var texts []string
	inText := false
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return texts
		}
		if err != nil {
			t.Fatalf("malformed SVG: %v", err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			inText = tok.Name.Local == "text"
		case xml.EndElement:
			inText = false
		case xml.CharData:
			if inText {
				texts = append(texts, strings.TrimSpace(string(tok)))
			}
		}
	}
}
