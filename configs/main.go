package configs

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// RunFunc is a binary's body: it parses args, reads its configuration
// through lookup, runs until ctx is done (the process got SIGINT or
// SIGTERM: drain and stop) and returns the process's exit status.
type RunFunc func(ctx context.Context, args []string, lookup LookupFunc, stdout, stderr io.Writer) int

// Main is the main function of a Tollgate binary called name: it refuses
// to start (exit status 2, naming the variable on stderr) when the
// environment holds a TOLLGATE_* variable no binary or tool knows (see
// CheckEnv), and otherwise exits with run's status. run's context is done
// at the first SIGINT or SIGTERM; until run returns, further ones are
// caught too, so that a drain in progress is not cut short.
func Main(name string, run RunFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	status := mainStatus(ctx, name, os.Environ(), os.Args[1:], os.LookupEnv, os.Stdout, os.Stderr, run)
	stop()
	os.Exit(status)
}

func mainStatus(ctx context.Context, name string, environ, args []string, lookup LookupFunc, stdout, stderr io.Writer, run RunFunc) int {
	if err := CheckEnv(environ, Registry()); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 2
	}
	return run(ctx, args, lookup, stdout, stderr)
}

// ParseArgs parses a binary's command line with fs, whose output should
// be discarded: a bad flag is answered here, on stderr, in lines prefixed
// by name; cmd is how users run the binary ("bin/gateway"). --help is
// answered by help. When ok is false the caller exits with status: help's,
// or 2 for a flag fs does not know or an argument after the flags.
func ParseArgs(fs *flag.FlagSet, args []string, stderr io.Writer, name, cmd string, help func() int) (status int, ok bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return help(), false
		}
		fmt.Fprintf(stderr, "%s: %v\nRun %s --help for usage.\n", name, err, cmd)
		return 2, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected argument %q\nRun %s --help for usage.\n", name, fs.Arg(0), cmd)
		return 2, false
	}
	return 0, true
}

// WriteUsage writes a binary's --help to stdout: head (its usage line,
// what it does, its flags) and then every variable vars (its Vars) lists.
// It returns the exit status: 1 when the variables cannot be listed (the
// error goes to stderr, prefixed by name) or stdout fails.
func WriteUsage(stdout, stderr io.Writer, name, head string, vars func() ([]Var, error)) int {
	vs, err := vars()
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
	_, _ = io.WriteString(stdout, head)
	if err := WriteHelp(stdout, vs); err != nil {
		return 1
	}
	return 0
}
