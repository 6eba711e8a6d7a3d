//go:build unix

package runas

import (
	"os/exec"
	"syscall"
)

// Apply makes cmd start as id: its credentials (uid, gid, supplementary
// groups) and its login variables. cmd.Env must be set.
func (id *Identity) Apply(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Credential = &syscall.Credential{Uid: id.UID, Gid: id.GID, Groups: id.Groups}
	cmd.Env = id.Environ(cmd.Env)
	return nil
}
