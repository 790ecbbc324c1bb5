package gateway_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/gateway"
	"github.com/tollgate/tollgate/guard/keyid"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// specVars are the variables users and operators rely on: a contract.
var specVars = []string{
	"TOLLGATE_LISTEN", "TOLLGATE_UPSTREAM", "TOLLGATE_API_LISTEN", "TOLLGATE_API_TOKEN",
	"TOLLGATE_METRICS_LISTEN", "TOLLGATE_GRPC_LISTEN", "TOLLGATE_RULES_FILE", "TOLLGATE_KEY_SECRET",
	"TOLLGATE_REDIS_MODE", "TOLLGATE_REDIS_ADDRS", "TOLLGATE_REDIS_MASTER_NAME",
	"TOLLGATE_REDIS_USERNAME", "TOLLGATE_REDIS_PASSWORD", "TOLLGATE_REDIS_PASSWORD_FILE",
	"TOLLGATE_REDIS_TLS", "TOLLGATE_REDIS_TLS_CA_FILE", "TOLLGATE_REDIS_DB", "TOLLGATE_REDIS_KEY_PREFIX",
	"TOLLGATE_REDIS_POOL_SIZE", "TOLLGATE_REDIS_TIMEOUT", "TOLLGATE_KAFKA_BROKERS", "TOLLGATE_NATS_URL",
	"TOLLGATE_GATEWAY_ID",
}

func TestVarsCoverSpecAndAreDocumented(t *testing.T) {
	t.Parallel()
	vars, err := gateway.Vars()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]configs.Var{}
	for _, v := range vars {
		byName[v.Name] = v
		if len(v.Doc) < 10 {
			t.Errorf("%s has no documentation", v.Name)
		}
	}
	for _, name := range specVars {
		if _, ok := byName[name]; !ok {
			t.Errorf("contract variable %s is missing", name)
		}
	}
	for name, def := range map[string]string{
		"TOLLGATE_LISTEN": "127.0.0.1:8080", "TOLLGATE_API_LISTEN": "127.0.0.1:8082",
		"TOLLGATE_METRICS_LISTEN": "127.0.0.1:9091", "TOLLGATE_GRPC_LISTEN": "127.0.0.1:8089",
		"TOLLGATE_RULES_FILE": "configs/rules.yaml", "TOLLGATE_REDIS_MODE": "standalone",
		"TOLLGATE_REDIS_ADDRS": "127.0.0.1:6379", "TOLLGATE_REDIS_MASTER_NAME": "mymaster",
		"TOLLGATE_REDIS_TLS": "false", "TOLLGATE_REDIS_DB": "0", "TOLLGATE_REDIS_KEY_PREFIX": "tg",
		"TOLLGATE_REDIS_TIMEOUT": "50ms", "TOLLGATE_KAFKA_BROKERS": "", "TOLLGATE_NATS_URL": "",
		"TOLLGATE_UPSTREAM": "", "TOLLGATE_MAX_COST": "1000", "TOLLGATE_MAX_BATCH": "100",
		"TOLLGATE_FAILURE_SHARE": "0.25", "TOLLGATE_MAX_RULES_PER_REQUEST": "32", "TOLLGATE_GRPC_TLS_CERT_FILE": "", "TOLLGATE_IDENTITY_KEY_SOURCES": "header:X-API-Key,bearer",
		"TOLLGATE_LIMITS_MAX_BODY_BYTES": "65536", "TOLLGATE_SHUTDOWN_TIMEOUT": "10s",
	} {
		if got := byName[name].Default; got != def {
			t.Errorf("%s default %q, want %q", name, got, def)
		}
	}
}

