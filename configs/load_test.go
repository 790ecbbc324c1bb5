package configs_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/configs"
)

// checkedConfig is a binary's configuration in small: a default, a host
// default and a rule.
type checkedConfig struct {
	Listen string `yaml:"listen" doc:"Where to listen."`
	ID     string `yaml:"checked_id" doc:"This host's name. Empty: the hostname."`
}

func (c *checkedConfig) SetDefaults() {
	configs.Default(&c.Listen, "127.0.0.1:1")
	configs.Default(&c.ID, "host-1234")
}

func (c *checkedConfig) Validate() error {
	if !strings.HasPrefix(c.Listen, "127.") {
		return errors.New("listen: not loopback")
	}
	return nil
}

func TestLoadChecked(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(file, []byte("listen: 127.0.0.2:2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		path    string
		env     map[string]string
		want    string // Listen
		wantErr string
	}{
		{"defaults", "", nil, "127.0.0.1:1", ""},
		{"file", file, nil, "127.0.0.2:2", ""},
		{"environment over file", file, map[string]string{"TOLLGATE_LISTEN": "127.0.0.3:3"}, "127.0.0.3:3", ""},
		{"validated", "", map[string]string{"TOLLGATE_LISTEN": "10.0.0.1:1"}, "10.0.0.1:1", "not loopback"},
		{"missing file", filepath.Join(dir, "none.yaml"), nil, "", "none.yaml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := configs.LoadChecked[checkedConfig](tc.path, configs.MapLookup(tc.env))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("LoadChecked = %v, want an error with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || c.Listen != tc.want || c.ID != "host-1234" {
				t.Fatalf("LoadChecked = %+v, %v; want listen %s and the defaults", c, err, tc.want)
			}
		})
	}
}

func TestDefaultVars(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		host   func(*checkedConfig)
		wantID string
	}{
		{"defaults", nil, "host-1234"},
		{"host-specific cleared", func(c *checkedConfig) { c.ID = "" }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vars, err := configs.DefaultVars(tc.host)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, v := range vars {
				got[v.Name] = v.Default
			}
			if got["TOLLGATE_LISTEN"] != "127.0.0.1:1" || got["TOLLGATE_CHECKED_ID"] != tc.wantID {
				t.Errorf("defaults %v, want listen 127.0.0.1:1 and id %q", got, tc.wantID)
			}
		})
	}
}
