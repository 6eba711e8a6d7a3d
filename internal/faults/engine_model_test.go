//go:build faults && linux

package faults

import (
	"cmp"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/testenv"
)

// streamingStep is a script line whose reply streams 20 chunks 150 ms
// apart (3 s) and asks for the tool none: the model step a worker is
// killed or stopped in.
func streamingStep() string {
	chunks := make([]string, 20)
	for i := range chunks {
		chunks[i] = fmt.Sprintf("%q", fmt.Sprintf("part %d. ", i))
	}
	return `{"chunks": [` + strings.Join(chunks, ", ") + `], "chunk_delay": "150ms", "tool_calls": [{"name": "none", "arguments": {}}]}`
}

// workerGoneMidModel runs two scenarios on one engine, a turn each, whose
// first model step streams (3 s) when its only worker goes: killed
// (SIGKILL) in the first, stopped (SIGTERM, as a deploy does) in the
// second, whose worker is the one the first started. Each time a worker
// started then asks the step again, runs its tool call and answers. The
// two share one dev server, database and worker: two scenarios for the
// time of one and a bit.
func workerGoneMidModel(t *testing.T) {
	sc := begin(t, "worker kill -9 mid-model-call", "timebox worker ×2, run --engine temporal")
	scStop := begin(t, "worker SIGTERM mid-model-call", "timebox worker ×2 in turn, run --engine temporal")
	e := newEngine(t)
	recv := e.trace()
	a := newAgent(t, scriptAgent("", "", "{name: none, description: Nothing., exec: [\"true\"]}"),
		[]string{streamingStep(), `{"text": "All done."}`}, nil)

	// Killed: the next step finds the lost attempt and records it
	// (interrupted, worker_lost), attempts are numbered once.
	wa := e.worker(a, nil, "1s")
	run := e.run(a, nil)
	id := turnID(t, run)
	streaming(t, run)
	_, rec, evs, wb, took := e.workerLost(wa, a, nil, id)
	run.wait(10 * time.Second)
	sc.is("status", string(rec.Status), string(budget.StatusCompleted))
	sc.within("kill to turn_finished", took, 20*time.Second)
	sc.integrity(evs, run.log.snapshot())
	var lost, ok int
	for _, mc := range rec.ModelCalls {
		switch {
		case mc.Step == 1 && mc.Attempt == 1 && mc.Outcome == event.OutcomeInterrupted && mc.Phase == budget.PhaseWorkerLost:
			lost++
		case mc.Outcome == event.OutcomeOK && (mc.Step == 1 && mc.Attempt == 2 || mc.Step == 2 && mc.Attempt == 1):
			ok++
		}
	}
	sc.truth("model call records", "step 1: attempt 1 worker_lost, attempt 2 ok; step 2 ok", fmt.Sprintf("%d lost, %d ok of %d", lost, ok, len(rec.ModelCalls)),
		lost == 1 && ok == 2 && len(rec.ModelCalls) == 3)

	// Stopped: the worker gives the attempt up at once and says so — the
	// attempt "cancelled by the worker, stopping", no timeout, no failure
	// of the model, not lost — and the next worker asks the step again.
	// (Its figures come after the kill's last ones, which wait for every
	// worker to stop: one line of the report each.)
	own := time.Now()
	run2 := e.run(a, nil)
	id2 := turnID(t, run2)
	streaming(t, run2)
	stopped := time.Now()
	wb.cmd.Process.Signal(syscall.SIGTERM)
	code := wb.wait(30 * time.Second)
	exited := time.Now()
	wc := e.worker(a, nil, "1s")
	ready := time.Now()
	rec2, evs2 := e.ended(id2, 60*time.Second)
	took2 := time.Since(stopped)
	code2 := run2.wait(10 * time.Second)
	stop(wc)
	// Its own time: its turn and the workers it stops and starts, on the
	// set-up it shares with the kill's (the engine, the stopped worker).
	ownTime := time.Since(own)
	wholeTrace(sc, recv, id, evs)
	sc.nothingLeft()

	scStop.within("SIGTERM to the worker's exit", exited.Sub(stopped), 5*time.Second)
	scStop.count("the stopped worker's exit code", code, 0)
	// The workflow task it failed to hand the turn over is no error of
	// its (temporal.QuietHandOvers).
	scStop.truth("the stopped worker's stderr", "no \"Workflow panic\"", fmt.Sprintf("%d", strings.Count(wb.stderr.String(), "Workflow panic")),
		!strings.Contains(wb.stderr.String(), "Workflow panic"))
	scStop.is("status", string(rec2.Status)+"/"+string(rec2.StopReason), string(budget.StatusCompleted)+"/"+string(budget.Answered))
	scStop.count("run's exit code", code2, 0)
	scStop.within("SIGTERM to turn_finished", took2, 20*time.Second)
	scStop.integrity(evs2, run2.log.snapshot())
	givenUp(scStop, rec2, evs2, exited)
	b := blames(rec2, evs2)
	scStop.truth("what its records and events blame (a model timeout or failure, a loss, a cancel, a failover)", "nothing",
		cmp.Or(strings.Join(b, "; "), "nothing"), len(b) == 0)
	// What the turn took beyond the model's own time (every attempt's
	// stream, the given-up one's to its cancellation) and its tool's: the
	// worker's stop, the next worker's start (the test starts it once the
	// stopped one has exited), and Temporal handing it the turn. The
	// stopped worker fails the workflow task it held (temporal's
	// errHandOver) and the server queues the next at once; before, the
	// task timed out 5s after it began, as after a kill -9.
	var modelMS int64
	for _, mc := range rec2.ModelCalls {
		modelMS += mc.StreamMS
	}
	beyond := time.Duration(rec2.WallMS-modelMS-rec2.ToolMS) * time.Millisecond
	scStop.within("the turn beyond the model's own time and its tool's", beyond, 2500*time.Millisecond)
	scStop.add("of which the new worker's start, from the old one's exit", "—", ms(ready.Sub(exited)), true)
	if began := attemptBegan(evs2, 1, 2); !began.IsZero() {
		scStop.add("and from the new worker running to the attempt asked again", "—", ms(began.Sub(ready)), true)
	}
	scStop.add("the scenario's own time, its set-up shared", "—", ms(ownTime), true)
	wholeTrace(scStop, recv, id2, evs2)
	scStop.nothingLeft()
}

