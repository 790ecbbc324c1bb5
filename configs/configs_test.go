package configs_test

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/configs"
)

type inner struct {
	Addrs   []string      `yaml:"addrs" doc:"Servers."`
	Timeout time.Duration `yaml:"timeout" doc:"Deadline."`
	DB      int           `yaml:"db"`
}

type testConfig struct {
	Listen  string         `yaml:"listen" doc:"Where to listen."`
	Enabled bool           `yaml:"enabled" doc:"On or off."`
	Share   float64        `yaml:"failure_share" doc:"A share."`
	Count   uint16         `yaml:"count" doc:"A count."`
	Redis   inner          `yaml:"redis"`
	Proxies []netip.Prefix `yaml:"trusted_proxies" doc:"CIDRs."`
	Skipped map[string]int `yaml:"skipped" env:"-"`
	Hidden  string         `yaml:"-"`
	secret  string         //nolint:unused // unexported fields are ignored
}

func TestEnvOverrides(t *testing.T) {
	t.Parallel()
	var c testConfig
	c.Redis.Addrs = []string{"default:1"}
	err := configs.ApplyEnv(&c, configs.MapLookup(map[string]string{
		"TOLLGATE_LISTEN":          "0.0.0.0:80",
		"TOLLGATE_ENABLED":         "true",
		"TOLLGATE_FAILURE_SHARE":   "0.5",
		"TOLLGATE_COUNT":           "7",
		"TOLLGATE_REDIS_ADDRS":     "a:1, b:2,,c:3,",
		"TOLLGATE_REDIS_TIMEOUT":   "75ms",
		"TOLLGATE_REDIS_DB":        "3",
		"TOLLGATE_TRUSTED_PROXIES": "10.0.0.0/8,2001:db8::/32",
		"TOLLGATE_HIDDEN":          "ignored",
		"TOLLGATE_SKIPPED":         "ignored",
	}))
	if err != nil {
		t.Fatal(err)
	}
	want := testConfig{
		Listen: "0.0.0.0:80", Enabled: true, Share: 0.5, Count: 7,
		Redis:   inner{Addrs: []string{"a:1", "b:2", "c:3"}, Timeout: 75 * time.Millisecond, DB: 3},
		Proxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")},
	}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("got %+v\nwant %+v", c, want)
	}
}

func TestEnvEmptyValueClears(t *testing.T) {
	t.Parallel()
	c := testConfig{Listen: "x", Redis: inner{Addrs: []string{"a"}, Timeout: time.Second}}
	if err := configs.ApplyEnv(&c, configs.MapLookup(map[string]string{
		"TOLLGATE_LISTEN": "", "TOLLGATE_REDIS_ADDRS": "", "TOLLGATE_REDIS_TIMEOUT": "",
	})); err != nil {
		t.Fatal(err)
	}
	if c.Listen != "" || len(c.Redis.Addrs) != 0 || c.Redis.Timeout != 0 {
		t.Fatalf("empty variables did not clear: %+v", c)
	}
}

func TestEnvBadValuesNameTheVariable(t *testing.T) {
	t.Parallel()
	var c testConfig
	err := configs.ApplyEnv(&c, configs.MapLookup(map[string]string{
		"TOLLGATE_REDIS_TIMEOUT":   "50",
		"TOLLGATE_ENABLED":         "yes please",
		"TOLLGATE_COUNT":           "70000",
		"TOLLGATE_FAILURE_SHARE":   "a quarter",
		"TOLLGATE_TRUSTED_PROXIES": "10.0.0.0/8,not-a-cidr",
	}))
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{
		"TOLLGATE_REDIS_TIMEOUT (redis.timeout)", "not a duration",
		"TOLLGATE_ENABLED (enabled)", "TOLLGATE_COUNT (count)", "16 bits",
		"TOLLGATE_FAILURE_SHARE (failure_share)", "TOLLGATE_TRUSTED_PROXIES (trusted_proxies): item 2",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
}

func TestDecodeRefusesUnknownFieldsWithLine(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		yaml string
		want []string
	}{
		{"top level", "listen: a\nlisten_addr: b\n", []string{"cfg.yaml", "line 2", "listen_addr"}},
		{"nested", "redis:\n  addrs: [a]\n  adress: b\n", []string{"line 3", "adress"}},
		{"wrong type", "redis:\n  db: many\n", []string{"line 2"}},
		{"duration without unit", "redis:\n  timeout: 50\n", []string{"line 2"}},
		{"two documents", "listen: a\n---\nlisten: b\n", []string{"line 2", "more than one"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var c testConfig
			err := configs.Decode(&c, []byte(tt.yaml), "cfg.yaml")
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not mention %q: %v", w, err)
				}
			}
		})
	}
}

