// Package wait is the one way timebox's tests wait for something that
// happens on another goroutine or in another process: poll a condition
// until it holds, with a generous bound, never a blind sleep.
package wait

import (
	"testing"
	"time"
)

// Interval is how often For checks its condition.
const Interval = 5 * time.Millisecond

// For polls cond every Interval until it holds, and fails t (naming what)
// when d passes first.
func For(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not happen within %s", what, d)
		}
		time.Sleep(Interval)
	}
}

// Until polls cond every Interval until it holds, for at most d, and
// reports whether it did; for a caller that has more to do than fail when
// it did not (kill a process, show its output).
func Until(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(Interval)
	}
	return true
}
