//go:build !windows

package exectool

import (
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// forceStop names the stop nothing can catch, for messages.
const forceStop = "SIGKILL (uninterruptible sleep)"

// signalName returns "SIGSEGV" for SIGSEGV, and the number for a signal
// without a name.
func signalName(s syscall.Signal) string {
	if name := unix.SignalName(s); name != "" {
		return name
	}
	return fmt.Sprintf("signal %d", int(s))
}

// exitNote says nothing of an exit code on Unix: a crash is a signal.
func exitNote(int) string { return "" }
