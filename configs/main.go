package configs

import (
	"fmt"
	"io"
	"os"
)

// RunFunc is a binary's body: it parses args, reads its configuration
// through lookup and returns the process's exit status.
type RunFunc func(args []string, lookup LookupFunc, stdout, stderr io.Writer) int

// Main is the main function of a Tollgate binary called name: it refuses
// to start (exit status 2, naming the variable on stderr) when the
// environment holds a TOLLGATE_* variable no binary or tool knows (see
// CheckEnv), and otherwise exits with run's status.
func Main(name string, run RunFunc) {
	os.Exit(mainStatus(name, os.Environ(), os.Args[1:], os.LookupEnv, os.Stdout, os.Stderr, run))
}

func mainStatus(name string, environ, args []string, lookup LookupFunc, stdout, stderr io.Writer, run RunFunc) int {
	if err := CheckEnv(environ, Registry()); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 2
	}
	return run(args, lookup, stdout, stderr)
}
