//go:build faults && linux

package faults

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/procmem"
	"github.com/timebox-run/timebox/internal/proctest"
	"github.com/timebox-run/timebox/internal/proctree"
	"github.com/timebox-run/timebox/internal/syncbuf"
	"github.com/timebox-run/timebox/internal/testenv"
)

// hangTool is a tool whose root starts a child in its process group, which
// starts a setsid grandchild; it writes their pids to $PIDFILE, says it
// started, and hangs for 5 minutes: what a turn is in the middle of when
// its client goes, a signal comes or timebox is killed.
const hangTool = `#!/usr/bin/env bash
cat >/dev/null
( setsid sleep 300 & echo "grandchild $!" >> "$PIDFILE"; exec sleep 300 ) &
echo "child $!" >> "$PIDFILE"
echo "root $$" >> "$PIDFILE"
echo '::progress:: started' >&2
exec sleep 300
`

// hangAgent is an agent whose model calls the hang tool (timeout 10m),
// then answers.
func hangAgent(t *testing.T) agentDir {
	t.Helper()
	return newAgent(t, scriptAgent("", "", "{name: hang, description: Hangs., exec: [./hang.sh], timeout: 10m}"),
		[]string{callTools("hang"), `{"text": "never"}`}, map[string]string{"hang.sh": hangTool})
}

// silentHangAgent is hangAgent with a tool that says nothing once it runs.
func silentHangAgent(t *testing.T) agentDir {
	t.Helper()
	return newAgent(t, scriptAgent("", "", "{name: hang, description: Hangs., exec: [./hang.sh], timeout: 10m}"),
		[]string{callTools("hang"), `{"text": "never"}`}, map[string]string{"hang.sh": strings.Replace(hangTool, "echo '::progress:: started' >&2\n", "", 1)})
}

// waitTool waits until the hang tool's three processes run.
func waitTool(t *testing.T, a agentDir, p *proc) map[string][]int {
	t.Helper()
	return a.waitPIDs(t, 3, p)
}

// clientGone: an SSE client that follows a turn through `timebox
// serve` and goes away mid-tool cancels it (client_gone) within a second
// (spec §12): its tools are stopped, and its records kept — a client that
// comes back replays the whole turn from the store.
func clientGone(t *testing.T) {
	sc := begin(t, "client gone: the SSE client disconnects mid-tool", "timebox serve, an SSE client")
	a := hangAgent(t)
	recv := testenv.NewOTLP(t)
	srv, url := startServe(t, a, append([]string{"PIDFILE=" + a.pidfile}, traced(recv)...))
	f := postTurn(t, url, `{"input": "go"}`)
	pids := waitTool(t, a, srv)
	left := time.Now()
	f.leave()
	var rec *event.Turn
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		r, err := turnRecord(url, f.turnID)
		if err == nil && r.Status != budget.StatusRunning {
			rec = r
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the turn is still running 30s after its client left (%v)\n%s", err, srv.stderr.String())
		}
	}
	sc.is("stop reason", string(rec.StopReason), string(budget.ClientGone))
	sc.within("turn ended after the client left", rec.EndedAt.Sub(left), time.Second)
	sc.allDead(pids)
	back := replayTurn(t, url, f.turnID)
	if _, ok := back.log.waitFor(event.TypeTurnFinished, 10*time.Second); !ok {
		t.Error("a client coming back did not get turn_finished")
	}
	back.leave()
	srv.cmd.Process.Signal(syscall.SIGTERM)
	if code := srv.wait(30 * time.Second); code != 0 {
		t.Errorf("serve exited %d after SIGTERM\n%s", code, srv.stderr.String())
	}
	sc.nothingLeft(srv.pid())
	st, evs := stored(t, a.db, f.turnID)
	sc.records(back.log.snapshot(), st, evs)
	sc.traceWhole(recv, "", f.turnID)
}

// sigtermServe: SIGTERM to `timebox serve` mid-tool, with
// --shutdown-grace 1s: the turn is given the grace, then cancelled
// (shutdown), its tools stopped; its SSE client gets turn_finished before
// the stream ends, and serve exits with every record stored.
func sigtermServe(t *testing.T) {
	sc := begin(t, "SIGTERM mid-turn", "timebox serve --shutdown-grace 1s, an SSE client")
	a := hangAgent(t)
	const grace = time.Second
	recv := testenv.NewOTLP(t)
	srv, url := startServe(t, a, append([]string{"PIDFILE=" + a.pidfile}, traced(recv)...), "--shutdown-grace", grace.String())
	f := postTurn(t, url, `{"input": "go"}`)
	pids := waitTool(t, a, srv)
	sent := time.Now()
	srv.cmd.Process.Signal(syscall.SIGTERM)
	fin, ok := f.log.waitFor(event.TypeTurnFinished, 30*time.Second)
	if !ok {
		t.Errorf("the SSE stream ended without turn_finished")
	} else {
		sc.is("stop reason", string(fin.Data.(*event.TurnFinished).StopReason), string(budget.Shutdown))
		sc.within("turn_finished reached the client after SIGTERM (grace 1s)", time.Since(sent), grace+2*time.Second)
	}
	code := srv.wait(30 * time.Second)
	sc.count("exit code", code, 0)
	sc.within("serve exited after SIGTERM", srv.took-sent.Sub(srv.start), grace+3*time.Second)
	sc.allDead(pids)
	sc.nothingLeft(srv.pid())
	st, evs := stored(t, a.db, f.turnID)
	sc.records(f.log.snapshot(), st, evs)
	sc.traceWhole(recv, "", f.turnID)
}

