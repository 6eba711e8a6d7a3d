//go:build !unix

package runas

import (
	"errors"
	"os/exec"
)

// Apply fails: running a tool as another user needs a Unix.
func (id *Identity) Apply(cmd *exec.Cmd) error {
	return errors.New("tools[].user: running a tool as another user is supported on Linux and macOS only")
}
