package proctree

import (
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// dieWithParent makes the root die with this process (PR_SET_PDEATHSIG,
// SIGKILL, unless the caller set another signal): see starter for why the
// thread that forks it matters.
func dieWithParent(attr *syscall.SysProcAttr) {
	if attr.Pdeathsig == 0 {
		attr.Pdeathsig = syscall.SIGKILL
	}
}

// waitExit returns once process pid (a child) has exited, without reaping
// it: while it is an unreaped zombie its pid, which is also its process
// group's id, cannot be reused.
func waitExit(pid int) {
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err != unix.EINTR {
			return
		}
	}
}

// openPidfd opens a pidfd on pid (Linux 5.3), non-blocking so that Go's
// poller takes it.
func openPidfd(pid int) (int, error) { return unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK) }

// pidfdSignal sends sig through a pidfd.
func pidfdSignal(fd int, sig unix.Signal) error { return unix.PidfdSendSignal(fd, sig, nil, 0) }

// pidNamespace returns the inode number of this process's pid namespace:
// two processes compare pids only when it is the same.
func pidNamespace() (uint64, error) {
	var s unix.Stat_t
	if err := unix.Stat("/proc/self/ns/pid", &s); err != nil {
		return 0, err
	}
	return s.Ino, nil
}

// autoStrategy is what Auto resolves to: a cgroup of each call's own where
// cgroup v2 lets this process make them, else tracking.
func autoStrategy() Strategy {
	if cgroupUsable() == nil {
		return Cgroup
	}
	return Track
}

// usable reports whether strategy s works here.
func usable(s Strategy) error {
	switch s {
	case Cgroup:
		return cgroupUsable()
	case Track:
		return nil
	}
	return fmt.Errorf("%s is Windows' (job objects); on Linux use cgroup or track", s)
}