// sigtermRun: SIGTERM to `timebox run` mid-tool cancels the turn at
// once (status cancelled, the signal named), its tools stopped within the
// cancellation grace; run exits 130 with the turn stored.
func sigtermRun(t *testing.T) {
	sc := begin(t, "SIGTERM mid-turn", "timebox run --json")
	a := hangAgent(t)
	// Traced, as a traced program's tool: the turn's span is the child
	// of its TRACEPARENT.
	recv := testenv.NewOTLP(t)
	const caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	env := append([]string{"PIDFILE=" + a.pidfile, "TRACEPARENT=" + caller}, traced(recv)...)
	p := startTimebox(t, a.dir, env, nil, "run", "-f", a.file, "--db", a.db, "--json", "go")
	pids := waitTool(t, a, p)
	sent := time.Now()
	p.cmd.Process.Signal(syscall.SIGTERM)
	code := p.wait(30 * time.Second)
	sc.count("exit code", code, 130)
	sc.within("run exited after SIGTERM", p.took-sent.Sub(p.start), 2*time.Second)
	seen := p.log.snapshot()
	if fin := finished(seen); fin != nil {
		sc.truth("stop reason", "cancelled, by SIGTERM", string(fin.StopReason),
			fin.StopReason == budget.Cancelled && strings.Contains(fin.Message, "SIGTERM"))
	}
	sc.allDead(pids)
	sc.nothingLeft(p.pid())
	st, evs := stored(t, a.db, "")
	sc.records(seen, st, evs)
	sc.traceWhole(recv, caller, st.TurnID)
}

