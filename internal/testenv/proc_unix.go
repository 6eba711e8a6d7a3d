//go:build !windows

package testenv

import (
	"os"
	"os/exec"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// ownGroup makes cmd lead a process group of its own.
func ownGroup(cmd *exec.Cmd) { cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} }

// signalGroup sends the process group led by pid SIGTERM, or SIGKILL when
// force is set.
func signalGroup(pid int, force bool) {
	sig := syscall.SIGTERM
	if force {
		sig = syscall.SIGKILL
	}
	syscall.Kill(-pid, sig)
}

// lockFile takes an exclusive lock on f, waiting for it, and returns the
// function that releases it.
func lockFile(f *os.File) (unlock func(), err error) {
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		return nil, err
	}
	return func() { unix.Flock(int(f.Fd()), unix.LOCK_UN) }, nil
}

// Mkfifo makes a named pipe at path, or skips t where there are none.
func Mkfifo(t testing.TB, path string) {
	t.Helper()
	if err := syscall.Mkfifo(path, 0o644); err != nil {
		t.Skip("no FIFOs here:", err)
	}
}
