//go:build faults && linux

package faults

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/temporal"
)

// noWorkerLeft: the only worker is killed (SIGKILL) mid-tool, and none is
// started for a while. Nothing of the turn can run, not even its ceiling;
// `run` following it says so, with a still_working notice whose waiting
// field names the task queue, instead of showing the call running on.
// Then a worker starts, the lost call is reported, and the turn answers.
func noWorkerLeft(t *testing.T) {
	sc := begin(t, "every worker kill -9 mid-tool", "timebox worker, run --engine temporal")
	e := newEngine(t)
	recv := e.trace()
	a := newAgent(t, scriptAgent("kill_grace: 500ms", "", "{name: hang, description: Hangs., exec: [./hang.sh], timeout: 10m}"),
		[]string{callTools("hang"), `{"text": "All done."}`}, map[string]string{"hang.sh": hangTool})
	wa, run, id, pids := e.hanging(a, "1s")
	waitSpans(t, recv, "chat ", 1) // the model call's span, the dead worker's
	killed := time.Now()
	wa.cmd.Process.Kill()
	<-wa.done
	var said *event.StillWorking
	for deadline := time.Now().Add(40 * time.Second); said == nil && time.Now().Before(deadline) && !run.exited(); time.Sleep(50 * time.Millisecond) {
		for _, ev := range run.log.snapshot() {
			if n, ok := ev.Data.(*event.StillWorking); ok && n.Waiting != "" {
				said = n
			}
		}
	}
	if said == nil {
		sc.truth("run said no worker takes the turn", "yes", "no", false)
		t.Fatalf("no notice 40s after the only worker was killed\n%s", run.stderr.String())
	}
	// The call's heartbeat timeout (1s), then WorkerWait (10s) of work no
	// worker took, then the follower's next look (every 2s).
	sc.within("kill to the notice that no worker takes the turn", time.Since(killed), 20*time.Second)
	sc.truth("the notice names the task queue", e.queue, said.Waiting, containsAll(said.Waiting, e.queue, "no timebox worker"))
	sc.count("turn ended with no worker", boolInt(run.exited()), 0)
	wb := e.worker(a, nil, "1s")
	rec, evs := e.ended(id, 60*time.Second)
	code := run.wait(10 * time.Second)
	sc.is("status once a worker came", string(rec.Status), string(budget.StatusCompleted))
	sc.count("run's exit code", code, 0)
	sc.integrity(evs, run.log.snapshot())
	if c := rec.ToolCalls; len(c) == 1 {
		sc.is("the lost call", string(c[0].Outcome)+"/"+string(c[0].Phase), "interrupted/worker_lost")
	} else {
		sc.count("tool call records", len(c), 1)
	}
	sc.allDead(pids)
	stop(wb)
	sc.traceWhole(recv, "", id)
	sc.callSpans(recv, evs) // the lost call's, which the worker that records it made
	sc.nothingLeft()
}

