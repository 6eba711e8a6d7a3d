package proctree

import (
	"fmt"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// dieWithParent does nothing on macOS, which has no PR_SET_PDEATHSIG: a
// tree whose timebox is killed with SIGKILL lives on until the next
// timebox process on the machine stops it (ReapOrphans, by the marker).
func dieWithParent(*syscall.SysProcAttr) {}

// waitExit returns once process pid (a child) has exited, without reaping
// it, by a kqueue watch for its exit.
func waitExit(pid int) {
	kq, err := unix.Kqueue()
	if err != nil {
		pollUntil(time.Time{}, func() bool { return !pidAlive(pid) })
		return
	}
	defer unix.Close(kq)
	var ev unix.Kevent_t
	unix.SetKevent(&ev, pid, unix.EVFILT_PROC, unix.EV_ADD|unix.EV_ONESHOT)
	ev.Fflags = unix.NOTE_EXIT
	out := make([]unix.Kevent_t, 1)
	for {
		n, err := unix.Kevent(kq, []unix.Kevent_t{ev}, out, nil)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			// ESRCH: it has exited already (a zombie cannot be watched).
			if err != unix.ESRCH {
				pollUntil(time.Time{}, func() bool { return !pidAlive(pid) })
			}
			return
		case n > 0:
			return
		}
	}
}

// openPidfd fails: macOS has no pidfds; handles follow pids.
func openPidfd(int) (int, error) { return -1, unix.ENOSYS }

// pidfdSignal is never called without a pidfd.
func pidfdSignal(int, unix.Signal) error { return unix.ENOSYS }

// pidNamespace returns 0: macOS has one pid space.
func pidNamespace() (uint64, error) { return 0, nil }

// autoStrategy is what Auto resolves to: macOS has no cgroups.
func autoStrategy() Strategy { return Track }

// usable reports whether strategy s works here: only Track on macOS.
func usable(s Strategy) error {
	if s == Track {
		return nil
	}
	return fmt.Errorf("%s is not available on macOS (use track)", s)
}
