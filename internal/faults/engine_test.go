//go:build faults && linux

package faults

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/procmem"
	"github.com/timebox-run/timebox/internal/syncbuf"
	"github.com/timebox-run/timebox/internal/testenv"
	"github.com/timebox-run/timebox/internal/wait"
	"github.com/timebox-run/timebox/store/postgres"
	"github.com/timebox-run/timebox/temporal"
)

// TestEngineFaults runs the faults of the Temporal engine against the real
// services: a Temporal dev server of the suite's own (killed and started
// again), a throwaway PostgreSQL, `timebox worker` processes and `timebox
// run --engine temporal`. Each scenario measures records lost, duplicate
// records, the time to the turn's end and the processes left
// (docs/RELIABILITY.md, "The Temporal engine").
func TestEngineFaults(t *testing.T) {
	for _, s := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"worker kill -9 mid-tool", workerKilledMidTool},
		{"worker kill -9 or SIGTERM mid-model-call", workerGoneMidModel},
		{"worker kill -9 mid-compaction", workerKilledMidCompaction},
		{"worker kill -9 mid-tool, retried", workerKilledMidRetriedTool},
		{"run kill -9 (not detached)", runKilled},
		{"dev server kill -9, restart", serverKilledRestarted},
		{"dev server restarted without its data", serverLostItsData},
		{"3 MB tool result", largeToolResult},
		{"50 MB conversation", largeConversation},
		{"agent file mismatch", agentMismatch},
		{"1,000 steps", thousandSteps},
		{"worker kill -9 while a call waits for a person", workerKilledWhileApproving},
		{"run kill -9 while a call waits for a person", runKilledWhileApproving},
		{"worker SIGSTOP mid-tool, retries", workerStalledMidTool},
		{"worker kill -9 mid-tool, then the ceiling", ceilingWhileWorkerDead},
		{"every worker kill -9 mid-tool", noWorkerLeft},
		{"every worker kill -9 mid-tool, then the ceiling or the step window", ceilingOrStepWithNoWorker},
		{"serve SIGTERM, its engine turns running", gatewayStoppedMidTurns},
		{"serve kill -9 with a detached turn, every worker kill -9, then the ceiling", adoptedCeiling},
	} {
		t.Run(s.name, s.run)
	}
}

// engine is one scenario's engine: a dev server of its own, a PostgreSQL
// database whose stores heartbeat every second (a gone process is judged
// in 3s), a task queue, and a store of the test's to read what the
// workers stored.
type engine struct {
	t     *testing.T
	srv   *testenv.TemporalServer
	dsn   string
	queue string
	st    *postgres.Store
	// env is added to the environment of the workers and runs it starts:
	// traced's, once trace was called.
	env []string
}

