//go:build linux || darwin

package proctree

import (
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestPidHandleKnowsItsProcess: a handle without a pidfd (macOS, or Linux
// without pidfds) follows its process by pid and start time, so a pid that
// now names a process started at another time is taken for gone and not
// signalled.
func TestPidHandleKnowsItsProcess(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	pid := cmd.Process.Pid

	other := pidHandle(pid)
	other.start++ // as if the pid had been reused since
	if !other.exited() {
		t.Fatal("a handle whose start time differs from the process's says it is alive")
	}
	if err := other.signal(unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if other.sent[unix.SIGTERM] || !pidAlive(pid) {
		t.Fatal("the process under a reused pid was signalled")
	}

	h := pidHandle(pid)
	if h.start == 0 || h.exited() {
		t.Fatalf("a fresh handle: start %d, exited %v", h.start, h.exited())
	}
	if err := h.signal(unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if !h.wait(time.Now().Add(10 * time.Second)) {
		t.Fatal("the process did not exit after SIGTERM through its handle")
	}
}
