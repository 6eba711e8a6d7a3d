package proctree

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// macOS has no /proc: what a scan needs comes from sysctl. A process's
// state, process group and start time from kern.proc.pid; its
// environment, as it was when it started, from kern.procargs2 (readable
// for the processes of this user, which the tools are).

// szomb is struct extern_proc's p_stat of a zombie.
const szomb = 5

// readStat reads pid's state, process group and start time (microseconds
// since the epoch on macOS).
func readStat(pid int) (procStat, error) {
	kp, err := unix.SysctlKinfoProc("kern.proc.pid", pid)
	if err != nil {
		return procStat{}, err
	}
	if int(kp.Proc.P_pid) != pid {
		return procStat{}, unix.ESRCH // the kernel answers an empty record for no such process
	}
	s := procStat{state: 'R', pgrp: int(kp.Eproc.Pgid),
		start: uint64(kp.Proc.P_starttime.Sec)*1e6 + uint64(kp.Proc.P_starttime.Usec)}
	if kp.Proc.P_stat == szomb {
		s.state = 'Z'
	}
	return s, nil
}

// pids lists the processes on the machine.
func pids() ([]int, error) {
	all, err := unix.SysctlKinfoProcSlice("kern.proc.all")
	if err != nil {
		return nil, err
	}
	out := make([]int, 0, len(all))
	for _, kp := range all {
		if kp.Proc.P_pid > 0 {
			out = append(out, int(kp.Proc.P_pid))
		}
	}
	return out, nil
}

var errBadArgs = errors.New("malformed kern.procargs2")

// procArgs returns pid's arguments and environment from kern.procargs2:
// argc (an int32), the executable's path, NUL padding, argc arguments,
// then the environment, each NUL-terminated.
func procArgs(pid int) (args []string, environ []byte, err error) {
	b, err := unix.SysctlRaw("kern.procargs2", pid)
	if err != nil {
		return nil, nil, err
	}
	if len(b) < 4 {
		return nil, nil, errBadArgs
	}
	argc := int(binary.LittleEndian.Uint32(b))
	b = b[4:]
	i := bytes.IndexByte(b, 0) // the executable's path
	if i < 0 {
		return nil, nil, errBadArgs
	}
	b = b[i:]
	for len(b) > 0 && b[0] == 0 {
		b = b[1:]
	}
	for range argc {
		i := bytes.IndexByte(b, 0)
		if i < 0 {
			return args, nil, errBadArgs
		}
		args = append(args, string(b[:i]))
		b = b[i+1:]
	}
	return args, b, nil
}

// readMarker returns the TIMEBOX_CALL value of pid's environment as it
// was when the process started. A zombie's, and one of another user's
// process, reads as none.
func readMarker(pid int, buf []byte) (string, bool, []byte) {
	_, env, err := procArgs(pid)
	if err != nil {
		return "", false, buf
	}
	v, ok := markerIn(env)
	return v, ok, buf
}

func cmdline(pid int) string {
	args, _, err := procArgs(pid)
	if err != nil {
		return "?"
	}
	s := strings.Join(args, " ")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return strings.ToValidUTF8(s, "?")
}

// bootTicks returns now in the unit of procStat.start on macOS:
// microseconds since the epoch.
func bootTicks() uint64 { return uint64(time.Now().UnixMicro()) }

// startedBefore reports whether process pid started before tick (see
// bootTicks), by a clear margin: the kernel's start time and our clock
// are not read at once. It is false when that cannot be told.
func startedBefore(pid int, tick uint64) bool {
	st, err := readStat(pid)
	return err == nil && tick > 10_000 && st.start < tick-10_000
}
