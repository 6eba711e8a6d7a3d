//go:build windows

package exectool

import (
	"fmt"
	"syscall"
)

// forceStop names the stop nothing can catch, for messages.
const forceStop = "the termination of its job object"

// signalName is never called on Windows, where no process is killed by a
// signal; a crash is an exit code (exitNote).
func signalName(s syscall.Signal) string { return fmt.Sprintf("signal %d", int(s)) }

// exitNote names the exit codes Windows gives a process that crashed or
// was interrupted, which are NTSTATUS values rather than a program's own
// code; "" for any other.
func exitNote(code int) string {
	switch uint32(code) {
	case 0xC0000005:
		return "crashed (access violation, 0xC0000005)"
	case 0xC00000FD:
		return "crashed (stack overflow, 0xC00000FD)"
	case 0xC0000409:
		return "crashed (stack buffer overrun or fail-fast, 0xC0000409)"
	case 0xC0000374:
		return "crashed (heap corruption, 0xC0000374)"
	case 0xC000013A:
		return "interrupted by Ctrl+C or Ctrl+Break (0xC000013A)"
	}
	return ""
}