// kill9ThenRestart: `kill -9` of timebox mid-tool, then a restart on
// the same store, for serve under both process-tree strategies and for
// run. The tool's root dies with timebox (parent-death signal); the rest
// (its child and setsid grandchild) is stopped by the restart, and no
// process of the tool is alive 5s after it; the turn is stored as
// interrupted, the call that was running with its record.
func kill9ThenRestart(t *testing.T) {
	type mode struct {
		name     string
		serve    bool
		strategy proctree.Strategy
	}
	for _, m := range []mode{{"serve", true, proctree.Cgroup}, {"serve", true, proctree.Track}, {"run", false, proctree.Auto}} {
		name := "timebox " + m.name
		if m.strategy != proctree.Auto {
			name += " (" + string(m.strategy) + ")"
		}
		t.Run(name, func(t *testing.T) {
			if _, err := proctree.Resolve(m.strategy); err != nil {
				t.Skip(err)
			}
			sc := begin(t, "kill -9 mid-tool, then a restart", name)
			a := hangAgent(t)
			// Traced: the turn's span dies with the process, and the
			// restart makes it again (docs/decisions/turn-span-of-a-lost-turn.md).
			recv := testenv.NewOTLP(t)
			env := append([]string{"PIDFILE=" + a.pidfile}, traced(recv)...)
			if m.strategy != proctree.Auto {
				env = append(env, proctree.EnvStrategy+"="+string(m.strategy))
			}
			var first *proc
			var seen func() []event.Event
			if m.serve {
				var url string
				first, url = startServe(t, a, env)
				f := postTurn(t, url, `{"input": "go"}`)
				seen = f.log.snapshot
			} else {
				first = startTimebox(t, a.dir, env, nil, "run", "-f", a.file, "--db", a.db, "--json", "go")
				seen = first.log.snapshot
			}
			pids := waitTool(t, a, first)
			waitSpans(t, recv, "chat ", 1) // the model call's span names the turn's, which dies
			first.cmd.Process.Kill()       // SIGKILL: timebox can clean up nothing
			<-first.done
			rootGone := waitGone(pids["root"], 5*time.Second)
			sc.truth("the tool's root after kill -9", "dies with timebox", fmt.Sprintf("gone in %s", ms(rootGone)), rootGone < 5*time.Second)
			// What the dead process left, as the leak check sees it before
			// the restart (other timebox processes on the machine may have
			// reaped it already).
			before := len(proctest.Leaks(0))
			t.Logf("left by the dead timebox before the restart: %d processes", before)

			restarted := time.Now()
			var second *proc
			if m.serve {
				second, _ = startServe(t, a, env)
			} else {
				quick := newAgent(t, scriptAgent("", "", "{name: none, description: Nothing., exec: [true]}"), []string{`{"text": "hello"}`}, nil)
				second = startTimebox(t, quick.dir, env, nil, "run", "-f", quick.file, "--db", a.db, "--json", "hi")
			}
			var rest []int
			for _, role := range []string{"child", "grandchild"} {
				rest = append(rest, pids[role]...)
			}
			waitGone(rest, 5*time.Second-time.Since(restarted))
			after := time.Since(restarted)
			sc.addKind(kindTime, "the tool's child and setsid grandchild gone after the restart", "≤ 5000 ms", ms(after), after < 5*time.Second)
			sc.allDead(pids)
			if m.serve {
				second.cmd.Process.Signal(syscall.SIGTERM)
			}
			if code := second.wait(30 * time.Second); code != 0 {
				t.Errorf("the restarted timebox exited %d\n%s", code, second.stderr.String())
			}
			if before > 0 {
				// Unless another timebox process on the machine reaped
				// them first.
				said := reapedRE.FindString(second.stderr.String())
				t.Logf("the restart said: %s", firstLine(second.stderr.String()))
				sc.truth("the restart said", "stopped N tool processes", said,
					strings.Contains(second.stderr.String(), "tool processes left running by timebox (pid "+strconv.Itoa(first.pid())+")"))
			}
			sc.nothingLeft(first.pid(), second.pid())
			rec, evs := stored(t, a.db, turnOf(t, seen()))
			sc.is("stored turn", string(rec.Status), string(budget.StatusInterrupted))
			lost := 0
			calls := map[string]event.ToolCall{}
			for _, c := range rec.ToolCalls {
				calls[c.CallID] = c
			}
			for _, e := range seen() {
				if s, ok := e.Data.(*event.ToolStarted); ok {
					if c, ok := calls[s.CallID]; !ok || c.Outcome != event.OutcomeInterrupted {
						lost++
						t.Logf("call %s: stored %+v", s.CallID, c)
					}
				}
			}
			if finished(evs) == nil {
				lost++
				t.Log("the stored events have no turn_finished")
			}
			sc.addKind(kindLost, "records lost", "= 0", fmt.Sprint(lost), lost == 0) // every call that started is stored, interrupted
			span := lostTurnSpan(recv, turnOf(t, seen()), seen())
			sc.truth("the turn's span after the restart", "made once, with the ids turn_started named", span, span == "made once, with the ids turn_started named")
			sc.traceWhole(recv, "", turnOf(t, seen()))
			sc.callSpans(recv, seen()) // the running call's, which the restart made
		})
	}
}

// lostTurnSpan says whether the receiver got the invoke_agent span of the
// turn id once, with the ids its turn_started (in events) named.
func lostTurnSpan(recv *testenv.OTLP, id string, events []event.Event) string {
	var tp string
	for _, e := range events {
		if d, ok := e.Data.(*event.TurnStarted); ok {
			tp = d.Traceparent
		}
	}
	if tp == "" {
		return "turn_started named no traceparent"
	}
	var found []string
	for _, sp := range recv.Spans() {
		if strings.HasPrefix(sp.GetName(), "invoke_agent ") && testenv.SpanAttrs(sp)["timebox.turn.id"].GetStringValue() == id {
			found = append(found, fmt.Sprintf("00-%x-%x-01", sp.GetTraceId(), sp.GetSpanId()))
		}
	}
	switch {
	case len(found) == 0:
		return "not made"
	case len(found) > 1:
		return fmt.Sprintf("made %d times", len(found))
	case found[0] != tp:
		return fmt.Sprintf("made as %s, turn_started named %s", found[0], tp)
	}
	return "made once, with the ids turn_started named"
}

// reapedRE finds what a start of timebox says it reaped.
var reapedRE = regexp.MustCompile(`stopped \d+ tool process(es)?`)

// turnOf returns the turn id of the events.
func turnOf(t *testing.T, events []event.Event) string {
	t.Helper()
	for _, e := range events {
		if e.TurnID != "" {
			return e.TurnID
		}
	}
	t.Fatal("no event names its turn")
	return ""
}

// waitGone polls until none of pids is alive, for at most d, and returns
// how long it took (d or more when some are still alive).
// treeOf returns every pid of a tool's tree (waitTool's roles): a tool
// stopped by SIGTERM may be gone before its setsid grandchild, which the
// kill grace's SIGKILL ends later, so a stop is over when all are gone.
func treeOf(pids map[string][]int) []int {
	var all []int
	for _, ps := range pids {
		all = append(all, ps...)
	}
	return all
}

