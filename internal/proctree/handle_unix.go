//go:build linux || darwin

package proctree

import (
	"errors"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// handle is one process of a tree, held by a pidfd where the kernel has
// them (Linux 5.3). A pidfd names one process for good: a signal sent
// through it cannot reach another process that was given the same pid, and
// it becomes readable when the process exits, which Go's poller turns into
// a wait that costs no thread and no polling. Without pidfds a handle falls
// back to the pid, checked by polling.
//
// A handle is used by one goroutine at a time.
type handle struct {
	pid int
	f   *os.File // the pidfd; nil when pidfds are unavailable
	rc  syscall.RawConn
	// start is the process's start time when there is no pidfd (see
	// procStat), read when the handle was made: a process found later
	// under the same pid with another start time is not this one.
	start uint64
	done  bool // the process has exited (it may be a zombie)
	sent  map[unix.Signal]bool
}

// openHandle opens a handle on pid. It returns an error wrapping ESRCH when
// no such process exists.
func openHandle(pid int) (*handle, error) {
	fd, err := openPidfd(pid)
	switch {
	case err == nil:
		return newHandle(pid, fd), nil
	case errors.Is(err, unix.ESRCH):
		return nil, err
	default:
		// ENOSYS (kernel before 5.3) or a seccomp filter: fall back to the
		// pid. The window in which it could be reused is the time between
		// reading it and signalling it, and the callers re-check what they
		// read.
		if unix.Kill(pid, 0) == unix.ESRCH {
			return nil, unix.ESRCH
		}
		return pidHandle(pid), nil
	}
}

// newHandle returns the handle of pid for a pidfd opened with
// PIDFD_NONBLOCK (so that Go's poller takes it), or -1 for none.
func newHandle(pid, fd int) *handle {
	if fd < 0 {
		return pidHandle(pid)
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return pidHandle(pid)
	}
	return &handle{pid: pid, f: f, rc: rc}
}

// pidHandle returns a handle that follows pid by its number and start
// time (macOS, or Linux without pidfds).
func pidHandle(pid int) *handle {
	h := &handle{pid: pid}
	if st, err := readStat(pid); err == nil {
		h.start = st.start
	}
	return h
}

// exited reports whether the process has exited. A zombie has, and so has
// a pid-followed process whose pid now names one that started at another
// time.
func (h *handle) exited() bool {
	if h.done {
		return true
	}
	if h.f == nil {
		st, err := readStat(h.pid)
		h.done = err != nil || st.gone() || (h.start != 0 && st.start != h.start)
		return h.done
	}
	var ready bool
	if err := h.rc.Control(func(fd uintptr) { ready = pidfdReady(fd) }); err != nil {
		ready = true // closed: nothing left to wait for
	}
	h.done = ready
	return ready
}

// pidfdReady reports whether a pidfd is readable, which it is once its
// process has exited.
func pidfdReady(fd uintptr) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 0)
		if err == unix.EINTR {
			continue
		}
		return err != nil || n > 0
	}
}

// wait waits until the process has exited or the deadline passes (a zero
// deadline never passes), and reports whether it exited.
func (h *handle) wait(deadline time.Time) bool {
	if h.exited() {
		return true
	}
	if h.f != nil {
		if err := h.f.SetReadDeadline(deadline); err == nil {
			err = h.rc.Read(func(fd uintptr) bool { return pidfdReady(fd) })
			if err == nil {
				h.done = true
				return true
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return false
			}
		}
		// Not pollable after all: poll by hand below.
	}
	return pollUntil(deadline, h.exited)
}

// signal sends sig to the process, once per signal per handle: a process
// that traps SIGTERM should run its handler once. It returns nil when the
// process has already exited.
func (h *handle) signal(sig unix.Signal) error {
	if h.sent[sig] || h.exited() {
		return nil
	}
	if h.sent == nil {
		h.sent = make(map[unix.Signal]bool, 2)
	}
	h.sent[sig] = true
	var err error
	if h.f == nil {
		// exited, just above, re-read the start time: the window in which
		// the pid could be reused is from that read to this kill.
		err = unix.Kill(h.pid, sig)
	} else if cerr := h.rc.Control(func(fd uintptr) { err = pidfdSignal(int(fd), sig) }); cerr != nil {
		return nil
	}
	if err == unix.ESRCH {
		return nil
	}
	return err
}

func (h *handle) close() {
	if h.f != nil {
		h.f.Close()
	}
}

// pidAlive reports whether pid names a process that has not exited: one
// that exists and is not a zombie.
func pidAlive(pid int) bool {
	if unix.Kill(pid, 0) == unix.ESRCH {
		return false
	}
	st, err := readStat(pid)
	return err == nil && !st.gone()
}
