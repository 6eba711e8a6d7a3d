//go:build faults && linux

package faults

import (
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/timebox-run/timebox/internal/testenv"
)

// peekTerminal is a tool that tries to open the terminal timebox runs on:
// with it, a tool can type into the shell that started timebox (TIOCSTI),
// answer timebox's approval prompt, or take the terminal's foreground so
// that timebox stops on SIGTTIN.
const peekTerminal = `#!/usr/bin/env bash
cat >/dev/null
if { exec 3<>/dev/tty; } 2>/dev/null; then echo "opened $$" >> "$PIDFILE"; else echo "refused $$" >> "$PIDFILE"; fi
echo "ready $$" >> "$PIDFILE"
`

// toolOnTerminal: `timebox run` on a terminal (its controlling one, as
// from a shell) runs a tool that tries to open that terminal; the tool,
// in a session of its own, cannot.
func toolOnTerminal(t *testing.T) {
	_, tty := testenv.PTY(t)
	sc := begin(t, "a tool reaching for timebox's terminal", "timebox run --json, on a terminal")
	a := newAgent(t, scriptAgent("", "", "{name: peek, description: Peeks., exec: [./peek.sh], timeout: 10s}"),
		[]string{callTools("peek"), `{"text": "done"}`}, map[string]string{"peek.sh": peekTerminal})
	p := startTimeboxWith(t, a.dir, []string{"PIDFILE=" + a.pidfile}, nil, func(c *exec.Cmd) {
		c.Stdin = tty
		c.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	}, "run", "-f", a.file, "--db", a.db, "--json", "go")
	if code := p.wait(60 * time.Second); code != 0 {
		t.Fatalf("exit %d\n%s", code, p.stderr.String())
	}
	pids := a.pids()
	if len(pids["ready"]) == 0 {
		t.Fatalf("the tool did not run: %v\n%s", pids, p.stderr.String())
	}
	sc.count("tools that opened timebox's terminal", len(pids["opened"]), 0)
	sc.nothingLeft(p.pid())
}
