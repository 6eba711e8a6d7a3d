package sqlite

import (
	"bytes"
	"os"
	"strconv"
	"strings"
)

// machineID names the pid space this process lives in: the host, its boot
// and the pid namespace. Two owners with the same machineID can check each
// other's pids; anyone else relies on heartbeats.
func machineID() string {
	host, _ := os.Hostname()
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	ns, _ := os.Readlink("/proc/self/ns/pid")
	return host + "|" + strings.TrimSpace(string(boot)) + "|" + ns
}

// processStart returns the start time of process pid in clock ticks since
// boot, which together with the pid names one process for good (a pid is
// reused, a pid and start time are not), and whether the process is a
// zombie. It returns "" when there is no such process.
func processStart(pid int) (start string, zombie bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", false
	}
	// The command name (field 2) is in parentheses and may hold spaces and
	// parentheses itself; the fields after its last ')' are plain.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return "", false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return "", false
	}
	// f[0] is field 3 (state), so field 22 (starttime) is f[19].
	return f[19], f[0] == "Z"
}

// processAlive reports whether the process pid that started at start is
// still running; known is false where that cannot be told.
func processAlive(pid int, start string) (alive, known bool) {
	got, zombie := processStart(pid)
	if got == "" || zombie {
		return false, true
	}
	return start == "" || got == start, true
}