func newEngine(t *testing.T) *engine {
	t.Helper()
	e := &engine{t: t, srv: testenv.StartTemporal(t), queue: "faults"}
	dsn := testenv.Postgres(t)
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	e.dsn = dsn + sep + postgres.HeartbeatParam + "=1s"
	st, err := postgres.Open(context.Background(), e.dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e.st = st
	return e
}

// trace makes the workers and runs e starts from now on export their
// spans to a receiver of their own, which it returns.
func (e *engine) trace() *testenv.OTLP {
	recv := testenv.NewOTLP(e.t)
	e.env = traced(recv)
	return recv
}

func (e *engine) flags(a agentDir) []string {
	return []string{"-f", a.file, "--db", e.dsn, "--temporal-address", e.srv.Addr(), "--task-queue", e.queue}
}

// worker starts `timebox worker` for a, heartbeating every heartbeat, and
// waits until it runs.
func (e *engine) worker(a agentDir, env []string, heartbeat string) *proc {
	e.t.Helper()
	var out syncbuf.Buffer
	p := startTimebox(e.t, a.dir, append(env[:len(env):len(env)], e.env...), &out, append([]string{"worker", "--worker-heartbeat", heartbeat}, e.flags(a)...)...)
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(out.String(), "timebox worker running") {
		if time.Now().After(deadline) || p.exited() {
			e.t.Fatalf("the worker did not start\n%s", p.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return p
}

// run starts `timebox run --engine temporal --json` for a.
func (e *engine) run(a agentDir, env []string, extra ...string) *proc {
	e.t.Helper()
	args := append([]string{"run", "--engine", "temporal", "--json"}, e.flags(a)...)
	return startTimebox(e.t, a.dir, append(env[:len(env):len(env)], e.env...), nil, append(append(args, extra...), "go")...)
}

// workerLost kills w (SIGKILL) mid-turn, starts another worker of a (its
// env, a heartbeat of 1s) and waits for turn id's end: when w was killed,
// the turn's record and stored events, the new worker, and the time from
// the kill to the end.
func (e *engine) workerLost(w *proc, a agentDir, env []string, id string) (killed time.Time, rec *event.Turn, evs []event.Event, wb *proc, took time.Duration) {
	e.t.Helper()
	killed = time.Now()
	w.cmd.Process.Kill()
	<-w.done
	wb = e.worker(a, env, "1s")
	rec, evs = e.ended(id, 60*time.Second)
	return killed, rec, evs, wb, time.Since(killed)
}

// ended waits up to d for the turn to end in the store and returns its
// record with its stored events.
func (e *engine) ended(id string, d time.Duration) (*event.Turn, []event.Event) {
	e.t.Helper()
	rec, evs, ok := e.endsWithin(id, d)
	if !ok {
		e.t.Fatalf("turn %s had not ended after %s", id, d)
	}
	return rec, evs
}

// endsWithin is ended for a scenario that measures whether the turn ends
// in time: false when it is still running after d.
func (e *engine) endsWithin(id string, d time.Duration) (*event.Turn, []event.Event, bool) {
	e.t.Helper()
	changed, unwatch := e.st.Watch(id)
	defer unwatch()
	deadline := time.After(d)
	for {
		rec, err := e.st.Turn(context.Background(), id)
		if err == nil && rec.Status != budget.StatusRunning {
			evs, err := e.st.Events(context.Background(), id, 0, 0)
			if err != nil {
				e.t.Fatal(err)
			}
			return rec, evs, true
		}
		select {
		case <-changed:
		case <-time.After(500 * time.Millisecond):
		case <-deadline:
			return nil, nil, false
		}
	}
}

// hanging starts a worker for a and a run of its turn, and returns them
// once the turn's hanging tool runs, with the turn's id and the tool's
// pids (a's tool writes them to its pid file, hangTool).
func (e *engine) hanging(a agentDir, heartbeat string) (w, run *proc, id string, pids map[string][]int) {
	e.t.Helper()
	env := []string{"PIDFILE=" + a.pidfile}
	w = e.worker(a, env, heartbeat)
	run = e.run(a, env)
	id = turnID(e.t, run)
	pids = waitTool(e.t, a, run)
	storedToolStarted(e.t, run)
	return w, run, id, pids
}

// storedToolStarted waits until the stream run follows, which a Temporal
// runner reads from the store, has the call's tool_started: stored, so a
// kill cannot take it with it, as it may a queued event. It names the
// call's span, which the worker that records the call lost makes
// (callSpans).
func storedToolStarted(t *testing.T, run *proc) {
	t.Helper()
	if _, ok := run.log.waitFor(event.TypeToolStarted, 30*time.Second); !ok {
		t.Fatalf("the call's tool_started was never stored\n%s", run.stderr.String())
	}
}

// stop stops a worker with SIGTERM, as an operator would.
func stop(w *proc) {
	w.cmd.Process.Signal(syscall.SIGTERM)
	w.wait(30 * time.Second)
}

// turnID waits for the turn's first event on p's stream and returns its id.
func turnID(t *testing.T, p *proc) string {
	t.Helper()
	ev, ok := p.log.waitFor(event.TypeTurnStarted, 60*time.Second)
	if !ok {
		t.Fatalf("no turn_started\n%s", p.stderr.String())
	}
	return ev.TurnID
}

// integrity asserts what a turn's stored events say of its records: every
// call and model attempt that began has its end (records lost), nothing
// ends twice (duplicate records), the turn has one turn_finished, and the
// stream followed has it too.
func (s *scenario) integrity(evs []event.Event, streamed []event.Event) {
	s.t.Helper()
	calls, attempts := map[string]int{}, map[string]int{}
	started, begun := map[string]bool{}, map[string]bool{}
	finished := 0
	for _, e := range evs {
		switch d := e.Data.(type) {
		case *event.ToolStarted:
			started[d.CallID] = true
		case *event.ToolFinished:
			calls[d.CallID]++
		case *event.LLMStarted:
			begun[fmt.Sprintf("%d/%d", d.Step, d.Attempt)] = true
		case *event.LLMFinished:
			attempts[fmt.Sprintf("%d/%d", d.Step, d.Attempt)]++
		case *event.TurnFinished:
			finished++
		}
	}
	lost, dup := 0, 0
	for id := range started {
		if calls[id] == 0 {
			lost++
		}
	}
	for k := range begun {
		if attempts[k] == 0 {
			lost++
		}
	}
	for _, n := range calls {
		dup += max(n-1, 0)
	}
	for _, n := range attempts {
		dup += max(n-1, 0)
	}
	if finished == 0 {
		lost++
	}
	dup += max(finished-1, 0)
	s.addKind(kindLost, "records lost", "= 0", fmt.Sprint(lost), lost == 0)
	s.count("duplicate records", dup, 0)
	if streamed != nil {
		end := len(streamed) > 0 && streamed[len(streamed)-1].Type == event.TypeTurnFinished
		s.truth("turn_finished streamed", "the last event", fmt.Sprint(end), end)
	}
}

// slowTool writes its pid and sleeps $1 seconds, then answers.
const slowTool = `#!/usr/bin/env bash
cat >/dev/null
echo "root $$" >> "$PIDFILE"
sleep "$1"
echo done
`

// workerKilledMidTool: the worker running a call is killed (SIGKILL); a
// second worker takes the turn on. The call has one record — interrupted,
// worker_lost, the time it is known to have run apart from when the loss
// was noticed — and the turn answers.
func workerKilledMidTool(t *testing.T) {
	sc := begin(t, "worker kill -9 mid-tool", "timebox worker ×2, run --engine temporal")
	e := newEngine(t)
	recv := e.trace()
	a := newAgent(t, scriptAgent("kill_grace: 500ms", "", "{name: hang, description: Hangs., exec: [./hang.sh], timeout: 10m}"),
		[]string{callTools("hang"), `{"text": "All done."}`}, map[string]string{"hang.sh": hangTool})
	wa, run, id, pids := e.hanging(a, "1s")
	time.Sleep(500 * time.Millisecond) // the call has run and heartbeaten a while
	killed, rec, evs, wb, took := e.workerLost(wa, a, []string{"PIDFILE=" + a.pidfile}, id)
	code := run.wait(10 * time.Second)
	sc.is("status", string(rec.Status), string(budget.StatusCompleted))
	sc.count("run's exit code", code, 0)
	sc.within("kill to turn_finished", took, 15*time.Second)
	sc.integrity(evs, run.log.snapshot())
	if c := rec.ToolCalls; len(c) == 1 {
		ran := time.Duration(c[0].DurationMS) * time.Millisecond
		sc.is("the lost call", string(c[0].Outcome)+"/"+string(c[0].Phase), "interrupted/worker_lost")
		sc.truth("its duration: what its heartbeats said, not when the loss was noticed", "≤ run until the kill",
			fmt.Sprintf("%s, noticed %s later", ms(ran), ms(c[0].NoticedAt.Sub(c[0].EndedAt))),
			ran <= killed.Sub(c[0].StartedAt)+100*time.Millisecond && c[0].NoticedAt.After(c[0].EndedAt))
	} else {
		sc.count("tool call records", len(c), 1)
	}
	sc.allDead(pids)
	stop(wb)
	sc.traceWhole(recv, "", id)
	sc.callSpans(recv, evs) // the lost call's, which the worker that records it made
	sc.nothingLeft()
}

// runKilled: the `timebox run` following a turn (not detached) is killed;
// the turn, running on a worker, is cancelled as client_gone once the
// run's store is taken for gone (3 heartbeats of 1s), its tool stopped.
func runKilled(t *testing.T) {
	sc := begin(t, "run kill -9, its turn not detached", "timebox worker, run --engine temporal")
	e := newEngine(t)
	recv := e.trace()
	w, run, id, pids := e.hanging(hangAgent(t), "1s")
	killed := time.Now()
	run.cmd.Process.Kill()
	<-run.done
	rec, evs := e.ended(id, 60*time.Second)
	took := time.Since(killed)
	sc.is("stop reason", string(rec.StopReason), string(budget.ClientGone))
	sc.within("kill to turn_finished", took, 10*time.Second)
	sc.integrity(evs, nil)
	gone := waitGone(treeOf(pids), 5*time.Second)
	sc.truth("the tool's tree", "stopped", fmt.Sprintf("gone %s after the turn ended", ms(gone)), gone < 5*time.Second)
	sc.allDead(pids)
	stop(w)
	sc.traceWhole(recv, "", id)
	sc.nothingLeft()
}

// serverKilledRestarted: the dev server is killed mid-tool and started
// again with its data 5s later, past the worker's heartbeat timeout. The
// tool is not stopped by the outage (a heartbeat that cannot reach the
// server is no cancellation); the turn goes on to its answer, its call
// with one record.
func serverKilledRestarted(t *testing.T) {
	sc := begin(t, "dev server kill -9 mid-tool, restarted", "timebox worker, run --engine temporal")
	e := newEngine(t)
	a := newAgent(t, scriptAgent("", "", "{name: slow, description: Slow., exec: [./slow.sh, \"6\"], timeout: 1m}"),
		[]string{callTools("slow"), `{"text": "All done."}`}, map[string]string{"slow.sh": slowTool})
	env := []string{"PIDFILE=" + a.pidfile}
	w := e.worker(a, env, "3s")
	run := e.run(a, env)
	id := turnID(t, run)
	a.waitPIDs(t, 1, run)
	killed := time.Now()
	e.srv.Kill()
	time.Sleep(5 * time.Second) // an outage past the worker's heartbeat timeout
	e.srv.Restart(t, false)
	t.Logf("the dev server was back after %s", ms(time.Since(killed)))
	rec, evs := e.ended(id, 90*time.Second)
	took := time.Since(killed)
	code := run.wait(30 * time.Second)
	sc.truth("the turn's end", "not a cancel", fmt.Sprintf("%s/%s", rec.Status, rec.StopReason), rec.Status != budget.StatusCancelled)
	sc.is("status", string(rec.Status), string(budget.StatusCompleted))
	sc.count("run's exit code", code, 0)
	sc.within("kill to turn_finished", took, 45*time.Second)
	sc.integrity(evs, run.log.snapshot())
	sc.count("tool call records", len(rec.ToolCalls), 1)
	if len(rec.ToolCalls) == 1 {
		// ok when its result reached the store before Temporal gave the
		// attempt up; interrupted (worker_lost) when not.
		c := rec.ToolCalls[0]
		sc.add("the call", "ok or worker_lost", fmt.Sprintf("%s %s after %s", c.Outcome, c.Phase, ms(time.Duration(c.DurationMS)*time.Millisecond)),
			c.Outcome == event.OutcomeOK || c.Phase == budget.PhaseWorkerLost)
	}
	stop(w)
	sc.nothingLeft()
}

// serverLostItsData: the dev server is killed mid-tool and started again
// empty. The turn's workflow is gone: the run ends it as engine_lost —
// stored and streamed, said on stderr — and the worker's unit, seeing the
// turn ended, stops its tool.
func serverLostItsData(t *testing.T) {
	sc := begin(t, "dev server restarted without its data", "timebox worker, run --engine temporal")
	e := newEngine(t)
	w, run, id, pids := e.hanging(hangAgent(t), "1s")
	e.srv.Kill()
	e.srv.Restart(t, true)
	restarted := time.Now()
	rec, evs := e.ended(id, 60*time.Second)
	took := time.Since(restarted)
	code := run.wait(30 * time.Second)
	sc.is("stop reason", string(rec.StopReason), string(budget.EngineLost))
	sc.within("restart to turn_finished", took, 10*time.Second)
	sc.count("run's exit code", code, 1)
	says := strings.Contains(run.stderr.String(), "Temporal lost its workflow")
	sc.truth("run's stderr", "says Temporal lost the turn's workflow", fmt.Sprint(says), says)
	sc.integrity(evs, run.log.snapshot())
	gone := waitGone(treeOf(pids), 10*time.Second)
	sc.truth("the tool's tree", "stopped", fmt.Sprintf("gone %s later", ms(gone)), gone < 10*time.Second)
	sc.allDead(pids)
	stop(w)
	sc.nothingLeft()
}

// largeToolResult: one tool result of 3 MB, past Temporal's 2 MB payload
// limit, gets one record, and the model is given it.
func largeToolResult(t *testing.T) {
	sc := begin(t, "a 3 MB tool result", "timebox worker, run --engine temporal")
	e := newEngine(t)
	a := newAgent(t, scriptAgent("", "max_tool_output: 4MiB", "{name: big, description: Big., exec: [sh, -c, 'cat >/dev/null; head -c 3145728 /dev/zero | tr \"\\\\0\" x']}"),
		[]string{callTools("big"), `{"text": "All done."}`}, nil)
	w := e.worker(a, nil, "1s")
	start := time.Now()
	run := e.run(a, nil)
	id := turnID(t, run)
	rec, evs := e.ended(id, 60*time.Second)
	took := time.Since(start)
	run.wait(30 * time.Second)
	sc.is("status", string(rec.Status), string(budget.StatusCompleted))
	sc.within("turn", took, 20*time.Second)
	sc.integrity(evs, run.log.snapshot())
	if c := rec.ToolCalls; len(c) == 1 {
		sc.truth("its record", "one, ok, 3 MB", fmt.Sprintf("%s, %s", c[0].Outcome, megabytes(int64(len(toolOutput(c[0].Result))))),
			c[0].Outcome == event.OutcomeOK && len(toolOutput(c[0].Result)) == 3<<20)
	} else {
		sc.count("tool call records", len(c), 1)
	}
	stop(w)
	sc.nothingLeft()
}

// largeConversation: a turn whose tool results add up to 50 MB (history
// compaction at its default, context.compact_at: it summarises, and the
// results stay whole in the conversation), then a second turn of the same
// session with that conversation as its history: both end as they would
// embedded.
func largeConversation(t *testing.T) {
	sc := begin(t, "a 50 MB conversation", "timebox worker, run --engine temporal ×2")
	e := newEngine(t)
	lines := make([]string, 0, 12)
	for range 10 {
		lines = append(lines, callTools("big"))
	}
	// The script goes on per conversation: the session's next turn
	// answers at once.
	lines = append(lines, `{"text": "All done."}`, `{"text": "Still here."}`)
	a := newAgent(t, scriptAgent("turn: 10m", "max_tool_output: 6MiB", "{name: big, description: Big., exec: [sh, -c, 'cat >/dev/null; head -c 5242880 /dev/zero | tr \"\\\\0\" x']}"),
		lines, nil)
	w := e.worker(a, nil, "3s")
	base := procmem.Resident(w.cmd.Process.Pid)
	var runPeaks []int64
	for i, text := range []string{"a 50 MB conversation", "its next turn"} {
		start := time.Now()
		run := startTimebox(t, a.dir, nil, nil, append(append([]string{"run", "--engine", "temporal", "--json", "--session", "big"}, e.flags(a)...), text)...)
		id := turnID(t, run)
		rec, evs := e.ended(id, 5*time.Minute)
		took := time.Since(start)
		run.wait(60 * time.Second)
		runPeaks = append(runPeaks, run.peak())
		sc.is(fmt.Sprintf("turn %d status", i+1), string(rec.Status), string(budget.StatusCompleted))
		sc.within(fmt.Sprintf("turn %d", i+1), took, 3*time.Minute)
		sc.integrity(evs, run.log.snapshot())
		if i == 0 {
			sc.count("tool call records of turn 1", len(rec.ToolCalls), 10)
		}
	}
	h, err := e.st.History(context.Background(), "big")
	if err != nil {
		t.Fatal(err)
	}
	size := 0
	for _, m := range h {
		size += len(m.Content)
	}
	sc.truth("the session's conversation", "≥ 50 MB", megabytes(int64(size)), size >= 50<<20)
	stop(w)
	// Issue 29: a turn's memory follows its work. The worker holds the
	// conversation once as it steps and ends a turn (2.8-3.0 times its
	// size above the worker's own; 11.8 times before, 672-704 MB).
	peak := w.peak()
	sc.add("worker resident before the turns", "—", megabytes(base), base > 0)
	sc.memory("worker peak memory", peak, 300)
	sc.ratio("the worker's peak above its resident memory before the turns, over the conversation", float64(peak-base)/float64(size), 4)
	// The runner follows the turn's events and reads its record, without
	// its results, and messages: one copy of each result, the event's
	// (223-264 and 216-233 MB; 280-364 and 229-245 MB when the record was
	// read with its results; 367-432 and 416-474 MB when each was held
	// three times).
	for i, p := range runPeaks {
		sc.memory(fmt.Sprintf("run's peak memory, turn %d", i+1), p, 320)
	}
	sc.nothingLeft()
}

// agentMismatch: run with agent file B on a queue whose worker runs agent
// file A is refused, naming both files; nothing is run.
func agentMismatch(t *testing.T) {
	sc := begin(t, "agent file mismatch", "timebox worker -f A, run --engine temporal -f B")
	e := newEngine(t)
	aa := newAgent(t, scriptAgent("", "", "{name: one, description: One., exec: [./slow.sh, \"0\"]}"), []string{callTools("one"), `{"text": "A"}`},
		map[string]string{"slow.sh": slowTool})
	b := newAgent(t, scriptAgent("", "", "{name: two, description: Two., exec: [./slow.sh, \"0\"]}"), []string{callTools("two"), `{"text": "B"}`},
		map[string]string{"slow.sh": slowTool})
	env := []string{"PIDFILE=" + b.pidfile}
	w := e.worker(aa, []string{"PIDFILE=" + aa.pidfile}, "1s")
	start := time.Now()
	run := e.run(b, env)
	id := turnID(t, run)
	rec, evs := e.ended(id, 30*time.Second)
	code := run.wait(30 * time.Second)
	sc.within("refused in", time.Since(start), 10*time.Second)
	sc.count("run's exit code", code, 2)
	sc.is("stop reason", string(rec.StopReason), string(budget.AgentMismatch))
	names := strings.Contains(run.stderr.String(), aa.file) && strings.Contains(run.stderr.String(), b.file)
	sc.truth("run's stderr", "names both files", fmt.Sprint(names), names)
	_, ranA := os.Stat(aa.pidfile)
	_, ranB := os.Stat(b.pidfile)
	sc.truth("tools run", "none", fmt.Sprintf("%d model calls, %d tool calls", len(rec.ModelCalls), len(rec.ToolCalls)),
		len(rec.ModelCalls) == 0 && len(rec.ToolCalls) == 0 && os.IsNotExist(ranA) && os.IsNotExist(ranB))
	sc.integrity(evs, run.log.snapshot())
	stop(w)
	sc.nothingLeft()
}

// thousandSteps: a turn of 1,000 steps, each calling a tool: its workflow
// continues as new as its history grows, and it ends as embedded,
// max_steps, with every record.
func thousandSteps(t *testing.T) {
	sc := begin(t, "a 1,000-step turn", "timebox worker, run --engine temporal")
	e := newEngine(t)
	a := newAgent(t, scriptAgent("turn: 30m", "max_steps: 1000, max_tool_calls: 1000", "{name: quick, description: Quick., exec: [\"true\"]}"),
		[]string{callTools("quick")}, nil)
	w := e.worker(a, nil, "3s")
	start := time.Now()
	run := e.run(a, nil)
	id := turnID(t, run)
	rec, evs := e.ended(id, 10*time.Minute)
	took := time.Since(start)
	run.wait(60 * time.Second)
	sc.is("stop reason", string(rec.StopReason), string(budget.MaxSteps))
	sc.count("steps", rec.Steps, 1000)
	sc.count("tool call records", len(rec.ToolCalls), 1000)
	sc.within("turn", took, 4*time.Minute)
	sc.integrity(evs, run.log.snapshot())
	sc.add("per step", "—", ms(took/1000), true)
	runs := workflowRuns(t, e.srv.Addr(), id)
	sc.truth("workflow runs (continued as new)", "> 1", fmt.Sprint(runs), runs > 1)
	stop(w)
	sc.nothingLeft()
}

// workflowRuns counts the runs of a turn's workflow: one, and one more for
// each time it continued as new.
func workflowRuns(t *testing.T, addr, turnID string) int {
	t.Helper()
	c, err := client.Dial(client.Options{HostPort: addr, Logger: sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler))})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	runs := 0
	for run := ""; ; runs++ {
		it := c.GetWorkflowHistory(context.Background(), temporal.WorkflowID(turnID), run, false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
		if !it.HasNext() {
			return runs
		}
		first, err := it.Next()
		if err != nil {
			t.Fatal(err)
		}
		run = first.GetWorkflowExecutionStartedEventAttributes().GetContinuedExecutionRunId()
		if run == "" {
			return runs + 1
		}
	}
}

// retryTool is a tool safe to run twice: its first run hangs (the run
// whose worker stalls), a later one answers after 4s. Each run writes
// "$WORKER pid" to $PIDFILE, naming the worker that ran it.
const retryTool = `#!/usr/bin/env bash
cat >/dev/null
first=yes
[ -s "$PIDFILE" ] && first=no
echo "$WORKER $$" >> "$PIDFILE"
if [ $first = yes ]; then exec sleep 300; fi
sleep 4
echo done
`

// workerStalledMidTool: the worker running a call of a tool with
// retries: 5 is stopped (SIGSTOP) past its heartbeat timeout, a second
// worker running. Temporal gives the attempt up and the call runs again on
// the second worker; the stalled worker is then let go on (SIGCONT) while
// the retry runs. What it says of the attempt Temporal gave up — its call
// stopped "cancelled" by that — is not the turn's: it stores nothing, the
// call's one record is the retry's result. (The stalled worker's open
// polls take retries too, each lost after the heartbeat timeout: 4
// attempts in all, the last on the other worker; hence 5 retries.)
func workerStalledMidTool(t *testing.T) {
	sc := begin(t, "worker SIGSTOP mid-tool, retries: 5", "timebox worker ×2, run --engine temporal")
	e := newEngine(t)
	recv := e.trace()
	a := newAgent(t, scriptAgent("kill_grace: 500ms", "", "{name: idem, description: Safe to run twice., exec: [./idem.sh], timeout: 1m, retries: 5}"),
		[]string{callTools("idem"), `{"text": "All done."}`}, map[string]string{"idem.sh": retryTool})
	env := func(name string) []string { return []string{"PIDFILE=" + a.pidfile, "WORKER=" + name} }
	workers := map[string]*proc{"A": e.worker(a, env("A"), "1s"), "B": e.worker(a, env("B"), "1s")}
	run := e.run(a, nil)
	id := turnID(t, run)
	var stalledName, healthyName string
	var stalledPID int
	for name, pids := range a.waitPIDs(t, 1, run) {
		stalledName, stalledPID = name, pids[0]
	}
	healthyName = map[string]string{"A": "B", "B": "A"}[stalledName]
	stalled := workers[stalledName]
	stalled.cmd.Process.Signal(syscall.SIGSTOP)
	stopped := time.Now()
	retried := wait.Until(30*time.Second, func() bool { return len(a.pids()[healthyName]) > 0 })
	if !retried {
		t.Fatalf("no retry on worker %s 30s after worker %s stopped", healthyName, stalledName)
	}
	sc.within("stop to the retry's start on the other worker", time.Since(stopped), 15*time.Second)
	stalled.cmd.Process.Signal(syscall.SIGCONT)
	resumed := time.Now()
	gone := waitGone([]int{stalledPID}, 10*time.Second)
	sc.truth("the stalled attempt's tool", "stopped once its worker is back", fmt.Sprintf("gone %s after the resume", ms(gone)), gone < 10*time.Second)
	rec, evs := e.ended(id, 60*time.Second)
	code := run.wait(10 * time.Second)
	sc.is("status", string(rec.Status), string(budget.StatusCompleted))
	sc.count("run's exit code", code, 0)
	sc.integrity(evs, run.log.snapshot())
	var runs []string
	written, _ := os.ReadFile(a.pidfile)
	for line := range strings.Lines(string(written)) {
		role, _, _ := strings.Cut(line, " ")
		runs = append(runs, role)
	}
	sc.truth("the tool's runs (attempts), by worker", "the stalled one first, the last on the other",
		fmt.Sprintf("%d: %s", len(runs), strings.Join(runs, ", ")), len(runs) >= 2 && runs[0] == stalledName && runs[len(runs)-1] == healthyName)
	if c := rec.ToolCalls; len(c) == 1 {
		sc.truth("the call", "ok, the retry's result", fmt.Sprintf("%s %q", c[0].Outcome, toolOutput(c[0].Result)),
			c[0].Outcome == event.OutcomeOK && strings.TrimSpace(toolOutput(c[0].Result)) == "done")
	} else {
		sc.count("tool call records", len(c), 1)
	}
	attempts := callAttempts(t, e.srv.Addr(), id)
	sc.truth("Temporal's attempts of the call", "≥ 2", fmt.Sprint(attempts), attempts >= 2)
	// What the stalled worker said of the attempt Temporal gave up once it
	// was let go on: its call stopped, a tool_finished "cancelled"; the
	// tool reports no progress. (The retry's tool_started may be stored
	// just after the resume: it is not counted.)
	late := 0
	for _, ev := range evs {
		if ev.At.Before(resumed) {
			continue
		}
		switch d := ev.Data.(type) {
		case *event.ToolProgress:
			late++
		case *event.ToolFinished:
			if d.Outcome != event.OutcomeOK {
				late++
				t.Logf("stored after the resume: %s %s/%s", ev.Type, d.Outcome, d.Phase)
			}
		}
	}
	sc.count("records of the given-up attempt stored after its worker resumed", late, 0)
	sc.allDead(a.pids())
	for _, w := range workers {
		stop(w)
	}
	sc.traceWhole(recv, "", id)
	sc.nothingLeft()
}

// callAttempts returns the attempt of the last tool call a turn's workflow
// started: 1, and one more for each time Temporal ran it again.
func callAttempts(t *testing.T, addr, turnID string) int {
	t.Helper()
	c, err := client.Dial(client.Options{HostPort: addr, Logger: sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler))})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	it := c.GetWorkflowHistory(context.Background(), temporal.WorkflowID(turnID), "", false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	scheduled := map[int64]string{}
	attempt := 0
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			t.Fatal(err)
		}
		if a := ev.GetActivityTaskScheduledEventAttributes(); a != nil {
			scheduled[ev.GetEventId()] = a.GetActivityType().GetName()
		}
		if a := ev.GetActivityTaskStartedEventAttributes(); a != nil && scheduled[a.GetScheduledEventId()] == "timebox.Call" {
			attempt = int(a.GetAttempt())
		}
	}
	return attempt
}

