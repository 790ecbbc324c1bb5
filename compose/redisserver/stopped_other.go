//go:build !linux

package redisserver

// waitStopped returns at once: only Linux lets us observe the stopped state.
func waitStopped(int, <-chan struct{}) {}
