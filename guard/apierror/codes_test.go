package apierror

import (
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"testing"

	"github.com/tollgate/tollgate/internal/testnet"
)

// declaredCodes returns the string constants codes.go declares, name →
// value, read from its source: the table must hold every one.
func declaredCodes(t *testing.T) map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "codes.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	testnet.ConstValues(f, func(name string, value ast.Expr) {
		if lit, ok := value.(*ast.BasicLit); ok && lit.Kind == token.STRING {
			v, err := strconv.Unquote(lit.Value)
			if err != nil {
				t.Fatal(err)
			}
			out[name] = v
		}
	})
	return out
}

var codeShape = regexp.MustCompile(`^[A-Z][A-Z0-9]*(_[A-Z0-9]+)*$`)

// TestTable: every declared code is in the table and every row's code is
// declared; codes are UPPER_SNAKE and distinct; each row is an error
// status with its text, once; rows are grouped by surface.
func TestTable(t *testing.T) {
	t.Parallel()
	declared := declaredCodes(t)
	if len(declared) < 30 {
		t.Fatalf("read only %d codes from codes.go", len(declared))
	}
	values := map[string]string{}
	for name, v := range declared {
		if !codeShape.MatchString(v) {
			t.Errorf("%s = %q: a code is UPPER_SNAKE", name, v)
		}
		if other, ok := values[v]; ok {
			t.Errorf("%s and %s are both %q", name, other, v)
		}
		values[v] = name
		if !Known(v) {
			t.Errorf("%s (%q) has no row in the table", name, v)
		}
	}
	type key struct {
		s      Surface
		status int
		code   string
	}
	seen := map[key]bool{}
	var surfaces []Surface
	for i, r := range Rows() {
		if _, ok := values[r.Code]; !ok {
			t.Errorf("row %d: %q is not a declared code", i, r.Code)
		}
		if r.Status < 400 || r.Status > 599 || http.StatusText(r.Status) == "" {
			t.Errorf("row %d (%s): status %d is not an HTTP error status", i, r.Code, r.Status)
		}
		if r.When == "" {
			t.Errorf("row %d (%s): no text", i, r.Code)
		}
		k := key{r.Surface, r.Status, r.Code}
		if seen[k] {
			t.Errorf("row %d: %d %s twice on surface %d", i, r.Status, r.Code, r.Surface)
		}
		seen[k] = true
		if len(surfaces) == 0 || surfaces[len(surfaces)-1] != r.Surface {
			surfaces = append(surfaces, r.Surface)
		}
	}
	if !slices.Equal(surfaces, Surfaces()) {
		t.Errorf("rows come by surface %v, want grouped as %v", surfaces, Surfaces())
	}
}

func TestStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		code   string
		status int
		fixed  bool
	}{
		{RateLimitExceeded, 429, true},
		{InvalidKey, 400, true}, // on two surfaces, one status
		{NotFound, 404, true},
		{UpstreamUnavailable, 502, true},
		{NATSUnavailable, 0, false}, // 502 or 503
		{RulesCorrupt, 0, false},    // 409 or 412
		{"NO_SUCH_CODE", 0, false},
		{"", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.code, func(t *testing.T) {
			t.Parallel()
			if status, fixed := Status(tt.code); status != tt.status || fixed != tt.fixed {
				t.Errorf("Status(%q) = %d, %v; want %d, %v", tt.code, status, fixed, tt.status, tt.fixed)
			}
			if got, want := Known(tt.code), tt.code != "NO_SUCH_CODE" && tt.code != ""; got != want {
				t.Errorf("Known(%q) = %v", tt.code, got)
			}
		})
	}
	if !Answers(412, RulesCorrupt) || !Answers(409, RulesCorrupt) || Answers(404, RulesCorrupt) || Answers(429, "NO_SUCH_CODE") {
		t.Error("Answers disagrees with the table")
	}
}

// TestRowsIsACopy: a caller cannot change the vocabulary.
func TestRowsIsACopy(t *testing.T) {
	t.Parallel()
	r := Rows()
	r[0].Code = "CHANGED"
	if Rows()[0].Code == "CHANGED" {
		t.Error("Rows returned the table itself")
	}
}

func TestSurfaceString(t *testing.T) {
	t.Parallel()
	var names []string
	for _, s := range Surfaces() {
		names = append(names, s.String())
	}
	if want := []string{"decisions", "gateway", "aggregator"}; !slices.Equal(names, want) {
		t.Errorf("names %v, want %v", names, want)
	}
	if got := Surface(9).String(); got != "surface(9)" {
		t.Errorf("Surface(9) = %q", got)
	}
}
