//go:build !unix

package mcptest

import "os/exec"

// escape leaves cmd as it is: no sessions here (the Job Object holds the
// tree whatever the process does).
func escape(*exec.Cmd) {}