// TestExampleConfigIsTheDefaults: configs/gateway.yaml decodes strictly
// and states exactly the defaults.
func TestExampleConfigIsTheDefaults(t *testing.T) {
	t.Parallel()
	var fromFile gateway.Config
	if err := configs.Decode(&fromFile, configs.GatewayYAML(), "gateway.yaml"); err != nil {
		t.Fatal(err)
	}
	fromFile.KeySecret = "x"
	fromFile.GatewayID = "id"
	fromFile.SetDefaults()
	want := gateway.Config{KeySecret: "x", GatewayID: "id"}
	want.SetDefaults()
	// `[]` in YAML is an empty list, the zero value a nil one.
	for _, p := range []*[]string{&fromFile.Kafka.Brokers, &fromFile.Identity.TrustedProxies} {
		if len(*p) == 0 {
			*p = nil
		}
	}
	if !reflect.DeepEqual(fromFile, want) {
		t.Fatalf("configs/gateway.yaml is not the defaults:\n file     %+v\n defaults %+v", fromFile, want)
	}
	// Every field is spelled out in the example (none left to defaults).
	vars, err := gateway.Vars()
	if err != nil {
		t.Fatal(err)
	}
	text := string(configs.GatewayYAML())
	for _, v := range vars {
		leaf := v.Path[strings.LastIndexByte(v.Path, '.')+1:]
		if !strings.Contains(text, "\n"+strings.Repeat(" ", 2*strings.Count(v.Path, "."))+leaf+":") {
			t.Errorf("configs/gateway.yaml does not mention %s", v.Path)
		}
	}
}

