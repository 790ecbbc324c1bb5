package tollgatev1_test

import (
	"testing"

	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// TestLadderRung pins the ladder's meaning: what the aggregator writes for
// each level and what gateways obey.
func TestLadderRung(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		level int
		want  tollgatev1.Rung
	}{
		{-1, tollgatev1.Rung{Level: 0, Action: "none"}},
		{0, tollgatev1.Rung{Level: 0, Action: "none"}},
		{1, tollgatev1.Rung{Level: 1, Action: "reduced_limit", Override: true}},
		{2, tollgatev1.Rung{Level: 2, Action: "cooldown", List: tollgatev1.ActionPenalty}},
		{3, tollgatev1.Rung{Level: 3, Action: "blocklist", List: tollgatev1.ActionBlock, Close: true}},
		{4, tollgatev1.Rung{Level: 3, Action: "blocklist", List: tollgatev1.ActionBlock, Close: true}},
	} {
		if got := tollgatev1.LadderRung(tc.level); got != tc.want {
			t.Errorf("LadderRung(%d) = %+v, want %+v", tc.level, got, tc.want)
		}
	}
}