// ceilingWhileWorkerDead: the worker running a call is killed (SIGKILL)
// and the turn's ceiling (3s) falls before Temporal takes the worker for
// gone (heartbeat 4s); a worker started after the kill runs the workflow
// on. The turn ends as on the embedded engine: its message says the tool
// was running (machine.RunningDesc), flagged
// timed_out_during_tool_execution — not "Last step: model m".
func ceilingWhileWorkerDead(t *testing.T) {
	sc := begin(t, "worker kill -9 mid-tool, then the turn's ceiling", "timebox worker ×2 in turn, run --engine temporal")
	e := newEngine(t)
	recv := e.trace()
	const ceiling = 3 * time.Second
	a := newAgent(t, scriptAgent("kill_grace: 500ms, turn: "+ceiling.String(), "", "{name: hang, description: Hangs., exec: [./hang.sh], timeout: 30s}"),
		[]string{callTools("hang"), `{"text": "never"}`}, map[string]string{"hang.sh": hangTool})
	wa, run, id, pids := e.hanging(a, "4s")
	waitSpans(t, recv, "chat ", 1) // the model call's span, the dead worker's
	wa.cmd.Process.Kill()
	<-wa.done
	wb := e.worker(a, []string{"PIDFILE=" + a.pidfile}, "4s")
	rec, evs := e.ended(id, 60*time.Second)
	code := run.wait(10 * time.Second)
	sc.within("past the ceiling", rec.EndedAt.Sub(rec.StartedAt.Add(ceiling)), 10*time.Second)
	sc.is("stop reason", string(rec.StopReason), string(budget.TurnTimeout))
	sc.count("run's exit code", code, 3)
	// "running for" is until the ceiling fell, as on the embedded engine,
	// not until the workflow heard of the lost call (the heartbeat timeout
	// and a workflow task later): it was 7s in a turn stopped after 3s.
	_, after, says := strings.Cut(rec.Message, "Last step: tool hang, running for ")
	ran, err := time.ParseDuration(strings.TrimSuffix(strings.SplitN(after, " ", 2)[0], "."))
	says = says && err == nil && ran <= ceiling
	sc.truth("its message", "says the tool was running, until the ceiling", fmt.Sprintf("%v: %q", says, rec.Message), says)
	sc.truth("its flags", "timed out by the turn budget, during a tool", fmt.Sprintf("%+v", rec.Flags),
		rec.Flags.TimedOutDuringToolExecution && rec.Flags.TimedOutByTurnBudget)
	if c := rec.ToolCalls; len(c) == 1 {
		sc.is("the lost call", string(c[0].Outcome)+"/"+string(c[0].Phase), "interrupted/worker_lost")
	} else {
		sc.count("tool call records", len(c), 1)
	}
	sc.integrity(evs, run.log.snapshot())
	sc.allDead(pids)
	stop(wb)
	sc.traceWhole(recv, "", id)
	sc.callSpans(recv, evs) // the lost call's, which the worker that records it made
	sc.nothingLeft()
}