func TestLoadConfigFromEnvironment(t *testing.T) {
	t.Parallel()
	lookup := func(k string) (string, bool) {
		v, ok := map[string]string{
			"TOLLGATE_REDIS_ADDRS":                "10.0.0.1:26379,10.0.0.2:26379",
			"TOLLGATE_REDIS_MODE":                 "sentinel",
			"TOLLGATE_REDIS_TIMEOUT":              "80ms",
			"TOLLGATE_RULES_FILE":                 "/etc/tollgate/rules.yaml",
			"TOLLGATE_KEY_SECRET":                 "0123456789abcdef0123",
			"TOLLGATE_UPSTREAM":                   "http://127.0.0.1:9000",
			"TOLLGATE_IDENTITY_TRUSTED_PROXIES":   "10.0.0.0/8, 192.0.2.1",
			"TOLLGATE_KAFKA_BROKERS":              "k1:9092,k2:9092",
			"TOLLGATE_LIMITS_READ_HEADER_TIMEOUT": "2s",
		}[k]
		return v, ok
	}
	c, err := gateway.LoadConfig("", lookup)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c.Redis.Addrs, []string{"10.0.0.1:26379", "10.0.0.2:26379"}) || c.Redis.Mode != "sentinel" ||
		c.Redis.Timeout != 80*time.Millisecond || c.Redis.MasterName != "mymaster" || c.RulesFile != "/etc/tollgate/rules.yaml" ||
		c.Upstream != "http://127.0.0.1:9000" || len(c.Identity.TrustedProxies) != 2 || len(c.Kafka.Brokers) != 2 ||
		c.Limits.ReadHeaderTimeout != 2*time.Second || c.APIListen != "127.0.0.1:8082" {
		t.Fatalf("config %+v", c)
	}

	// The file first, the environment over it.
	path := filepath.Join(t.TempDir(), "gw.yaml")
	if err := os.WriteFile(path, []byte("upstream: http://file:1\nmax_batch: 7\nredis:\n  addrs: [file:6379]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err = gateway.LoadConfig(path, lookup)
	if err != nil {
		t.Fatal(err)
	}
	if c.Upstream != "http://127.0.0.1:9000" || c.MaxBatch != 7 || c.Redis.Addrs[0] != "10.0.0.1:26379" {
		t.Fatalf("file then env: %+v", c)
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	t.Parallel()
	c := gateway.Config{
		Upstream:           "ftp://x",
		APIListen:          "nonsense",
		FailureShare:       2,
		MaxCost:            -1,
		MaxRulesPerRequest: -1,
		Region:             "EU_West",
		Identity: gateway.IdentityConfig{
			KeySources:     []string{"header:X-API-Key", "cookie:sid"},
			TrustedProxies: []string{"10.0.0.0/33"},
			TenantHeader:   "Bad Header",
		},
		Limits: gateway.LimitsConfig{ReadTimeout: -time.Second},
		Log:    configs.Log{Level: "loud"},
	}
	c.SetDefaults()
	err := c.Validate()
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{
		"key_secret (TOLLGATE_KEY_SECRET): required",
		"upstream (TOLLGATE_UPSTREAM)", "api_listen (TOLLGATE_API_LISTEN)",
		"failure_share", "max_cost", "max_rules_per_request (TOLLGATE_MAX_RULES_PER_REQUEST)", "identity.key_sources (TOLLGATE_IDENTITY_KEY_SOURCES): item 2",
		"identity.trusted_proxies", "identity.tenant_header", "limits.read_timeout", "log.level",
		`region (TOLLGATE_REGION): invalid region name "EU_West"`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	c = gateway.Config{KeySecret: "short"}
	c.SetDefaults()
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "key_secret (TOLLGATE_KEY_SECRET): too short: at least 16 bytes") {
		t.Errorf("short secret: %v", err)
	}
	// The gateway's minimum is the library's: a secret the gateway
	// accepts, guard.New accepts.
	c = gateway.Config{KeySecret: strings.Repeat("s", keyid.MinSecretLen)}
	c.SetDefaults()
	if err := c.Validate(); err != nil {
		t.Errorf("secret of keyid.MinSecretLen bytes: %v", err)
	}
	c = gateway.Config{KeySecret: testSecret, GRPCListen: gateway.Off, APIListen: gateway.Off, MetricsListen: gateway.Off}
	c.SetDefaults()
	if err := c.Validate(); err != nil {
		t.Errorf("listeners off: %v", err)
	}
}

// TestDocsListEveryVariable: docs/gateway.md's configuration table names
// every variable.
func TestDocsListEveryVariable(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/gateway.md")
	if err != nil {
		t.Fatal(err)
	}
	vars, err := gateway.Vars()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vars {
		if !strings.Contains(string(doc), "| `"+v.Name+"` | `"+v.Path+"` |") {
			t.Errorf("docs/gateway.md has no table row for %s (%s)", v.Name, v.Path)
		}
	}
}

// TestMaxCostWithinTheEventBound: a max_cost above what a decision event
// may carry is refused rather than clamped in every event.
func TestMaxCostWithinTheEventBound(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cost int64
		bad  bool
	}{{1, false}, {tollgatev1.MaxCost, false}, {tollgatev1.MaxCost + 1, true}} {
		c := gateway.Config{MaxCost: tc.cost}
		c.SetDefaults()
		err := c.Validate()
		if got := err != nil && strings.Contains(err.Error(), "max_cost"); got != tc.bad {
			t.Errorf("max_cost %d: %v", tc.cost, err)
		}
	}
}

// TestGatewayIDInFleetMode: in fleet mode gateway_id names a NATS KV key
// (the gateway's presence entry), so what a KV key cannot hold is refused
// there and only there.
func TestGatewayIDInFleetMode(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		id   string
		nats string
		bad  bool
	}{
		{"gw-eu-1", "nats://127.0.0.1:4222", false},
		{"gw 1", "", false},
		{"gw 1", "nats://127.0.0.1:4222", true},
		{"gw:1", "nats://127.0.0.1:4222", true},
		{".gw", "nats://127.0.0.1:4222", true},
	} {
		c := gateway.Config{KeySecret: testSecret, GatewayID: tc.id}
		c.NATS.URL = tc.nats
		c.SetDefaults()
		err := c.Validate()
		if got := err != nil && strings.Contains(err.Error(), "gateway_id"); got != tc.bad {
			t.Errorf("gateway_id %q, nats %q: %v", tc.id, tc.nats, err)
		}
	}
}
