package agent_test

import (
	"time"

	"golang.org/x/sys/windows"
)

// cpuTime is the process's CPU time so far, user and system, and the
// system part alone.
func cpuTime() (total, system time.Duration) {
	var creation, exit, kernel, user windows.Filetime
	windows.GetProcessTimes(windows.CurrentProcess(), &creation, &exit, &kernel, &user)
	ticks := func(f windows.Filetime) int64 { return int64(f.HighDateTime)<<32 | int64(f.LowDateTime) }
	return time.Duration((ticks(kernel) + ticks(user)) * 100), time.Duration(ticks(kernel) * 100)
}