// ceilingOrStepWithNoWorker: the only worker is killed (SIGKILL) while
// two turns' tools hang, and none is started. One turn's ceiling (5s)
// falls, and the other's step window (3s, from its tool's report as it
// started; the tool's own timeout, 4s, keeps it open to its deadline)
// ends long before its ceiling (1m), with no worker to enforce either.
// `run` following each turn ends it as the embedded engine would have —
// stopped, turn_timeout ("Stopped after 5s, the limit for one turn …")
// or no_progress ("Stopped: nothing progressed for 3s …"), "Last step:
// tool hang, running for …", flagged — saying that no worker ran it on
// the task queue, and terminates its workflow; each call is recorded
// interrupted. (Before, the first stayed running past its ceiling until a
// worker came, and the second until its ceiling.) The two turns share one
// set-up, one worker and its kill: two scenarios for the time of one.
func ceilingOrStepWithNoWorker(t *testing.T) {
	sc := begin(t, "every worker kill -9 mid-tool, then the turn's ceiling", "timebox worker, run --engine temporal")
	scStep := begin(t, "every worker kill -9 mid-tool, then the step window", "timebox worker, run --engine temporal --step-timeout 3s")
	e := newEngine(t)
	recv := e.trace()
	const ceiling, step, toolTimeout = 5 * time.Second, 3 * time.Second, 4 * time.Second
	// The tool takes the turn's tool timeout: 1m for the first turn, 4s
	// for the second (the flags travel with the turn).
	a := newAgent(t, scriptAgent("kill_grace: 500ms, turn: "+ceiling.String(), "", "{name: hang, description: Hangs., exec: [./hang.sh]}"),
		[]string{callTools("hang"), `{"text": "never"}`}, map[string]string{"hang.sh": hangTool})
	env := []string{"PIDFILE=" + a.pidfile}
	wa := e.worker(a, env, "1s")
	run := e.run(a, env)
	runStep := e.run(a, env, "--turn-timeout", "1m", "--step-timeout", step.String(), "--tool-timeout", toolTimeout.String())
	id, idStep := turnID(t, run), turnID(t, runStep)
	pids := a.waitPIDs(t, 6, runStep) // both tools' root, child and grandchild
	storedToolStarted(t, run)
	storedToolStarted(t, runStep)
	waitSpans(t, recv, "chat ", 2) // both model calls' spans, the dead worker's
	wa.cmd.Process.Kill()
	<-wa.done
	// The ceiling (or the step window), its kill grace and the
	// follower's grace (5s); or, when later, the call's heartbeat timeout
	// (1s) and 10s of work no worker took; then the follower's next look
	// (every 2s).
	rec, evs, ok := e.endsWithin(id, ceiling+40*time.Second)
	if !ok {
		sc.truth("the turn ended with no worker", "yes", "no", false)
		t.Fatalf("turn %s still running 40s past its ceiling with no worker\n%s", id, run.stderr.String())
	}
	recStep, evsStep, ok := e.endsWithin(idStep, 40*time.Second)
	if !ok {
		scStep.truth("the turn ended with no worker", "yes", "no", false)
		t.Fatalf("turn %s still running 40s past its step window with no worker\n%s", idStep, runStep.stderr.String())
	}
	code, codeStep := run.wait(10*time.Second), runStep.wait(10*time.Second)
	// The dead worker's tools left their descendants (the roots died with
	// it): the next timebox to start on the machine reaps them — a worker
	// started again, which finds nothing of the turns to run.
	stop(e.worker(a, nil, "1s"))

	sc.within("past the ceiling", rec.EndedAt.Sub(rec.StartedAt.Add(ceiling)), 20*time.Second)
	sc.is("status", string(rec.Status)+"/"+string(rec.StopReason), string(budget.StatusStopped)+"/"+string(budget.TurnTimeout))
	sc.count("run's exit code", code, 3)
	says := strings.HasPrefix(rec.Message, "Stopped after 5s, the limit for one turn (timeouts.turn). Last step: tool hang, running for ") &&
		strings.Contains(rec.Message, "No timebox worker ran the turn on task queue "+e.queue+" ")
	sc.truth("its message", "the embedded engine's, and that no worker ran it on the task queue", fmt.Sprintf("%q", rec.Message), says)
	sc.truth("its flags", "timed out by the turn budget, during a tool", fmt.Sprintf("%+v", rec.Flags),
		rec.Flags.TimedOutDuringToolExecution && rec.Flags.TimedOutByTurnBudget)
	noWorkerEnd(t, sc, e, rec, evs, run.log.snapshot(), pids)

	// The step window: from the last progress signal (the tool's report
	// as it started), or to the tool's own deadline when later.
	var progressed, window time.Time
	for _, ev := range evsStep {
		switch x := ev.Data.(type) {
		case *event.ToolProgress, *event.LLMFinished:
			progressed = ev.At
		case *event.ToolStarted:
			window = x.Deadline
		}
	}
	if progressed.Add(step).After(window) {
		window = progressed.Add(step)
	}
	scStep.within("past the step window", recStep.EndedAt.Sub(window), 20*time.Second)
	scStep.is("status", string(recStep.Status)+"/"+string(recStep.StopReason), string(budget.StatusStopped)+"/"+string(budget.NoProgress))
	scStep.count("run's exit code", codeStep, 3)
	says = strings.HasPrefix(recStep.Message, "Stopped: nothing progressed for 3s (--step-timeout). Last step: tool hang, running for ") &&
		strings.Contains(recStep.Message, "No timebox worker ran the turn on task queue "+e.queue+" ") &&
		strings.Contains(recStep.Message, "past the end of its step window")
	scStep.truth("its message", "the embedded engine's, and that no worker ran it on the task queue", fmt.Sprintf("%q", recStep.Message), says)
	scStep.truth("its flags", "during a tool, not by the turn budget", fmt.Sprintf("%+v", recStep.Flags),
		recStep.Flags.TimedOutDuringToolExecution && !recStep.Flags.TimedOutByTurnBudget)
	var limit string
	if fin := finished(evsStep); fin != nil && fin.Limit != nil {
		limit = fin.Limit.Key + " " + fin.Limit.Value
	}
	scStep.is("its limit", limit, budget.KeyStep+" 3s")
	noWorkerEnd(t, scStep, e, recStep, evsStep, runStep.log.snapshot(), pids)
	sc.traceWhole(recv, "", id)
	sc.callSpans(recv, evs) // the hung call's, which the follower made
	scStep.traceWhole(recv, "", idStep)
	scStep.callSpans(recv, evsStep)
}

