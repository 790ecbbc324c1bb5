package httprec_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tollgate/tollgate/internal/httprec"
)

func TestRecorder(t *testing.T) {
	for _, tc := range []struct {
		name       string
		handler    http.HandlerFunc
		wantStatus int // Status as the handler left it
		wantCode   int
		wantBody   string
	}{
		{"nothing written", func(http.ResponseWriter, *http.Request) {}, 0, http.StatusOK, ""},
		{"body only", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("hi")) }, http.StatusOK, http.StatusOK, "hi"},
		{"status then body", func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusTeapot)
			_, _ = w.Write([]byte("a"))
			_, _ = w.Write([]byte("b"))
		}, http.StatusTeapot, http.StatusTeapot, "ab"},
		{"first status stays", func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusNotFound)
			w.WriteHeader(http.StatusInternalServerError)
		}, http.StatusNotFound, http.StatusNotFound, ""},
		{"body then status", func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte("x"))
			w.WriteHeader(http.StatusConflict)
		}, http.StatusOK, http.StatusOK, "x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := httptest.NewRecorder()
			out.Header().Set("X-Before", "1")
			rec := &httprec.Recorder{H: out.Header()}
			tc.handler(rec, httptest.NewRequest(http.MethodGet, "/", nil))
			if rec.Status != tc.wantStatus || rec.Code() != tc.wantCode || rec.Body.String() != tc.wantBody {
				t.Fatalf("kept %d (code %d) %q, want %d (code %d) %q", rec.Status, rec.Code(), rec.Body.String(), tc.wantStatus, tc.wantCode, tc.wantBody)
			}
			rec.Header().Set("X-Handler", "2")
			rec.Flush(out)
			if out.Code != tc.wantCode || out.Body.String() != tc.wantBody {
				t.Fatalf("flushed %d %q, want %d %q", out.Code, out.Body.String(), tc.wantCode, tc.wantBody)
			}
			if out.Header().Get("X-Before") != "1" || out.Header().Get("X-Handler") != "2" {
				t.Fatalf("flushed headers %v: want the writer's own and the handler's", out.Header())
			}
		})
	}
}
