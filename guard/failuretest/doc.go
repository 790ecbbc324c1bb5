// Package failuretest holds the guard's timing-sensitive failure suites
// (docs/operations.md): real redis-server processes killed (SIGKILL), hung
// (SIGSTOP), resumed and restarted empty under load; a Sentinel primary
// lost; one node of a 3-primary Cluster down. Each asserts generous bounds
// and logs the measured figures (lines starting "figure:") that
// docs/benchmarks.md records:
//
//	go test -race -count=1 -v -run . ./guard/failuretest | grep figure:
//
// The tests are in their own package so that `go test` runs them apart
// from the other packages' tests, and none calls t.Parallel: with several
// processes of load on a two-core machine, a parallel neighbour would make
// the latency bounds meaningless. The package has no exported API.
package failuretest