// adoptedCeiling: `timebox serve --engine temporal` (A) is killed
// (SIGKILL) while its detached turn's tool hangs, and so is the only
// worker: nobody follows the turn, and nobody runs it. A second gateway
// (B), running meanwhile, takes A for gone (three of its 1s heartbeats),
// adopts the turn at its next look (every 5s) and follows it as A would
// have: it says the turn waits for a worker, once, and past its ceiling
// (10s) ends it stopped, turn_timeout, with the embedded engine's message
// and flags and that no worker ran it, and terminates its workflow; a
// client of B's sees it to its turn_finished. (Before, the turn stayed
// running until a worker came.)
func adoptedCeiling(t *testing.T) {
	sc := begin(t, "serve kill -9 with a detached turn, every worker kill -9, then the ceiling", "timebox worker, serve --engine temporal ×2")
	e := newEngine(t)
	recv := e.trace()
	const ceiling = 10 * time.Second
	a := newAgent(t, scriptAgent("kill_grace: 500ms, turn: "+ceiling.String(), "", "{name: hang, description: Hangs., exec: [./hang.sh]}"),
		[]string{callTools("hang"), `{"text": "never"}`}, map[string]string{"hang.sh": hangTool})
	env := []string{"PIDFILE=" + a.pidfile}
	wa := e.worker(a, env, "1s")
	serve := append([]string{"--engine", "temporal"}, e.flags(a)...)
	gwA, urlA := startServe(t, a, e.env, serve...)
	gwB, urlB := startServe(t, a, e.env, serve...)
	resp, err := http.Post(urlA+"/v1/turns", "application/json", strings.NewReader(`{"input": "go", "detach": true}`))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Header.Get("Timebox-Turn-Id")
	resp.Body.Close()
	pids := a.waitPIDs(t, 3, gwA)  // the tool's root, child and grandchild
	waitSpans(t, recv, "chat ", 1) // the model call's span, the dead worker's
	gwA.cmd.Process.Kill()
	wa.cmd.Process.Kill()
	<-gwA.done
	<-wa.done
	f := replayTurn(t, urlB, id)
	// A taken for gone (3s), B's next look (every 5s); then the ceiling,
	// its kill grace and the follower's grace (5s), or, when later, the
	// call's heartbeat timeout (1s) and 10s of work no worker took; then
	// the follower's next look (every 2s).
	rec, evs, ok := e.endsWithin(id, ceiling+40*time.Second)
	if !ok {
		sc.truth("the turn ended with no worker and no follower", "yes", "no", false)
		t.Fatalf("turn %s still running 40s past its ceiling\n%s", id, gwB.stderr.String())
	}
	_, streamed := f.log.waitFor(event.TypeTurnFinished, 10*time.Second)
	sc.truth("B's client", "sees its turn_finished", fmt.Sprint(streamed), streamed)
	f.leave()
	// The dead worker's tool left its descendants (the root died with
	// it): the next timebox to start on the machine reaps them.
	stop(e.worker(a, nil, "1s"))

	sc.within("past the ceiling", rec.EndedAt.Sub(rec.StartedAt.Add(ceiling)), 20*time.Second)
	sc.is("status", string(rec.Status)+"/"+string(rec.StopReason), string(budget.StatusStopped)+"/"+string(budget.TurnTimeout))
	says := strings.HasPrefix(rec.Message, "Stopped after 10s, the limit for one turn (timeouts.turn). Last step: tool hang, running for ") &&
		strings.Contains(rec.Message, "No timebox worker ran the turn on task queue "+e.queue+" ")
	sc.truth("its message", "the embedded engine's, and that no worker ran it on the task queue", fmt.Sprintf("%q", rec.Message), says)
	sc.truth("its flags", "timed out by the turn budget, during a tool", fmt.Sprintf("%+v", rec.Flags),
		rec.Flags.TimedOutDuringToolExecution && rec.Flags.TimedOutByTurnBudget)
	notices := 0
	for _, ev := range evs {
		if n, ok := ev.Data.(*event.StillWorking); ok && n.Waiting != "" {
			notices++
		}
	}
	sc.count("notices that no worker takes the turn", notices, 1)
	stopGateways(t, gwB)
	noWorkerEnd(t, sc, e, rec, evs, f.log.snapshot(), pids, gwA.pid(), gwB.pid())
	sc.traceWhole(recv, "", id)
}

// noWorkerEnd asserts what every turn a follower ended with no worker
// has: its one call interrupted, its workflow terminated, its records
// whole and streamed, the tools' processes gone (pids: of every turn of
// the scenario) and nothing left.
func noWorkerEnd(t *testing.T, sc *scenario, e *engine, rec *event.Turn, evs, streamed []event.Event, pids map[string][]int, timeboxes ...int) {
	t.Helper()
	if c := rec.ToolCalls; len(c) == 1 {
		sc.is("the call", string(c[0].Outcome), string(event.OutcomeInterrupted))
	} else {
		sc.count("tool call records", len(c), 1)
	}
	sc.is("its workflow", workflowStatus(t, e.srv.Addr(), rec.TurnID), enums.WORKFLOW_EXECUTION_STATUS_TERMINATED.String())
	sc.integrity(evs, streamed)
	sc.allDead(pids)
	sc.nothingLeft(timeboxes...)
}

// workflowStatus returns the status of a turn's workflow.
func workflowStatus(t *testing.T, addr, turnID string) string {
	t.Helper()
	c, err := client.Dial(client.Options{HostPort: addr, Logger: sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler))})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	d, err := c.DescribeWorkflowExecution(context.Background(), temporal.WorkflowID(turnID), "")
	if err != nil {
		t.Fatal(err)
	}
	return d.GetWorkflowExecutionInfo().GetStatus().String()
}

func containsAll(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
