package aggregator

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// TestLiftRefusesWhatTheOwnerWouldRefuse: a lift command with a value the
// partition's owner would refuse (beyond its bound, or not UTF-8) is not
// sent, and the operator is told; TestPenaltyLift sends one end to end.
func TestLiftRefusesWhatTheOwnerWouldRefuse(t *testing.T) {
	t.Parallel()
	long := func(bound int) string { return strings.Repeat("x", bound+1) }
	// Each case: key id, actor, reason, and what the error says.
	for name, tc := range map[string][4]string{
		"a reason beyond its bound":  {"kid", "alice", long(tollgatev1.MaxCommandReasonLen), "command_reason beyond its bound"},
		"a key id beyond its bound":  {long(tollgatev1.MaxNameLen), "alice", "", "key_id beyond its bound"},
		"an actor that is not UTF-8": {"kid", "al\xffce", "", "not UTF-8"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			// No client: a refused command never reaches Kafka.
			err := commander{}.Lift(context.Background(), 0, tc[0], "acme", tc[1], tc[2], time.Now())
			if err == nil || !strings.Contains(err.Error(), tc[3]) {
				t.Fatalf("Lift: %v, want an error saying %q", err, tc[3])
			}
		})
	}
}
