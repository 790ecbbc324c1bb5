// Package memtest holds what the memory tests of the in-memory tables
// share: the heap a table holds once built, and the allocations a piece of
// work makes. The measures read the
// process's heap, so the tests that call them do not run in parallel.
package memtest

import "runtime"

// Retained returns the bytes of heap that build leaves allocated: the heap
// in use after a collection that follows build, less the heap in use after
// one that precedes it. What build returns is held alive until the second
// reading, so it is counted.
func Retained(build func() any) int64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	held := build()
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(held)
	return int64(after.HeapAlloc) - int64(before.HeapAlloc)
}

// Mallocs returns how many heap allocations the process made while f ran.
func Mallocs(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.Mallocs - before.Mallocs
}
