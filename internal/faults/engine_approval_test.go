//go:build faults && linux

package faults

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/testenv"
	"github.com/timebox-run/timebox/internal/wait"
	"github.com/timebox-run/timebox/store"
)

// workerKilledWhileApproving: on the Temporal engine, the worker of a turn
// whose call waits for a person is killed (SIGKILL) and another started;
// the decision then comes through `timebox serve`, a signal to the
// workflow. The wait is the workflow's (a signal and a timer), not the
// worker's: the new worker runs the call once and the turn answers, the
// person asked once (docs/approvals.md).
func workerKilledWhileApproving(t *testing.T) {
	sc := begin(t, "worker kill -9 while a call waits for a person", "timebox worker ×2, serve --engine temporal, the decision by its route")
	e := newEngine(t)
	recv := e.trace()
	a := deployAgent(t)
	wa := e.worker(a, nil, "1s")
	gw, url := startServe(t, a, e.env, append([]string{"--engine", "temporal"}, e.flags(a)...)...)
	turnID, callID := waitingCall(t, url, `{"input": "deploy", "detach": true}`)
	waitSpans(t, recv, "chat ", 1) // the model call's span, the dead worker's
	wa.cmd.Process.Kill()
	<-wa.done
	wb := e.worker(a, nil, "1s")
	decided := time.Now()
	resp, err := http.Post(url+"/v1/turns/"+turnID+"/approvals/"+callID, "application/json", strings.NewReader(`{"decision": "approve", "by": "faults"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	sc.truth("decision through serve (HTTP status)", "200 or 202", http.StatusText(resp.StatusCode),
		resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusAccepted)
	rec, evs := e.ended(turnID, 60*time.Second)
	sc.within("decision to the turn's end, on the new worker", time.Since(decided), 15*time.Second)
	sc.is("status", string(rec.Status), string(budget.StatusCompleted))
	sc.count("times the approved call ran", ranTimes(a), 1)
	asked := 0
	for _, ev := range evs {
		if ev.Type == event.TypeApprovalRequested {
			asked++
		}
	}
	sc.count("times the person was asked", asked, 1)
	sc.integrity(evs, nil)
	stop(wb)
	stopGateways(t, gw)
	sc.traceWhole(recv, "", turnID)
	sc.nothingLeft(gw.pid())
}

// runKilledWhileApproving: `timebox run --engine temporal` (not detached)
// asks on its terminal for a decision on a call, and is killed (SIGKILL)
// while the call waits. The wait runs no unit to watch the store for the
// cancel request stored once run is taken for gone (3 heartbeats of 1s):
// the workers pass it on to the workflow, and the turn ends client_gone
// at once, the call not run — not when the wait expires, a day later
// (docs/temporal.md).
func runKilledWhileApproving(t *testing.T) {
	sc := begin(t, "run kill -9 while a call waits for a person", "timebox worker, run --engine temporal on a terminal")
	e := newEngine(t)
	recv := e.trace()
	a := deployAgent(t)
	w := e.worker(a, nil, "1s")
	master, tty := testenv.PTY(t)
	go io.Copy(io.Discard, master) // the live view and the question; ends when the test closes master
	run := startTimeboxWith(t, a.dir, append([]string{"TERM=xterm"}, e.env...), tty, func(c *exec.Cmd) {
		c.Stdin = tty
		c.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	}, append(append([]string{"run", "--engine", "temporal"}, e.flags(a)...), "deploy")...)
	id := e.waitingTurn(run)
	killed := time.Now()
	run.cmd.Process.Kill()
	<-run.done
	const bound = 15 * time.Second
	rec, evs, ok := e.endsWithin(id, 2*bound)
	if !ok {
		sc.within("kill to turn_finished", time.Since(killed), bound)
		t.Fatalf("the turn still waits %s after its run was killed", ms(time.Since(killed)))
	}
	sc.within("kill to turn_finished", rec.EndedAt.Sub(killed), bound)
	sc.is("stop reason", string(rec.StopReason), string(budget.ClientGone))
	sc.count("times the call ran", ranTimes(a), 0)
	if c := rec.ToolCalls; len(c) == 1 {
		sc.truth("its record", "not run", fmt.Sprintf("%s/%s", c[0].Outcome, c[0].Phase), c[0].Outcome != event.OutcomeOK)
	} else {
		sc.count("tool call records", len(c), 1)
	}
	sc.integrity(evs, nil)
	stop(w)
	sc.traceWhole(recv, "", id)
	sc.nothingLeft()
}

// waitingTurn waits until a turn in the engine's store has a call waiting
// for a person, started by p, and returns its id.
func (e *engine) waitingTurn(p *proc) string {
	e.t.Helper()
	ctx := context.Background()
	var id string
	wait.For(e.t, 60*time.Second, "a call waiting for a person", func() bool {
		if p.exited() {
			e.t.Fatalf("timebox exited\n%s", p.stderr.String())
		}
		list, _ := e.st.Turns(ctx, store.Filter{})
		for _, s := range list {
			evs, _ := e.st.Events(ctx, s.TurnID, 0, 0)
			for _, ev := range evs {
				if ev.Type == event.TypeApprovalRequested {
					id = s.TurnID
					return true
				}
			}
		}
		return false
	})
	return id
}

// gatewayStoppedMidTurns: `timebox serve --engine temporal` (grace 1s)
// gets SIGTERM while it runs a detached turn and a turn its SSE client
// follows, both mid-tool. A gateway shutting down stops following its
// engine turns and cancels none (docs/temporal.md): the detached turn runs
// on on the worker and answers; the followed one, whose client's stream
// ended with its gateway, ends client_gone once the gateway is taken for
// gone — neither is cancelled "shutdown". A second gateway follows both
// to their turn_finished.
func gatewayStoppedMidTurns(t *testing.T) {
	sc := begin(t, "serve SIGTERM, its engine turns running", "timebox worker, serve --engine temporal ×2 in turn, SSE clients")
	e := newEngine(t)
	a := newAgent(t, scriptAgent("", "", `{name: slow, description: Slow., exec: [./slow.sh, "8"], timeout: 1m}`),
		[]string{callTools("slow"), `{"text": "All done."}`}, map[string]string{"slow.sh": slowTool})
	// Traced: the turns end on the worker after A stopped following them,
	// and their spans are the worker's to make
	// (docs/decisions/turn-span-of-a-lost-turn.md).
	recv := e.trace()
	w := e.worker(a, []string{"PIDFILE=" + a.pidfile}, "1s")
	serve := append([]string{"--engine", "temporal", "--shutdown-grace", "1s"}, e.flags(a)...)
	gwA, urlA := startServe(t, a, e.env, serve...)
	resp, err := http.Post(urlA+"/v1/turns", "application/json", strings.NewReader(`{"input": "go", "detach": true}`))
	if err != nil {
		t.Fatal(err)
	}
	detached := resp.Header.Get("Timebox-Turn-Id")
	resp.Body.Close()
	followed := postTurn(t, urlA, `{"input": "go"}`)
	a.waitPIDs(t, 2, gwA)
	sent := time.Now()
	gwA.cmd.Process.Signal(syscall.SIGTERM)
	code := gwA.wait(30 * time.Second)
	sc.count("A's exit code", code, 0)
	sc.within("A exited after SIGTERM (grace 1s)", gwA.took-sent.Sub(gwA.start), 3*time.Second)
	<-followed.done
	_, got := followed.log.waitFor(event.TypeTurnFinished, 0)
	sc.truth("the followed turn's client: its stream ended with A", "without turn_finished", fmt.Sprint(!got), !got)

	gwB, urlB := startServe(t, a, e.env, serve...)
	for _, tc := range []struct{ name, id, want string }{
		{"detached", detached, "completed/answered"},
		{"followed", followed.turnID, "cancelled/client_gone"},
	} {
		name, id := tc.name, tc.id
		f := replayTurn(t, urlB, id)
		ev, ok := f.log.waitFor(event.TypeTurnFinished, 60*time.Second)
		if !ok {
			sc.truth(name+" turn followed through B", "to turn_finished", "no turn_finished", false)
			continue
		}
		fin := ev.Data.(*event.TurnFinished)
		sc.is(name+" turn's end, through B", fmt.Sprintf("%s/%s", fin.Status, fin.StopReason), tc.want)
		sc.within(name+" turn: SIGTERM to its turn_finished", ev.At.Sub(sent), 20*time.Second)
		_, evs := e.ended(id, 10*time.Second)
		sc.integrity(evs, f.log.snapshot())
		sc.count(name+" turn's stored events missing from B's stream", len(evs)-len(f.log.snapshot()), 0)
		f.leave()
	}
	stopGateways(t, gwB)
	stop(w) // it exports the spans it holds as it stops
	for name, id := range map[string]string{"detached": detached, "followed": followed.turnID} {
		var turns []string
		var turn *tracepb.Span
		for _, sp := range recv.Spans() {
			if strings.HasPrefix(sp.GetName(), "invoke_agent ") && testenv.SpanAttrs(sp)["timebox.turn.id"].GetStringValue() == id {
				turn = sp
				turns = append(turns, testenv.SpanAttrs(sp)["timebox.outcome"].GetStringValue())
			}
		}
		children := 0
		for _, sp := range recv.Spans() {
			if turn != nil && string(sp.GetParentSpanId()) == string(turn.GetSpanId()) {
				children++
			}
		}
		want := map[string]string{"detached": "completed", "followed": "cancelled"}[name]
		sc.is(name+" turn's spans, made after A stopped following it", fmt.Sprintf("%v, %d under it", turns, children),
			fmt.Sprintf("[%s], %d under it", want, max(children, 1)))
	}
	sc.traceWhole(recv, "", detached, followed.turnID)
	sc.nothingLeft(gwA.pid(), gwB.pid())
}
