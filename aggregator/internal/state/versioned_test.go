package state

import (
	"errors"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/aggregator/internal/abuse"
	"github.com/tollgate/tollgate/aggregator/internal/windows"
)

// TestUnknownValueVersionIsCorrupt: a row or penalty value whose version
// byte is missing or not this build's is refused as corrupt, naming the
// kind of value; the build's own encoding decodes.
func TestUnknownValueVersionIsCorrupt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		decode func([]byte) error
		good   []byte
	}{
		{"row", func(b []byte) error { _, err := DecodeRowValue(b); return err }, RowValue(windows.Row{KeyPrefix: "sk_…", Allowed: 3, Rejected: 1, Cost: 4})},
		{"penalty", func(b []byte) error { _, err := DecodePenaltyValue(b); return err }, PenaltyValue(abuse.State{Tenant: "acme", KeyPrefix: "sk_…"})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, b := range [][]byte{nil, {99, 0}} {
				err := tc.decode(b)
				if !errors.Is(err, errCorrupt) || !strings.Contains(err.Error(), tc.name+" version") {
					t.Errorf("decode %v: %v, want corrupt %s version", b, err, tc.name)
				}
			}
			if err := tc.decode(tc.good); err != nil {
				t.Errorf("own encoding: %v", err)
			}
		})
	}
}
