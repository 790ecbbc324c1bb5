package rules

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestInvalidGolden loads every file under testdata/invalid. Each starts
// with comment lines naming the expected problem:
//
//	# want: <substring of the error>
//	# rule: <ValidationError.Rule>    (omitted: "")
//	# field: <ValidationError.Field>  (omitted: "")
//
// and must be refused with exactly one *ValidationError carrying them.
func TestInvalidGolden(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob(filepath.Join("testdata", "invalid", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 50 {
		t.Fatalf("found only %d golden files", len(files))
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".yaml"), func(t *testing.T) {
			t.Parallel()
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			want := goldenHeader(t, data)
			if want["want"] == "" {
				t.Fatalf("%s does not start with a # want: line", file)
			}
			rs, err := Load(data)
			if err == nil {
				t.Fatalf("Load accepted the ruleset (%d rules)", len(rs.Rules()))
			}
			if !strings.Contains(err.Error(), want["want"]) {
				t.Errorf("error %q does not contain %q", err, want["want"])
			}
			if !strings.HasPrefix(err.Error(), "rules: ") {
				t.Errorf("error %q lacks the rules: prefix", err)
			}
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("errors.As found no *ValidationError in %v", err)
			}
			if all := validationErrors(err); len(all) != 1 {
				t.Errorf("got %d problems, want 1: %v", len(all), err)
			}
			if ve.Rule != want["rule"] || ve.Field != want["field"] {
				t.Errorf("got Rule %q Field %q, want Rule %q Field %q", ve.Rule, ve.Field, want["rule"], want["field"])
			}
			if want["want"] != "empty document" && ve.Line == 0 {
				t.Errorf("no line number in %v", ve)
			}
		})
	}
}

// goldenHeader reads the leading "# key: value" comment lines.
func goldenHeader(t *testing.T, data []byte) map[string]string {
	t.Helper()
	h := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "# ")
		if !ok {
			break
		}
		k, v, ok := strings.Cut(line, ": ")
		if !ok {
			break
		}
		h[k] = v
	}
	return h
}

// validationErrors flattens an errors.Join tree into its *ValidationErrors.
func validationErrors(err error) []*ValidationError {
	var out []*ValidationError
	var walk func(error)
	walk = func(e error) {
		if ve, ok := e.(*ValidationError); ok {
			out = append(out, ve)
			return
		}
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
		}
	}
	walk(err)
	return out
}
