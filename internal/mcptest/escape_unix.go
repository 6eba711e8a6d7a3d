//go:build unix

package mcptest

import (
	"os/exec"
	"syscall"
)

// escape starts cmd in a session of its own, as a tool's grandchild that
// tries to leave its tree does.
func escape(cmd *exec.Cmd) { cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} }