func TestLoadFileThenEnv(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte("listen: file:1\nredis:\n  addrs: [f:1]\n  timeout: 1s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var c testConfig
	if err := configs.Load(&c, path, configs.MapLookup(map[string]string{"TOLLGATE_REDIS_ADDRS": "e:1,e:2"})); err != nil {
		t.Fatal(err)
	}
	if c.Listen != "file:1" || !reflect.DeepEqual(c.Redis.Addrs, []string{"e:1", "e:2"}) || c.Redis.Timeout != time.Second {
		t.Fatalf("got %+v", c)
	}
	if err := configs.Load(&c, filepath.Join(t.TempDir(), "missing.yaml"), configs.MapLookup(nil)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	if err := configs.Load(&c, "", configs.MapLookup(nil)); err != nil {
		t.Fatalf("no file: %v", err)
	}
}

func TestEmptyDocumentChangesNothing(t *testing.T) {
	t.Parallel()
	c := testConfig{Listen: "kept"}
	if err := configs.Decode(&c, []byte("# only a comment\n"), "c.yaml"); err != nil {
		t.Fatal(err)
	}
	if c.Listen != "kept" {
		t.Fatalf("got %+v", c)
	}
}

func TestVars(t *testing.T) {
	t.Parallel()
	c := testConfig{Listen: "127.0.0.1:1", Share: 0.25, Redis: inner{Addrs: []string{"a", "b"}, Timeout: 50 * time.Millisecond}}
	vars, err := configs.Vars(&c, map[string]string{"redis.db": "Database."})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	byName := map[string]configs.Var{}
	for _, v := range vars {
		names = append(names, v.Name)
		byName[v.Name] = v
	}
	wantNames := []string{"TOLLGATE_LISTEN", "TOLLGATE_ENABLED", "TOLLGATE_FAILURE_SHARE", "TOLLGATE_COUNT",
		"TOLLGATE_REDIS_ADDRS", "TOLLGATE_REDIS_TIMEOUT", "TOLLGATE_REDIS_DB", "TOLLGATE_TRUSTED_PROXIES"}
	if !reflect.DeepEqual(names, wantNames) {
		t.Fatalf("names %v, want %v", names, wantNames)
	}
	for name, want := range map[string]configs.Var{
		"TOLLGATE_REDIS_ADDRS":   {Name: "TOLLGATE_REDIS_ADDRS", Path: "redis.addrs", Kind: "list", Default: "a,b", Doc: "Servers."},
		"TOLLGATE_REDIS_TIMEOUT": {Name: "TOLLGATE_REDIS_TIMEOUT", Path: "redis.timeout", Kind: "duration", Default: "50ms", Doc: "Deadline."},
		"TOLLGATE_REDIS_DB":      {Name: "TOLLGATE_REDIS_DB", Path: "redis.db", Kind: "int", Default: "0", Doc: "Database."},
		"TOLLGATE_FAILURE_SHARE": {Name: "TOLLGATE_FAILURE_SHARE", Path: "failure_share", Kind: "float", Default: "0.25", Doc: "A share."},
	} {
		if got := byName[name]; got != want {
			t.Errorf("%s = %+v, want %+v", name, got, want)
		}
	}

	if _, err := configs.Vars(&c, map[string]string{"redis.gone": "stale"}); err == nil {
		t.Error("a stale docs entry was accepted")
	}
	type clash struct {
		A struct {
			B string `yaml:"b"`
		} `yaml:"a"`
		AB string `yaml:"a_b"`
	}
	if _, err := configs.Vars(clash{}, nil); err == nil || !strings.Contains(err.Error(), "TOLLGATE_A_B") {
		t.Errorf("colliding variables: %v", err)
	}
	type unsupported struct {
		M map[string]int `yaml:"m"`
	}
	if _, err := configs.Vars(unsupported{}, nil); err == nil {
		t.Error("a map field was accepted")
	}
}

func TestWriteHelp(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	err := configs.WriteHelp(&b, []configs.Var{{Name: "TOLLGATE_X", Path: "x", Kind: "string", Doc: strings.Repeat("word ", 40)}})
	if err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if !strings.Contains(out, "TOLLGATE_X  (x, string; default: none)") {
		t.Fatalf("help:\n%s", out)
	}
	for _, line := range strings.Split(out, "\n") {
		if len(line) > 80 {
			t.Errorf("line longer than 80 columns: %q", line)
		}
	}
}

func TestEnvName(t *testing.T) {
	t.Parallel()
	for path, want := range map[string]string{
		"redis.addrs":            "TOLLGATE_REDIS_ADDRS",
		"kafka.brokers":          "TOLLGATE_KAFKA_BROKERS",
		"limits.max_body_bytes":  "TOLLGATE_LIMITS_MAX_BODY_BYTES",
		"identity.key-sources":   "TOLLGATE_IDENTITY_KEY_SOURCES",
		"listen":                 "TOLLGATE_LISTEN",
		"redis.password_file":    "TOLLGATE_REDIS_PASSWORD_FILE",
		"identity.tenant_header": "TOLLGATE_IDENTITY_TENANT_HEADER",
	} {
		if got := configs.EnvName(path); got != want {
			t.Errorf("EnvName(%q) = %q, want %q", path, got, want)
		}
	}
}

func TestTargetMustBeStructPointer(t *testing.T) {
	t.Parallel()
	var c testConfig
	if err := configs.ApplyEnv(c, configs.MapLookup(nil)); err == nil {
		t.Error("ApplyEnv of a struct value succeeded")
	}
	if err := configs.Decode((*testConfig)(nil), []byte("listen: a"), "x"); err == nil {
		t.Error("Decode into a nil pointer succeeded")
	}
}

func TestLoopback(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		addr string
		want bool
	}{
		{"127.0.0.1:8080", true},
		{"127.0.0.2:0", true},
		{"[::1]:9000", true},
		{"localhost:80", true},
		{":8080", false},
		{"0.0.0.0:8080", false},
		{"10.0.0.1:8080", false},
		{"example.com:80", false},
		{"127.0.0.1", false},
	} {
		if got := configs.Loopback(tt.addr); got != tt.want {
			t.Errorf("Loopback(%q) = %v, want %v", tt.addr, got, tt.want)
		}
	}
}
