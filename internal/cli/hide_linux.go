package cli

import "golang.org/x/sys/unix"

// HideProcess makes this process unreadable to the other processes of its
// user (PR_SET_DUMPABLE 0): /proc/PID/environ and mem become root's, and
// ptrace needs CAP_SYS_PTRACE. A tool runs as timebox's user unless its
// entry says user:, and timebox withholds its secrets from a tool's
// environment; without this, the tool could read them all from
// /proc/$PPID/environ. The tools themselves are not affected: exec makes
// a process dumpable again. It also means timebox leaves no core dump,
// which would hold the same secrets. main calls it; the library does not.
func HideProcess() error { return unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0) }
