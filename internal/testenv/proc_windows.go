//go:build windows

package testenv

import (
	"os"
	"os/exec"
	"syscall"
	"testing"

	"golang.org/x/sys/windows"
)

// ownGroup makes cmd lead a process group of its own.
func ownGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{CreationFlags: windows.CREATE_NEW_PROCESS_GROUP}
}

// signalGroup stops process pid: a break to its group, or termination when
// force is set (Windows has no group kill outside a job object).
func signalGroup(pid int, force bool) {
	if !force && windows.GenerateConsoleCtrlEvent(windows.CTRL_BREAK_EVENT, uint32(pid)) == nil {
		return
	}
	if p, err := os.FindProcess(pid); err == nil {
		p.Kill()
	}
}

// lockFile takes an exclusive lock on f, waiting for it, and returns the
// function that releases it.
func lockFile(f *os.File) (unlock func(), err error) {
	h := windows.Handle(f.Fd())
	var ol windows.Overlapped
	if err := windows.LockFileEx(h, windows.LOCKFILE_EXCLUSIVE_LOCK, 0, 1, 0, &ol); err != nil {
		return nil, err
	}
	return func() { windows.UnlockFileEx(h, 0, 1, 0, &ol) }, nil
}

// Mkfifo skips t: Windows has no named pipes in the file system.
func Mkfifo(t testing.TB, path string) {
	t.Helper()
	t.Skip("no FIFOs on Windows")
}
