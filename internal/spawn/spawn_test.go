package spawn_test

import (
	"errors"
	"os/exec"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/spawn"
)

func TestStart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr bool
	}{
		{"exits 0", []string{"true"}, false},
		{"exits 1", []string{"false"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			bin, err := exec.LookPath(tc.args[0])
			if err != nil {
				t.Fatal(err)
			}
			p, err := spawn.Start(exec.Command(bin, tc.args[1:]...))
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-p.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("not done 10s after the child exited")
			}
			var ee *exec.ExitError
			if !p.Exited() || (p.Err() != nil) != tc.wantErr || (tc.wantErr && !errors.As(p.Err(), &ee)) {
				t.Errorf("Exited %v, Err %v; want exited, an exit error: %v", p.Exited(), p.Err(), tc.wantErr)
			}
		})
	}
	if _, err := spawn.Start(exec.Command("/nonexistent/binary")); err == nil {
		t.Error("Start of a missing binary succeeded")
	}
}
