//go:build linux || darwin

package proctree

import (
	"bytes"
	"os"
	"sync"
)

// procStat is what a scan needs from /proc/<pid>/stat.
type procStat struct {
	state byte   // R, S, D, Z, X, ...
	ppid  int    // parent (Linux only; 0 elsewhere)
	pgrp  int    // process group
	start uint64 // start time, clock ticks after boot
}

// gone reports whether the process has exited: a zombie (Z) or dead (X)
// process is waiting to be reaped and runs no more code.
func (s procStat) gone() bool { return s.state == 'Z' || s.state == 'X' || s.state == 'x' }

// markerIn returns the TIMEBOX_CALL value in a /proc/<pid>/environ image
// (NUL-separated KEY=value entries), and whether there is one.
func markerIn(environ []byte) (string, bool) {
	key := []byte(EnvMarker + "=")
	for len(environ) > 0 {
		entry := environ
		if i := bytes.IndexByte(environ, 0); i >= 0 {
			entry, environ = environ[:i], environ[i+1:]
		} else {
			environ = nil
		}
		if bytes.HasPrefix(entry, key) {
			return string(entry[len(key):]), true
		}
	}
	return "", false
}

var selfStart = sync.OnceValue(func() uint64 {
	s, err := readStat(os.Getpid())
	if err != nil {
		return 0
	}
	return s.start
})

// Running returns the live (not zombie) processes that carry this process's
// marker, in any call, finished or not. A process started by a call that
// has ended and that is still listed here has leaked; internal/proctest
// builds its check on this. It reads every /proc/<pid>/environ started
// after this process, so it is meant for tests and diagnostics, not for
// hot paths. Safe for concurrent use.
func Running() ([]Process, error) {
	all, err := pids()
	if err != nil {
		return nil, err
	}
	self, min := os.Getpid(), selfStart()
	var out []Process
	buf := make([]byte, 0, 4096)
	for _, pid := range all {
		if pid == self {
			continue
		}
		st, err := readStat(pid)
		if err != nil || st.gone() || st.start < min {
			continue
		}
		var v string
		var ok bool
		v, ok, buf = readMarker(pid, buf)
		if !ok {
			continue
		}
		if _, mine := callOf(v); !mine {
			continue
		}
		// Re-check after reading the environment: a process that exited
		// in between is not a leak.
		if !pidAlive(pid) {
			continue
		}
		out = append(out, Process{PID: pid, Marker: v, Cmdline: cmdline(pid)})
	}
	return out, nil
}
