//go:build !windows

package agent_test

import (
	"syscall"
	"time"
)

// cpuTime is the process's CPU time so far, user and system, and the
// system part alone.
func cpuTime() (total, system time.Duration) {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), time.Duration(ru.Stime.Nano())
}