// wholeTrace asserts a turn's trace whole (traceWhole), its calls' spans
// (callSpans) and its attempts' (chatSpans): a lost attempt's, which the
// worker that recorded it lost made; a given-up one's, which the stopping
// worker ended.
func wholeTrace(sc *scenario, recv *testenv.OTLP, id string, evs []event.Event) {
	sc.t.Helper()
	sc.traceWhole(recv, "", id)
	sc.callSpans(recv, evs)
	sc.chatSpans(recv, evs)
}

// attemptBegan returns when the attempt of step began (its llm_started).
func attemptBegan(evs []event.Event, step, attempt int) time.Time {
	for _, ev := range evs {
		if d, ok := ev.Data.(*event.LLMStarted); ok && d.Step == step && d.Attempt == attempt {
			return ev.At
		}
	}
	return time.Time{}
}

// streaming waits until the model's reply streams on run's stream.
func streaming(t *testing.T, run *proc) {
	t.Helper()
	if _, ok := run.log.waitFor(event.TypeLLMDelta, 30*time.Second); !ok {
		t.Fatalf("no stream\n%s", run.stderr.String())
	}
}

// givenUp asserts what the records of a turn whose worker was stopped
// (SIGTERM) mid-attempt say: step 1's first attempt given up by the
// worker stopping, in those words, and asked again by a worker started
// after the stopped one had exited, which answered.
func givenUp(sc *scenario, rec *event.Turn, evs []event.Event, exited time.Time) {
	sc.t.Helper()
	var first, again *event.ModelCall
	for i, mc := range rec.ModelCalls {
		switch {
		case mc.Step == 1 && mc.Attempt == 1:
			first = &rec.ModelCalls[i]
		case mc.Step == 1 && mc.Attempt == 2:
			again = &rec.ModelCalls[i]
		}
	}
	if first == nil || again == nil {
		sc.count("step 1's model call records", len(rec.ModelCalls), 2)
		return
	}
	sc.truth("the given-up attempt", "cancelled by the worker, stopping",
		fmt.Sprintf("%s/%s %q", first.Outcome, first.Phase, first.Error),
		first.Outcome == event.OutcomeCancelled && strings.Contains(first.Error, "the worker, stopping"))
	began := attemptBegan(evs, 1, 2)
	sc.truth("asked again", "attempt 2 ok, begun on the new worker", fmt.Sprintf("%s, begun %s after the stopped worker exited", again.Outcome, ms(began.Sub(exited))),
		again.Outcome == event.OutcomeOK && began.After(exited))
}

// blames lists what a turn's records and events say that would send a
// reader after the wrong cause of a worker's stop mid-attempt: a model
// call that timed out or failed, or was lost with its worker; a failover;
// a cancel by the workflow or a client; a turn that did not answer.
func blames(rec *event.Turn, evs []event.Event) []string {
	var out []string
	for _, ev := range evs {
		switch d := ev.Data.(type) {
		case *event.LLMFinished:
			mc := d.ModelCall
			if mc.Outcome == event.OutcomeTimedOut || mc.Outcome == event.OutcomeError || mc.Outcome == event.OutcomeInterrupted || mc.Phase.IsLLM() ||
				containsAny(strings.ToLower(mc.Error), "timeout", "timed out", "the model failed", "lost", "workflow", "client") {
				out = append(out, fmt.Sprintf("step %d attempt %d: %s/%s %q", mc.Step, mc.Attempt, mc.Outcome, mc.Phase, mc.Error))
			}
		case *event.Failover:
			out = append(out, fmt.Sprintf("a failover from %s to %s (%s)", d.From, d.To, d.Phase))
		}
	}
	if rec.Status != budget.StatusCompleted || rec.StopReason != budget.Answered || rec.Flags != (event.Flags{}) || rec.Failovers != 0 {
		out = append(out, fmt.Sprintf("the turn %s/%s, flags %+v, %d failovers: %q", rec.Status, rec.StopReason, rec.Flags, rec.Failovers, rec.Message))
	}
	return out
}

func containsAny(s string, parts ...string) bool {
	for _, p := range parts {
		if strings.Contains(s, p) {
			return true
		}
	}
	return false
}
