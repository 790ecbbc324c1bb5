// Package testwait polls a condition until it holds or a deadline passes,
// the way tests wait for servers, replicas and failovers instead of sleeping
// (nats-server's checkFor).
package testwait

import (
	"testing"
	"time"
)

// First and longest pause between two calls of the condition.
const (
	minInterval = time.Millisecond
	maxInterval = 50 * time.Millisecond
)

// Eventually calls cond until it returns nil, pausing 1ms after the first
// call and doubling up to 50ms. If cond has not returned nil within timeout,
// Eventually fails the test with cond's last error and stops it
// (tb.Fatalf), so call it from the test's goroutine. It returns how long the
// condition took to hold, which tests may log as a timing.
func Eventually(tb testing.TB, timeout time.Duration, cond func() error) time.Duration {
	tb.Helper()
	start := time.Now()
	deadline := start.Add(timeout)
	interval := minInterval
	for {
		err := cond()
		if err == nil {
			return time.Since(start)
		}
		if !time.Now().Before(deadline) {
			tb.Fatalf("condition not met within %v: %v", timeout, err)
			return time.Since(start)
		}
		wait := min(interval, time.Until(deadline))
		if wait > 0 {
			<-time.After(wait)
		}
		interval = min(2*interval, maxInterval)
	}
}
