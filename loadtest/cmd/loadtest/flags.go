package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

// setUsage sends fs's errors and -h to stderr, -h as usage followed by
// the flags. (Commands create their flag sets with flag.NewFlagSet and a
// literal name: the documentation test reads their flags from there.)
func setUsage(fs *flag.FlagSet, usage string, stderr io.Writer) {
	fs.SetOutput(stderr)
	fs.Usage = func() {
		_, _ = io.WriteString(stderr, usage)
		fs.PrintDefaults()
	}
}

// parseFlags parses args with fs. When ok is false the command exits with
// code: exitOK after -h, exitUsage after a bad flag (fs has said why) or
// an argument after the flags.
func parseFlags(fs *flag.FlagSet, args []string, stderr io.Writer) (code int, ok bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK, false
		}
		return exitUsage, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected arguments %q\n", fs.Name(), fs.Args())
		return exitUsage, false
	}
	return 0, true
}

// usageError says err, then where the flags are explained (fs's -h), and
// returns exitUsage: the end of a command whose flags parsed but do not
// make a valid run.
func usageError(fs *flag.FlagSet, err error, stderr io.Writer) int {
	fmt.Fprintf(stderr, "%v\n\nRun %s -h for the flags.\n", err, fs.Name())
	return exitUsage
}

// createReport creates the report's file before the run, so that a bad
// path costs no run; nil when file is "". When ok is false the command
// exits with code (the error is on stderr, prefixed by name).
func createReport(name, file string, stderr io.Writer) (f *os.File, code int, ok bool) {
	if file == "" {
		return nil, 0, true
	}
	f, err := os.Create(file)
	if err != nil {
		return nil, failed(stderr, name+": report", err), false
	}
	return f, 0, true
}

// failed says err on stderr after prefix (the command's name, and what
// failed where the error does not say it) and returns exitFailed.
func failed(stderr io.Writer, prefix string, err error) int {
	fmt.Fprintf(stderr, "%s: %v\n", prefix, err)
	return exitFailed
}
