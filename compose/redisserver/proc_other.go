//go:build !unix

package redisserver

import "os"

// unsupportedSignal stands for SIGSTOP and SIGCONT where they do not exist;
// os.Process.Signal refuses it, so Pause and Resume return an error.
type unsupportedSignal string

func (s unsupportedSignal) Signal()        {}
func (s unsupportedSignal) String() string { return string(s) }

var (
	sigStop os.Signal = unsupportedSignal("SIGSTOP")
	sigCont os.Signal = unsupportedSignal("SIGCONT")
	sigTerm os.Signal = os.Kill
)
