package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// TestHelpJoinsAsTheREADME checks that --help's example of joining the
// local stack is the README's, line for line: the two drifted apart once
// (other ports, no TOLLGATE_AGGREGATOR_ID).
func TestHelpJoinsAsTheREADME(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	// The README's block that starts the second aggregator.
	var block []string
	for _, b := range strings.Split(string(src), "```sh\n")[1:] {
		body, _, _ := strings.Cut(b, "```")
		if strings.Contains(body, "bin/aggregator\n") && strings.Contains(body, "stack.env") {
			block = strings.Split(strings.TrimSpace(body), "\n")
			break
		}
	}
	if block == nil {
		t.Fatal("README.md has no ```sh block joining a second bin/aggregator to the local stack")
	}
	var out, errOut bytes.Buffer
	if code := run(t.Context(), []string{"--help"}, func(string) (string, bool) { return "", false }, &out, &errOut); code != 0 {
		t.Fatalf("--help: exit %d: %s", code, errOut.String())
	}
	var want strings.Builder
	for _, line := range block {
		want.WriteString("  " + line + "\n")
	}
	if !strings.Contains(out.String(), want.String()) {
		t.Errorf("--help's join example differs from the README's; want, indented by two spaces:\n%s\nin:\n%s", want.String(), out.String())
	}
}
