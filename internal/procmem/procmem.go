// Package procmem measures the peak memory of a child process: its VmHWM,
// the high-water mark of its resident set, which the kernel keeps from the
// process's exec on. The fault suite (internal/faults) and bench/stream
// use it to measure a `timebox` process.
//
// getrusage's maxrss of a child (os.ProcessState.SysUsage) is no substitute:
// it is also taken over the part of the child's life before exec, when it
// was a copy of its parent, so a child of a large test binary reads as
// large as its parent.
package procmem

import (
	"bytes"
	"os"
	"strconv"
	"sync/atomic"
	"time"
)

// Interval is how often Watch samples.
const Interval = 10 * time.Millisecond

// Peak returns the VmHWM of a live process, in bytes, or 0 when the
// process is gone (or is a zombie, which has no memory left) or /proc
// cannot tell.
func Peak(pid int) int64 { return status(pid, "VmHWM:") }

// Resident returns the VmRSS of a live process, its resident set now, in
// bytes, or 0 as Peak does.
func Resident(pid int) int64 { return status(pid, "VmRSS:") }

// status reads a field in kB of /proc/pid/status, in bytes.
func status(pid int, field string) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for line := range bytes.Lines(b) {
		if v, ok := bytes.CutPrefix(line, []byte(field)); ok {
			kb, err := strconv.ParseInt(string(bytes.TrimSuffix(bytes.TrimSpace(v), []byte(" kB"))), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

// Watch samples a process's VmHWM every Interval until it exits, and
// returns a function that waits for the exit and returns the last sample:
// the process's peak memory, but for whatever it grew in its last
// Interval. Call the function once the process has exited (after
// exec.Cmd.Wait, or a kill): it blocks until then. A process that is
// gone already gives 0.
func Watch(pid int) (peak func() int64) {
	var last atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			v := Peak(pid)
			if v == 0 {
				return
			}
			last.Store(v)
			time.Sleep(Interval)
		}
	}()
	return func() int64 {
		<-done
		return last.Load()
	}
}
