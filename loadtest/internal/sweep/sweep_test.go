package sweep

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"io"
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
