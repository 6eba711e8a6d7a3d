package proctree

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

var errBadStat = errors.New("malformed /proc stat")

// readFile reads a small /proc file into buf (growing it) with raw system
// calls: an os.File would cost a poller registration per file, and a scan
// reads one or two files per process on the machine.
func readFile(path string, buf []byte) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return buf[:0], err
	}
	defer unix.Close(fd)
	return preadAll(fd, buf)
}

// preadAll reads a whole file from offset 0 into buf[:0], growing it as
// needed. A kernfs or procfs file is generated afresh by a read at offset
// 0, so a kept descriptor reads the file as it is now.
func preadAll(fd int, buf []byte) ([]byte, error) {
	buf = buf[:0]
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := unix.Pread(fd, buf[len(buf):cap(buf)], int64(len(buf)))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return buf, err
		}
		if n == 0 {
			return buf, nil
		}
		buf = buf[:len(buf)+n]
	}
}

var statBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// readStat reads /proc/<pid>/stat.
func readStat(pid int) (procStat, error) {
	bp := statBufs.Get().(*[]byte)
	defer statBufs.Put(bp)
	b, err := readFile("/proc/"+strconv.Itoa(pid)+"/stat", *bp)
	*bp = b
	if err != nil {
		return procStat{}, err
	}
	return parseStat(b)
}

// parseStat parses the fields after the command name, which is in
// parentheses and may itself contain spaces and parentheses.
func parseStat(b []byte) (procStat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return procStat{}, errBadStat
	}
	// Fields from 3 on (man proc_pid_stat): 3 state, 4 ppid, 5 pgrp, ...
	// 22 starttime.
	f := bytes.Fields(b[i+2:])
	if len(f) < 20 {
		return procStat{}, errBadStat
	}
	var s procStat
	s.state = f[0][0]
	ppid, err := strconv.Atoi(string(f[1]))
	if err != nil {
		return procStat{}, errBadStat
	}
	s.ppid = ppid
	pgrp, err := strconv.Atoi(string(f[2]))
	if err != nil {
		return procStat{}, errBadStat
	}
	s.pgrp = pgrp
	start, err := strconv.ParseUint(string(f[19]), 10, 64)
	if err != nil {
		return procStat{}, errBadStat
	}
	s.start = start
	return s, nil
}

// readMarker returns the TIMEBOX_CALL value of pid's environment as it was
// when the process started, read from /proc/<pid>/environ. A zombie's, and
// one of another user's process, reads as none.
func readMarker(pid int, buf []byte) (string, bool, []byte) {
	b, err := readFile("/proc/"+strconv.Itoa(pid)+"/environ", buf)
	if err != nil {
		return "", false, b
	}
	v, ok := markerIn(b)
	return v, ok, b
}

// pids lists the processes (thread-group leaders) in /proc.
func pids() ([]int, error) {
	d, err := os.Open("/proc")
	if err != nil {
		return nil, err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	out := make([]int, 0, len(names))
	for _, n := range names {
		if n == "" || n[0] < '0' || n[0] > '9' {
			continue
		}
		if pid, err := strconv.Atoi(n); err == nil {
			out = append(out, pid)
		}
	}
	return out, nil
}

func cmdline(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return "?"
	}
	s := strings.TrimRight(strings.ReplaceAll(string(b), "\x00", " "), " ")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return strings.ToValidUTF8(s, "?")
}

// userHZ is the unit of the start times in /proc/<pid>/stat: clock ticks,
// which the kernel reports at USER_HZ, 100 a second, on every architecture
// Linux runs Go on.
const userHZ = 100

// bootTicks returns the time since boot (CLOCK_BOOTTIME, the clock of
// /proc/<pid>/stat's start times) in clock ticks, rounded down.
func bootTicks() uint64 {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts) != nil {
		return 0
	}
	return uint64(ts.Nano()) / (1e9 / userHZ)
}

// startedBefore reports whether process pid started in a clock tick
// before tick: certainly before that tick began. It is false when that
// cannot be told (0 ticks, no such process).
func startedBefore(pid int, tick uint64) bool {
	st, err := readStat(pid)
	return err == nil && tick > 0 && st.start < tick
}
