package adminapi

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/guard/apierror"
	"github.com/tollgate/tollgate/internal/fleetkv"
)

// TestRetryWrite: a write without If-Match retries a lost race up to
// writeAttempts in all, a conditional one answers it at once; an attempt
// that answered itself is not answered again; any other failure is the
// store's.
func TestRetryWrite(t *testing.T) {
	t.Parallel()
	conflict := fmt.Errorf("put: %w", fleetkv.ErrConflict)
	tests := []struct {
		name       string
		retry      bool
		results    []error // what each attempt returns; the last repeats
		wantOK     bool
		wantCalls  int
		wantStatus int
		wantCode   string
	}{
		{"first try", true, []error{nil}, true, 1, 0, ""},
		{"won on the last attempt", true, []error{conflict, conflict, conflict, conflict, nil}, true, writeAttempts, 0, ""},
		{"kept losing", true, []error{conflict}, false, writeAttempts, http.StatusConflict, apierror.Conflict},
		{"conditional: lost at once", false, []error{conflict, nil}, false, 1, http.StatusConflict, apierror.Conflict},
		{"answered by the attempt", true, []error{errAnswered}, false, 1, http.StatusTeapot, ""},
		{"store failed", true, []error{errors.New("nats: timeout")}, false, 1, http.StatusBadGateway, apierror.NATSUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			w := httptest.NewRecorder()
			calls := 0
			ok := retryWrite(w, lostRace{retry: tt.retry, status: http.StatusConflict, code: apierror.Conflict, msg: "lost"}, func() error {
				err := tt.results[min(calls, len(tt.results)-1)]
				calls++
				if errors.Is(err, errAnswered) {
					w.WriteHeader(http.StatusTeapot)
				}
				return err
			})
			if ok != tt.wantOK || calls != tt.wantCalls {
				t.Fatalf("retryWrite = %v after %d attempts, want %v after %d", ok, calls, tt.wantOK, tt.wantCalls)
			}
			if tt.wantOK {
				if w.Body.Len() != 0 {
					t.Fatalf("answered %d %s on success", w.Code, w.Body)
				}
				return
			}
			if w.Code != tt.wantStatus || !strings.Contains(w.Body.String(), tt.wantCode) {
				t.Fatalf("answer %d %s, want %d %s", w.Code, w.Body, tt.wantStatus, tt.wantCode)
			}
		})
	}
}