func waitGone(pids []int, d time.Duration) time.Duration {
	start := time.Now()
	for {
		living := false
		for _, pid := range pids {
			living = living || alive(pid)
		}
		if !living {
			return time.Since(start)
		}
		if time.Since(start) > d {
			return time.Since(start)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// readerGoesAway: `timebox run … | head -1` and `timebox run --json …
// | grep -m1 tool_started`: the reader of timebox's standard output goes
// away mid-turn. The turn is cancelled as client_gone — timebox is not
// killed by SIGPIPE, which would leave its tools running — its tools are
// stopped and the turn is stored. timebox learns that its reader left
// when its next write fails (head leaves after the first line, before the
// tool starts; grep right after tool_started, and the tool's first
// progress report is the write that fails) or, with a tool that says
// nothing more, from the pipe itself, well before the still_working
// notice (timeouts.progress_notice, 2s here) would have been written.
func readerGoesAway(t *testing.T) {
	cases := []struct {
		name, reader string
		json, silent bool
	}{
		{name: "timebox run | head -1", reader: "head -1"},
		{name: "timebox run --json | grep -m1 tool_started", reader: "grep -m1 tool_started", json: true},
		{name: "timebox run --json | grep -m1 tool_started", reader: "grep -m1 tool_started", json: true, silent: true},
	}
	for _, tc := range cases {
		what := "the reader of stdout goes away: " + tc.reader
		if tc.silent {
			what += ", the tool silent"
		}
		t.Run(what, func(t *testing.T) {
			sc := begin(t, what, strings.TrimSuffix(tc.name, " | "+tc.reader))
			a := hangAgent(t)
			if tc.silent {
				a = silentHangAgent(t)
			}
			args := []string{binary(t), "run", "-f", a.file, "--db", a.db, "--progress-notice", "2s"}
			if tc.json {
				args = append(args, "--json")
			}
			args = append(args, "go")
			// bash runs the pipeline and says how timebox ended.
			cmd := exec.Command("bash", "-c", `"$@" | `+tc.reader+` >/dev/null; echo "timebox exit ${PIPESTATUS[0]}" >&2`, "bash")
			cmd.Args = append(cmd.Args, args...)
			cmd.Dir = a.dir
			cmd.Env = proctest.Env(append(os.Environ(), "PIDFILE="+a.pidfile))
			var errb syncbuf.Buffer
			cmd.Stderr = &errb
			start := time.Now()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			tb, peak := 0, func() int64 { return 0 }
			for deadline := time.Now().Add(10 * time.Second); tb == 0 && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
				tb = childNamed(cmd.Process.Pid, "timebox")
			}
			if tb != 0 {
				peak = procmem.Watch(tb)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case <-done:
			case <-time.After(60 * time.Second):
				cmd.Process.Kill()
				<-done
				t.Fatalf("the pipeline is still running after 60s\n%s", errb.String())
			}
			took := time.Since(start)
			out := errb.String()
			code := -1
			if _, after, ok := strings.Cut(out, "timebox exit "); ok {
				code, _ = strconv.Atoi(strings.TrimSpace(after))
			}
			// 141 is 128+SIGPIPE: killed by the signal.
			sc.count("timebox's exit code (141: killed by SIGPIPE)", code, 130)
			if tc.silent {
				// From the reader's going (the tool had started) to the
				// end of the turn; spec §12 gives an HTTP client a second.
				sc.within("the pipeline ended (the reader left as the tool started)", took, time.Second)
			} else {
				sc.within("the pipeline ended", took, 10*time.Second)
			}
			sc.allDead(a.pids())
			if tb != 0 {
				sc.nothingLeft(tb)
			} else {
				sc.nothingLeft()
			}
			rec, evs := stored(t, a.db, "")
			sc.is("stop reason", string(rec.StopReason), string(budget.ClientGone))
			// Nobody read the events: the store is the only account, and
			// every call in it that started has its record.
			n, lost := recordsLost(evs, rec, evs)
			if n > 0 {
				t.Logf("lost: %s", strings.Join(lost, "; "))
			}
			sc.addKind(kindLost, "records lost", "= 0", fmt.Sprint(n), n == 0)
			if p := peak(); p > 0 {
				sc.memory("peak memory of timebox", p, 200)
			}
		})
	}
}

// childNamed returns the pid of a child of pid whose command is name, or 0.
func childNamed(pid int, name string) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return 0
	}
	for _, f := range strings.Fields(string(b)) {
		c, _ := strconv.Atoi(f)
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", c))
		if strings.TrimSpace(string(comm)) == name {
			return c
		}
	}
	return 0
}
