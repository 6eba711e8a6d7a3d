//go:build faults && linux

package faults

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/mcptest"
)

// mcpIgnoredCancel: an MCP entry's stdio server that goes on with a call
// after its timeout's cancellation (internal/mcptest's stubborn tool, with
// a child in a session of its own), under mcp.on_ignored_cancel: restart,
// through `timebox run`. The call ends timed_out kill_grace after its
// deadline with server_restarted in its record; the server's whole tree
// is gone; the model's next call is answered by a fresh server; nothing is
// left and nothing lost.
func mcpIgnoredCancel(t *testing.T) {
	const grace = 500 * time.Millisecond
	sc := begin(t, "MCP server ignoring a cancel, on_ignored_cancel: restart", "timebox run --json")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	a := newAgent(t, scriptAgent(fmt.Sprintf("kill_grace: %s", grace), "",
		fmt.Sprintf("{name: slow, mcp: {command: [%q], on_ignored_cancel: restart}, timeout: 1s}", exe)),
		[]string{callTools("slow__stubborn"), callTools("slow__echo"), `{"text": "done"}`}, nil)
	env := []string{mcptest.EnvServe + "=1", mcptest.EnvPids + "=" + a.pidfile}
	p := startTimebox(t, a.dir, env, nil, "run", "-f", a.file, "--db", a.db, "--json", "go")
	if code := p.wait(60 * time.Second); code != 0 {
		t.Fatalf("exit %d\n%s", code, p.stderr.String())
	}
	b, _ := os.ReadFile(a.pidfile)
	pids := map[string][]int{}
	for i, f := range strings.Fields(string(b)) {
		pid, _ := strconv.Atoi(f)
		role := []string{"server", "child"}[i%2]
		pids[role] = append(pids[role], pid)
	}
	if len(pids["server"]) != 1 || len(pids["child"]) != 1 {
		t.Fatalf("the stubborn call wrote pids %v, want its server's and its child's", pids)
	}
	seen := p.log.snapshot()
	var stubborn, echo *event.ToolFinished
	for _, r := range toolRecords(seen) {
		switch r.Tool {
		case "slow__stubborn":
			stubborn = r
		case "slow__echo":
			echo = r
		}
	}
	if stubborn == nil || echo == nil {
		t.Fatalf("tool_finished of both calls wanted\n%s", p.stderr.String())
	}
	sc.is("outcome", string(stubborn.Outcome), string(event.OutcomeTimedOut))
	sc.is("record says server_restarted", fmt.Sprint(stubborn.ServerRestarted), "true")
	past := time.Duration(stubborn.DurationMS-stubborn.TimeoutMS) * time.Millisecond
	sc.within("from the deadline to the server's tree gone (kill_grace "+grace.String()+")", past, grace+time.Second)
	fresh := echo.Outcome == event.OutcomeOK && strings.TrimSpace(toolOutput(echo.Result)) != strconv.Itoa(pids["server"][0])
	sc.truth("the next call answered by a fresh server", "yes", fmt.Sprintf("%v (%s, pid %s; old %d)", fresh, echo.Outcome,
		strings.TrimSpace(toolOutput(echo.Result)), pids["server"][0]), fresh)
	sc.allDead(pids)
	sc.nothingLeft(p.pid())
	st, evs := stored(t, a.db, "")
	sc.records(seen, st, evs)
}

// mcpBusyServer: an MCP entry's stdio server whose tool blocks its
// reading for 27 s (as a tool that blocks a server's event loop does: its
// pings go unanswered), reporting progress every second, under the tool's
// own `timeout: 2m`, through `timebox run`. The call is answered: a
// server busy with a call within its budget is not taken for hung (it
// was, at the second unanswered ping, 25 s in).
func mcpBusyServer(t *testing.T) {
	sc := begin(t, "MCP server busy 27s without answering pings, timeout: 2m", "timebox run --json")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	a := newAgent(t, scriptAgent("", "", fmt.Sprintf("{name: srv, mcp: {command: [%q]}, timeout: 2m}", exe)),
		[]string{callTools("srv__busy"), `{"text": "done"}`}, nil)
	p := startTimebox(t, a.dir, []string{mcptest.EnvServe + "=1"}, nil, "run", "-f", a.file, "--db", a.db, "--json", "go")
	if code := p.wait(90 * time.Second); code != 0 {
		t.Fatalf("exit %d\n%s", code, p.stderr.String())
	}
	seen := p.log.snapshot()
	rec := p.theCall(t)
	sc.is("outcome", string(rec.Outcome), string(event.OutcomeOK))
	sc.truth("answered", "done, after its 27 s", fmt.Sprintf("%q after %s", toolOutput(rec.Result), ms(time.Duration(rec.DurationMS)*time.Millisecond)),
		toolOutput(rec.Result) == "done" && rec.DurationMS >= 27000)
	sc.atMost("progress reports short of 27", 27-rec.ProgressCount, 2)
	sc.nothingLeft(p.pid())
	st, evs := stored(t, a.db, "")
	sc.records(seen, st, evs)
}
