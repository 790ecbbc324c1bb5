package testwait_test

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testwait"
)

func TestEventuallyReturnsOnceConditionHolds(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	took := testwait.Eventually(t, 5*time.Second, func() error {
		if calls.Add(1) < 4 {
			return errors.New("not yet")
		}
		return nil
	})
	if got := calls.Load(); got != 4 {
		t.Fatalf("condition called %d times, want 4", got)
	}
	if took > time.Second {
		t.Fatalf("took %v for 3 retries", took)
	}
}

// recorder is a testing.TB that records Fatalf instead of stopping.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) { r.failed = fmt.Sprintf(format, args...) }

func TestEventuallyFailsWithLastErrorAtDeadline(t *testing.T) {
	t.Parallel()
	rec := &recorder{TB: t}
	start := time.Now()
	n := 0
	testwait.Eventually(rec, 30*time.Millisecond, func() error {
		n++
		return fmt.Errorf("attempt %d", n)
	})
	if elapsed := time.Since(start); elapsed < 30*time.Millisecond || elapsed > 2*time.Second {
		t.Fatalf("gave up after %v, want about 30ms", elapsed)
	}
	if want := fmt.Sprintf("attempt %d", n); !strings.Contains(rec.failed, want) {
		t.Fatalf("failure %q does not name the last error %q", rec.failed, want)
	}
}
