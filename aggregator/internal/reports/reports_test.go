package reports

import (
	"encoding/csv"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/aggregator/internal/state"
	"github.com/tollgate/tollgate/aggregator/internal/windows"
)

func TestCSVCell(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"", ""},
		{"/v1/users/42", "/v1/users/42"},
		{"sk_prod_ab…", "sk_prod_ab…"},
		{"=HYPERLINK(\"http://evil\",\"x\")", `"'=HYPERLINK(""http://evil"",""x"")"`},
		{"+1+cmd|' /C calc'!A0", `"'+1+cmd|' /C calc'!A0"`},
		{"-2+3", `"'-2+3"`},
		{"@SUM(A1)", `"'@SUM(A1)"`},
		{"\t=1", "\"'\t=1\""},
		{"\r=1", "\"'\r=1\""},
		{"-AbCdEfGhIjKlMnOpQrStUv", `"'-AbCdEfGhIjKlMnOpQrStUv"`}, // a key_id may start with '-'
		{"a,b", `"a,b"`},
		{`say "hi"`, `"say ""hi"""`},
		{"line\nbreak", "\"line\nbreak\""},
		{" padded", `" padded"`},
		{"x=1", "x=1"}, // only the first character makes a formula
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			if got := csvCell(tt.in); got != tt.want {
				t.Errorf("csvCell(%q) = %s, want %s", tt.in, got, tt.want)
			}
		})
	}
}

// TestCSVReportNeutralisesFormulas: a usage report's CSV, served from a
// real state store, shows hostile key prefixes and endpoints as text: a
// CSV reader gets each cell back with one leading quote and nothing else
// changed, and no cell a spreadsheet would evaluate remains.
func TestCSVReportNeutralisesFormulas(t *testing.T) {
	t.Parallel()
	db, err := state.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	hostile := []struct{ prefix, endpoint string }{
		{"=HYPERLINK(\"http://x\")…", "/v1/a"},
		{"+cmd…", "-1+1"},
		{"@SUM(1)…", "\t=1"},
		{"sk_fine…", "=2*3"},
	}
	var recs []state.Record
	for i, h := range hostile {
		k := windows.RowKey{Partition: 0, Tenant: "acme", KeyID: "kid" + string(rune('a'+i)), Endpoint: h.endpoint,
			Gran: windows.Minute, Start: 60}
		recs = append(recs, state.Record{Partition: 0, Offset: int64(i), Key: state.RowKey(k),
			Value: state.RowValue(windows.Row{KeyPrefix: h.prefix, Allowed: 1, Cost: 1})})
	}
	if err := db.Materialize(recs); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	Register(mux, Config{DB: db, Now: func() time.Time { return time.Unix(600, 0) }})
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/usage/tenants/acme?granularity=minute&format=csv&from=1970-01-01T00:00:00Z", nil))
	if rec.Code != 200 || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/csv") {
		t.Fatalf("%d %s: %s", rec.Code, rec.Header().Get("Content-Type"), rec.Body)
	}
	lines, err := csv.NewReader(strings.NewReader(rec.Body.String())).ReadAll()
	if err != nil {
		t.Fatalf("not CSV: %v\n%s", err, rec.Body)
	}
	if len(lines) != 1+len(hostile) || strings.Join(lines[0], ",") != strings.Join(csvHeader, ",") {
		t.Fatalf("lines %q", lines)
	}
	got := map[string]bool{}
	for _, l := range lines[1:] {
		for _, cell := range l {
			if cell != "" && strings.ContainsRune("=+-@\t\r", rune(cell[0])) {
				t.Errorf("cell %q would be evaluated by a spreadsheet", cell)
			}
			got[cell] = true
		}
	}
	for _, h := range hostile {
		for _, v := range []string{h.prefix, h.endpoint} {
			want := v
			if strings.ContainsRune("=+-@\t\r", rune(v[0])) {
				want = "'" + v
			}
			if !got[want] {
				t.Errorf("no cell %q in %q", want, lines)
			}
		}
	}
}
